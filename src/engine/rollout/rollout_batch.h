// Prompt batches as the rollout decode paths lay them out (rollout.cc's
// fused path, composite_decode.cc's composite and static paths): left
// padding, the distinct prompts of a batch, and each sequence's token cap.
#ifndef FUSIONRL_ENGINE_ROLLOUT_BATCH_H_
#define FUSIONRL_ENGINE_ROLLOUT_BATCH_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/rollout/rollout.h"

namespace fusionrl::rollout_internal {

// Left-padded batch of `prompts` [n, len] and its validity [n, len + extra]
// (the prompt part set), on `device`.
std::pair<at::Tensor, at::Tensor> LeftPadded(
    const std::vector<const std::vector<int>*>& prompts, int64_t len,
    int64_t extra, int pad_id, c10::Device device);

// Prefix sharing: the distinct prompts of a batch, in first-seen order,
// and for each sequence the index of its prompt among them. The pointers
// borrow the prompts given to FindDistinctPrompts.
struct DistinctPrompts {
  std::vector<const std::vector<int>*> unique;
  std::vector<int64_t> prompt_of;
};
DistinctPrompts FindDistinctPrompts(
    const std::vector<std::vector<int>>& prompts);

// How many tokens a call may sample for the sequence of `key`.
int64_t TokenCap(const SequenceKey& key, const SamplingParams& params);

}  // namespace fusionrl::rollout_internal

#endif  // FUSIONRL_ENGINE_ROLLOUT_BATCH_H_
