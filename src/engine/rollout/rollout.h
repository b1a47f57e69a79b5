// RolloutEngine: batched autoregressive sampling with a KV cache.
//
// A sequence stops at a stop id or after max_new_tokens. Sampling is
// temperature / top-k / top-p; temperature 0 is greedy. The log-prob
// recorded for each token is log softmax(logits / temperature) before
// top-k/top-p filtering (temperature 1 when greedy): the quantity the trainer
// recomputes, so on-policy ratios start at exactly 1 without filtering.
//
// Randomness: token t of sequence i is drawn by the inverse CDF with the
// uniform RowUniform(seed, i, t), a counter-based hash. A sequence's samples
// depend on its prompt, the weights and (seed, i) only, not on which other
// sequences share its batch or in which slot it runs: a (weights, prompts,
// params, seed) tuple always yields the same samples on the same device,
// whichever decode path and batch size produced them (up to float rounding
// of the logits, docs/BENCHMARKS.md).
//
// Three decode paths:
//  * fused (the default where CpuDecoder::Supports the model: a float32
//    dense policy on a CPU): each distinct prompt is prefilled once and its
//    KV entries copied to every sample of it (prefix sharing: a GRPO group
//    prefills once, not group_size times); decoding runs in preallocated
//    buffers with fused kernels (engine/rollout/cpu_decoder.h); a finished
//    sequence's slot is refilled from the waiting sequences (continuous
//    batching, with max_batch slots) or, with none waiting, compacted away,
//    so a step computes only live sequences.
//  * composite (MoE, bfloat16, other devices such as CUDA, or asked for):
//    the module graph's ForwardCached, one token per row per step, with
//    the same prefix sharing (distinct prompts prefilled once, their cache
//    rows copied to every sample) and row compaction (finished rows are
//    dropped by gathering the live rows' cache, masks and positions into a
//    smaller batch: at every finish on a CPU, once a quarter of the rows
//    have finished elsewhere).
//  * static: the reference loop. Prompts are left-padded into one batch,
//    prefilled in one forward pass, then every row is decoded until all
//    have stopped. The other two are tested against it.
// Threads: not thread-safe; borrows the model, which must outlive the engine
// and must not be modified during Generate().
#ifndef FUSIONRL_ENGINE_ROLLOUT_ROLLOUT_H_
#define FUSIONRL_ENGINE_ROLLOUT_ROLLOUT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"

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
  // MoE policies (router replay): the experts each token the call fed was
  // routed to, [position][layer][choice] (n_layers * top_k per token) over
  // the prompt's tokens then the generated ones but the last (which is
  // never fed). Empty for a dense policy.
  std::vector<int8_t> routes;
};

// Where the time of the last Generate() went (RolloutEngine::last_stats).
struct DecodeStats {
  bool fused = false;          // the fused path ran
  int64_t sequences = 0;       // completions produced
  int64_t prefill_rows = 0;    // prompts prefilled (distinct ones when fused)
  int64_t decode_steps = 0;    // forward calls after the prefill
  int64_t rows_computed = 0;   // sum over decode steps of the rows computed
  int64_t tokens = 0;          // tokens sampled (the stop ids included)
  double prefill_seconds = 0;  // prefill forward (+ the first sampling)
  double model_seconds = 0;    // decode forwards
  double sample_seconds = 0;   // sampling of decode steps
  double host_seconds = 0;     // the rest: bookkeeping, copies, setup
  double total_seconds = 0;
  // Expert lockstep: forwards this rank joined with no tokens after its
  // own had ended (RolloutEngine::set_expert_lockstep).
  int64_t expert_joins = 0;
};

// The uniform in (0, 1] that draws token `t` of sequence `i`.
float RowUniform(uint64_t seed, int64_t i, int64_t t);

