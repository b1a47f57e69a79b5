// Profiling the training forward's sub-blocks for the activation planner
// (SubBlockTimer, engine/model/model.h). Internal to the engine.
#ifndef FUSIONRL_ENGINE_MODEL_SUB_BLOCK_TIMING_H_
#define FUSIONRL_ENGINE_MODEL_SUB_BLOCK_TIMING_H_

#include <chrono>

#include "engine/model/model.h"

namespace fusionrl {

// fn()'s result; with a timer, fn's wall time (the device synced before and
// after) is added to timer->seconds[layer][slot].
template <class Fn>
auto TimeSubBlock(SubBlockTimer* timer, int layer, int slot, Fn&& fn) {
  if (timer == nullptr) return fn();
  if (timer->sync) timer->sync();
  const auto start = std::chrono::steady_clock::now();
  auto result = fn();
  if (timer->sync) timer->sync();
  timer->seconds[layer][slot] +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return result;
}

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_SUB_BLOCK_TIMING_H_
