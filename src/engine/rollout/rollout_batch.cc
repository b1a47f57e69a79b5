#include "engine/rollout/rollout_batch.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

namespace fusionrl::rollout_internal {

std::pair<at::Tensor, at::Tensor> LeftPadded(
    const std::vector<const std::vector<int>*>& prompts, int64_t len,
    int64_t extra, int pad_id, c10::Device device) {
  const int64_t n = static_cast<int64_t>(prompts.size());
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  auto tokens = at::full({n, len}, pad_id, long_opts);
  auto valid = at::zeros({n, len + extra}, long_opts.dtype(at::kBool));
  auto tok_acc = tokens.accessor<int64_t, 2>();
  auto valid_acc = valid.accessor<bool, 2>();
  for (int64_t b = 0; b < n; ++b) {
    const auto& p = *prompts[b];
    const int64_t offset = len - static_cast<int64_t>(p.size());
    for (size_t j = 0; j < p.size(); ++j) {
      tok_acc[b][offset + j] = p[j];
      valid_acc[b][offset + j] = true;
    }
  }
  return {tokens.to(device), valid.to(device)};
}

DistinctPrompts FindDistinctPrompts(
    const std::vector<std::vector<int>>& prompts) {
  DistinctPrompts d;
  std::map<std::vector<int>, int64_t> index;
  d.prompt_of.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto [it, added] =
        index.emplace(prompts[i], static_cast<int64_t>(d.unique.size()));
    if (added) d.unique.push_back(&prompts[i]);
    d.prompt_of[i] = it->second;
  }
  return d;
}

int64_t TokenCap(const SequenceKey& key, const SamplingParams& params) {
  return key.max_tokens > 0
             ? std::min<int64_t>(key.max_tokens, params.max_new_tokens)
             : params.max_new_tokens;
}

}  // namespace fusionrl::rollout_internal
