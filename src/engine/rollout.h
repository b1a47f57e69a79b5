// RolloutEngine: batched autoregressive sampling with a KV cache.
//
// Prompts are left-padded into one batch, prefilled in one forward pass, then
// decoded one token per step for every live sequence; a sequence stops at
// eos or after max_new_tokens, and the batch stops when all have stopped.
// Sampling is temperature / top-k / top-p; temperature 0 is greedy. The
// log-prob recorded for each token is log softmax(logits / temperature) before
// top-k/top-p filtering (temperature 1 when greedy): the quantity the trainer
// recomputes, so on-policy ratios start at exactly 1 without filtering.
// Randomness comes only from `seed` (a CPU generator; uniforms are moved to
// the device), so a (weights, prompts, params, seed) tuple always yields the
// same samples on the same device.
//
// Threads: not thread-safe; borrows the model, which must outlive the engine
// and must not be modified during Generate().
#ifndef FUSIONRL_ENGINE_ROLLOUT_H_
#define FUSIONRL_ENGINE_ROLLOUT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"

namespace fusionrl {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  int top_k = 0;             // 0 = off
  double top_p = 1.0;        // 1 = off
  int max_new_tokens = 16;
};

struct Completion {
  std::vector<int> tokens;  // generated ids, the stop id included if produced
  std::vector<float> logp;  // one per token
  bool finished = false;    // produced a stop id
};

class RolloutEngine {
 public:
  // A sequence stops at the first of `stop_ids` it samples (the model's
  // eos ids: generation_config.json may list several, and a chat format's
  // end-of-turn token).
  RolloutEngine(PolicyModel& model, int pad_id, std::vector<int> stop_ids);
  RolloutEngine(PolicyModel& model, int pad_id, int eos_id);

  // One completion per prompt (each prompt: token ids, bos included, non-
  // empty). InvalidArgument if a prompt plus max_new_tokens does not fit in
  // the model's max_seq_len.
  absl::StatusOr<std::vector<Completion>> Generate(
      const std::vector<std::vector<int>>& prompts,
      const SamplingParams& params, uint64_t seed);

  // Tokens produced by all Generate() calls so far (eos included).
  int64_t tokens_generated() const { return tokens_generated_; }

 private:
  bool IsStop(int id) const;

  PolicyModel& model_;
  int pad_id_;
  std::vector<int> stop_ids_;
  int64_t tokens_generated_ = 0;
};

// Sets logits outside the top-k (k > 0) and outside the smallest set whose
// probability reaches top_p (top_p < 1) to -inf. The most likely token always
// survives. logits [B, V].
at::Tensor FilterLogits(const at::Tensor& logits, int top_k, double top_p);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_ROLLOUT_H_
