// EpisodeDecoder: the token-level loop of multi-turn rollouts.
//
// An episode is a prompt followed by model turns and environment answers,
// one token sequence. A model turn is sampled until a stop id or the
// per-turn budget; then the driver gets the turn (TurnDriver::TurnEnded)
// and starts the environment's work, and the episode leaves the decode
// batch: its KV cache is parked, its slot taken by another episode
// (continuous batching). When the answer is admitted its tokens are fed
// into the episode's cache after the turn's last token, one per decode
// step beside the other rows' sampled tokens, and sampling resumes from
// the last of them: the history is never re-encoded and never re-prefilled
// (token-in/token-out, KV continuation).
//
// Deterministic schedule: a turn that ends at decode step s is admitted at
// step s + admit_after_steps, whenever the environment answered (the loop
// waits then, by the driver's deadline, never earlier); episodes are
// admitted and slots filled in index order. Which rows share a decode step
// thus never depends on the environment's timing, and a sequence draws
// token t of the episode with RowUniform(seed, index, t) (t counting the
// model's tokens only), so a run is reproducible with environments that
// are.
//
// Backends: the fused CpuDecoder (a float32 dense policy on a CPU; one
// batched step over all live slots) or, elsewhere (CUDA, bfloat16, MoE),
// the model's ForwardCached with one cache per episode, stepped episode
// by episode (correct on every device, not batched).
//
// Not thread-safe; borrows the model.
#ifndef FUSIONRL_ENGINE_ROLLOUT_EPISODE_DECODER_H_
#define FUSIONRL_ENGINE_ROLLOUT_EPISODE_DECODER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/rollout/rollout.h"

namespace fusionrl {

// What an episode's sequence holds after its prompt.
struct EpisodeTokens {
  std::vector<int> tokens;     // model and environment tokens, in order
  std::vector<float> logp;     // behaviour log-prob (0 for environment ones)
  std::vector<uint8_t> model;  // 1 = sampled by the model, 0 = environment
  // MoE policies (router replay): the experts each fed token was routed to,
  // as Sample::routes: over the prompt then this sequence, every token the
  // model was fed (the last one never is). Empty for a dense policy.
  std::vector<int8_t> routes;
  int32_t turns = 0;  // model turns
  bool done = false;  // the driver ended it (else: a token limit)
};

class TurnDriver {
 public:
  virtual ~TurnDriver() = default;
  // Episode `i`'s model turn ended: `turn` holds its tokens (the stop id
  // last when `stopped`; else the per-turn budget ended it). Start the
  // environment's work and return without waiting for it. Not called for
  // a turn that hit the episode's token limit (EpisodeCut is).
  virtual void TurnEnded(int64_t i, const std::vector<int>& turn,
                         bool stopped) = 0;
  // The answer to episode `i`'s last turn, waited for (within the driver's
  // deadlines): `done`, or the tokens that follow the turn. A failed
  // environment is the driver's to record; it answers done.
  struct Answer {
    bool done = false;
    std::vector<int> tokens;
  };
  virtual Answer Await(int64_t i) = 0;
  // Episode `i` ends by a limit before the driver said done: `turn` holds
  // the tokens of the turn a token limit cut inside (never passed to
  // TurnEnded), empty when the cut came after an answered turn
  // (`max_turns`: env.max_turns was reached, else the answer did not fit
  // the token budget). Called once, after the episode's last Await. Start
  // the environment's last word on it and return without waiting (the
  // driver waits after Run). Default: nothing.
  virtual void EpisodeCut(int64_t i, const std::vector<int>& turn,
                          bool max_turns) {
    (void)i;
    (void)turn;
    (void)max_turns;
  }
};

struct EpisodeLimits {
  int64_t max_turns = 4;
  // Tokens after the prompt, model and environment ones (the episode stops,
  // not done, when a turn or an answer would pass it).
  int64_t max_episode_tokens = 0;
  int64_t admit_after_steps = 1;
  // Episodes decoded at once (0: all).
  int64_t slots = 0;
};

struct EpisodeDecodeStats {
  int64_t decode_steps = 0;
  int64_t rows_computed = 0;
  int64_t env_tokens_fed = 0;
  double wait_seconds = 0;  // blocked in TurnDriver::Await
  double total_seconds = 0;
  // Expert lockstep: forwards joined with no tokens after this rank's own.
  int64_t expert_joins = 0;
};

class ExpertLockstep;

class EpisodeDecoder {
 public:
  EpisodeDecoder(PolicyModel& model, int pad_id, std::vector<int> stop_ids);

  // Runs one episode per prompt (keys[i]: its sampling key; first_token
  // and max_tokens unused) to its end. params.max_new_tokens is the
  // per-turn budget. InvalidArgument if a prompt plus max_episode_tokens
  // does not fit the model's max_seq_len.
  absl::StatusOr<std::vector<EpisodeTokens>> Run(
      const std::vector<std::vector<int>>& prompts,
      const std::vector<SequenceKey>& keys, const SamplingParams& params,
      const EpisodeLimits& limits, TurnDriver& driver);

  // The fused backend where the model allows it (as RolloutEngine).
  void set_fused(bool fused) { fused_ = fused; }
  // Expert parallelism: runs from an expert shard, every rank of `group`
  // calling Run() together with its own episodes, in lockstep (as
  // RolloutEngine::set_expert_lockstep; the composite backend). Null: off.
  void set_expert_lockstep(GradientSync* group) { lockstep_group_ = group; }
  void set_row_blocks(int blocks) { row_blocks_ = blocks; }
  bool fused() const;
  const EpisodeDecodeStats& last_stats() const { return stats_; }

 private:
  PolicyModel& model_;
  int pad_id_;
  std::vector<int> stop_ids_;
  absl::StatusOr<std::vector<EpisodeTokens>> RunOnce(
      const std::vector<std::vector<int>>& prompts,
      const std::vector<SequenceKey>& keys, const SamplingParams& params,
      const EpisodeLimits& limits, TurnDriver& driver);

  bool fused_ = true;
  int row_blocks_ = 0;
  GradientSync* lockstep_group_ = nullptr;
  ExpertLockstep* lockstep_ = nullptr;  // during a Run in lockstep
  EpisodeDecodeStats stats_;
};

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_ROLLOUT_EPISODE_DECODER_H_
