// CardCounters: what a worker's heartbeats report about one of its cards,
// written by the card threads of the job that runs on it.
#ifndef FUSIONRL_WORKER_CARD_COUNTERS_H_
#define FUSIONRL_WORKER_CARD_COUNTERS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/memory_manager.h"

namespace fusionrl {

enum class CardRole { kIdle, kColocated, kFused, kRollout, kTrain };

struct CardCounters {
  std::atomic<bool> active{false};              // in a job
  std::atomic<CardRole> role{CardRole::kIdle};  // while active
  std::atomic<int64_t> busy_us{0};  // microseconds in rollout + train

  // The card's memory books while it runs a job (heartbeats report them).
  void SetMemory(std::shared_ptr<CardMemoryManager> m) {
    absl::MutexLock lock(&memory_mu);
    memory = std::move(m);
  }
  std::shared_ptr<CardMemoryManager> Memory() {
    absl::MutexLock lock(&memory_mu);
    return memory;
  }

 private:
  absl::Mutex memory_mu;
  std::shared_ptr<CardMemoryManager> memory ABSL_GUARDED_BY(memory_mu);
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_CARD_COUNTERS_H_