// Which uniforms a sequence draws: token t with RowUniform(seed, index, t).
// Generate(prompts, params, seed) gives sequence i the key {seed, i}; a
// batch merged from several such calls' sequences, each with its own key,
// samples what the calls would have (continuous batching across calls).
//
// Partial rollout (interrupted and continued responses): a call may stop a
// sequence after `max_tokens` tokens, unfinished, and a later call continue
// it from a prompt that ends with those tokens and `first_token` set to
// their count, so the continuation draws the uniforms the uninterrupted
// sequence would have drawn (from whichever weights the later call has).
struct SequenceKey {
  uint64_t seed = 0;
  int64_t index = 0;
  // The response already holds this many tokens (they end the prompt):
  // token t of this call draws RowUniform(seed, index, first_token + t).
  int64_t first_token = 0;
  // At most this many tokens in this call (0: params.max_new_tokens; never
  // more). A sequence stopped here without a stop id is not finished.
  int64_t max_tokens = 0;
};

class CpuDecoder;
class ExpertLockstep;

class RolloutEngine {
 public:
  enum class DecodePath {
    kFused,      // CpuDecoder where it supports the model, else composite
    kComposite,  // the module graph, prefix sharing and row compaction
    kStatic,     // the reference loop: every row prefilled and computed
  };

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

  // The same with one key per prompt, and `on_finished(i, completion)`
  // called once for each sequence when its completion is final: on the
  // fused path as soon as it stops (so a caller can hand out the sequences
  // that finished while others still decode), on the others after the
  // last decode step. Called on this thread; it must not call the engine.
  using FinishedFn = std::function<void(int64_t, const Completion&)>;
  absl::StatusOr<std::vector<Completion>> Generate(
      const std::vector<std::vector<int>>& prompts,
      const SamplingParams& params, const std::vector<SequenceKey>& keys,
      const FinishedFn& on_finished = nullptr);

  // Tokens produced by all Generate() calls so far (eos included).
  int64_t tokens_generated() const { return tokens_generated_; }

  // The job's choices: rollout.decode and rollout.decode_slots.
  void Configure(const RolloutConfig& config);
  void set_decode_path(DecodePath path) { path_ = path; }
  // Fused path: sequences decoded at once (0 = all of a Generate() call's).
  // With fewer slots than sequences, each finished sequence's slot takes the
  // next waiting one (continuous batching). The KV cache is slots x
  // (longest prompt + max_new_tokens) entries, plus one prefill entry per
  // distinct prompt token.
  void set_max_batch(int64_t slots) { max_batch_ = slots; }
  // Composite path: gather the live rows once this fraction of the batch's
  // rows have finished (0: at every finish). Negative (the default): 0 on
  // a CPU, 0.25 on other devices (docs/engine.md).
  void set_compaction_fraction(double fraction) {
    compaction_fraction_ = fraction;
  }
  int64_t max_batch() const { return max_batch_; }
  // Fused path: the decoder's row blocks (CpuDecoder::set_row_blocks); the
  // card's thread count, so that the samples do not depend on how many of
  // the card's threads the rollout holds at a step (0: the intra-op thread
  // count when a call starts).
  void set_row_blocks(int blocks) { row_blocks_ = blocks; }
  // Fused path: called before the prefill and every decode step (the
  // card's thread budget sizes the rollout's intra-op threads there, and
  // the card's turns gate them).
  void set_step_hook(std::function<void()> hook) {
    step_hook_ = std::move(hook);
  }
  // Expert parallelism: sampling from an expert shard (docs/moe.md
  // "Rollout in the experts' layout"). `group` is the shard's expert group
  // (the model's own, or one of the same ranks for the rollout alone).
  // Every rank of the group then calls Generate() together, each with its
  // own prompts (none included), and the calls run in lockstep: before each
  // forward a rank tells the group that it has one, and a rank whose call
  // has ended (done, failed, or with nothing to do) joins the others'
  // forwards with no tokens until no rank has one left. Only the composite
  // and static paths (the fused decoder takes no MoE model). A failed
  // exchange or count fails the call with the group's error. Null (the
  // default): off.
  void set_expert_lockstep(GradientSync* group) { lockstep_group_ = group; }
  GradientSync* expert_lockstep() const { return lockstep_group_; }
  // Whether Generate() would take the fused path for this engine's model.
  bool fused() const;
  // Whether Generate() prefills each distinct prompt once (every path but
  // static): its prefill cache is held next to the batch's.
  bool shares_prefixes() const { return path_ != DecodePath::kStatic; }
  const DecodeStats& last_stats() const { return stats_; }
  // The policy it samples from, and its decode settings (the multi-turn
  // EpisodeDecoder follows them).
  PolicyModel& model() const { return model_; }
  int row_blocks() const { return row_blocks_; }
  bool fused_path() const { return path_ == DecodePath::kFused; }

