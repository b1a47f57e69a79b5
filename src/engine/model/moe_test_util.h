// Helpers shared by the MoE tests.
#ifndef FUSIONRL_ENGINE_MOE_TEST_UTIL_H_
#define FUSIONRL_ENGINE_MOE_TEST_UTIL_H_

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "engine/model/moe_module.h"

namespace fusionrl::moe_testing {

// A module with fixed, seeded weights, in float64 so that comparisons with
// the reference loops see the dispatch, not float32 rounding.
inline MoeFeedForward MakeMoe(int experts, int top_k, double capacity_factor,
                              bool shared, uint64_t seed = 3, int groups = 1) {
  torch::manual_seed(seed);
  MoeFeedForward m(8, 16, experts, top_k, groups, capacity_factor, shared);
  m->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.normal_(0, 0.5);
  return m;
}

inline MoeRouting Routed(const at::Tensor& token_valid, bool apply_capacity) {
  MoeRouting r;
  r.token_valid = token_valid;
  r.apply_capacity = apply_capacity;
  return r;
}

inline at::Tensor RandomTokens(std::vector<int64_t> shape) {
  return torch::randn(shape, torch::kDouble);
}

}  // namespace fusionrl::moe_testing

#endif  // FUSIONRL_ENGINE_MOE_TEST_UTIL_H_