 private:
  bool IsStop(int id) const;
  absl::StatusOr<std::vector<Completion>> GenerateOnce(
      const std::vector<std::vector<int>>& prompts,
      const SamplingParams& params, const std::vector<SequenceKey>& keys,
      const FinishedFn& on_finished);
  absl::StatusOr<std::vector<Completion>> GenerateComposite(
      const std::vector<std::vector<int>>& prompts,
      const SamplingParams& params, const std::vector<SequenceKey>& keys);
  absl::StatusOr<std::vector<Completion>> GenerateFused(
      const std::vector<std::vector<int>>& prompts,
      const SamplingParams& params, const std::vector<SequenceKey>& keys,
      const FinishedFn& on_finished);

  // The fused path's state and steps (rollout.cc): prefill each distinct
  // prompt once, then decode in CpuDecoder slots.
  struct FusedDecode;
  // Returns the first tokens and their log-probs.
  std::pair<at::Tensor, at::Tensor> PrefillFused(FusedDecode& d);
  // Records a token of sequence `seq`; true when the sequence is done.
  bool RecordToken(FusedDecode& d, int64_t seq, int64_t token,
                   float logp) const;
  void DecodeFused(FusedDecode& d);
  std::pair<at::Tensor, at::Tensor> SampleSlots(FusedDecode& d,
                                                const at::Tensor& logits) const;
  void RetireFinished(FusedDecode& d, CpuDecoder& decoder,
                      const at::Tensor& tokens, const at::Tensor& logp) const;

  // The composite and static paths' state and steps (composite_decode.cc).
  struct CompositeDecode;
  absl::Status PrefillComposite(CompositeDecode& d);
  absl::Status PrefillSharedPrompts(CompositeDecode& d);
  void StartCompositeRows(CompositeDecode& d) const;
  int64_t SampleCompositeStep(CompositeDecode& d, int64_t step) const;
  int64_t CompactAt(const CompositeDecode& d) const;
  void CompactRows(CompositeDecode& d, int64_t live) const;
  absl::Status DecodeCompositeStep(CompositeDecode& d, int64_t step);
  std::vector<Completion> CompositeCompletions(const CompositeDecode& d) const;

  PolicyModel& model_;
  int pad_id_;
  std::vector<int> stop_ids_;
  int64_t tokens_generated_ = 0;
  DecodePath path_ = DecodePath::kFused;
  int64_t max_batch_ = 0;
  int row_blocks_ = 0;
  std::function<void()> step_hook_;
  GradientSync* lockstep_group_ = nullptr;
  ExpertLockstep* lockstep_ = nullptr;  // during a call in lockstep
  double compaction_fraction_ = -1;
  DecodeStats stats_;
};

// Tokens [n] (int64) and their log-probs [n] (float) drawn from logits
// [n, V] with one uniform per row (u: CPU float [n], RowUniform), the way
// every decode path samples (greedy at temperature 0).
std::pair<at::Tensor, at::Tensor> SampleTokens(const at::Tensor& logits,
                                               const at::Tensor& u,
                                               const SamplingParams& params);

// Sets logits outside the top-k (k > 0) and outside the smallest set whose
// probability reaches top_p (top_p < 1) to -inf. The most likely token always
// survives. logits [B, V].
at::Tensor FilterLogits(const at::Tensor& logits, int top_k, double top_p);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_ROLLOUT_ROLLOUT_H_
