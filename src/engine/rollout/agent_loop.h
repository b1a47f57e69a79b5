// AgentLoop: multi-turn rollouts of a job whose env.name is set
// (include/fusionrl/environment.h, docs/agents.md).
//
// For each sample it opens an episode of the job's environment, renders
// the opening conversation (and the offered tools) in the job's chat
// format, and runs every episode through an EpisodeDecoder. At each turn's
// end it decodes the turn, parses its tool calls in the model's format
// (tasks/tool_calls.h), and calls the environment on a pool of
// env.max_concurrency threads, each call with a deadline; the answer's
// messages are rendered in the chat template's tool role and tokenized
// once: the observation text is the template's rendering of the
// conversation with the new messages (and the generation prompt) minus
// its rendering without them; format none writes each message as
// "(content)".
//
// An episode a limit cuts (env.max_turns, env.max_episode_tokens or the
// context) before the environment said done gets the environment's last
// word (Episode::Truncate: its reward, or by default the task's reward of
// the last turn's content); `finished` stays false.
//
// A failed environment (an error, a deadline) ends its episode with
// env_failed set: with env.on_failure zero the episode is trained with
// reward 0, with drop its whole group is excluded. The job goes on; the
// counts are in the step's metrics. An unreachable one (UNAVAILABLE: a
// refused connection, a server down) is different: Run waits and runs
// those episodes again, with backoff (0.5 s doubling to 8 s), for up to
// env.unavailable_seconds from the end of the attempt that first met it;
// past it, Run fails (Unavailable, naming the server and the error), and
// so the job: a job never trains on the empty steps of an environment that
// is away.
//
// Thread safety: Run() is not reentrant; the environment calls run on the
// pool's threads.
#ifndef FUSIONRL_ENGINE_ROLLOUT_AGENT_LOOP_H_
#define FUSIONRL_ENGINE_ROLLOUT_AGENT_LOOP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/rollout/episode_decoder.h"
#include "engine/rollout/job_context.h"
#include "engine/rollout/rollout.h"
#include "engine/rollout/sample.h"

namespace fusionrl {

struct EpisodeBatch {
  std::vector<Sample> samples;  // one per problem, in order
  EpisodeDecodeStats decode;
};

class AgentLoop {
 public:
  // Borrowed; ctx.environment must be set.
  explicit AgentLoop(const JobContext& ctx) : ctx_(ctx) {}

  // One episode per problem; keys[i] is episode i's sampling key (its
  // seed and index also seed the environment's episode). `slots`: episodes
  // decoded at once (0 = all). Fills each Sample's prompt, response, loss
  // mask, behaviour log-probs, finished (= the environment ended it),
  // reward, correct and episode stats (the environment's metrics
  // included); group ids are the caller's. `expert_lockstep`: `model` is
  // an expert shard and this rank runs its episodes in lockstep with that
  // group (EpisodeDecoder::set_expert_lockstep).
  absl::StatusOr<EpisodeBatch> Run(
      PolicyModel& model, const std::vector<Problem>& problems,
      const std::vector<SequenceKey>& keys, const SamplingParams& params,
      int64_t slots = 0, int row_blocks = 0, bool fused = true,
      GradientSync* expert_lockstep = nullptr) const;

 private:
  // One try of every episode; `unreachable` (one entry per problem) gets
  // the failure of each episode whose environment was unreachable
  // (UNAVAILABLE), "" for the others.
  absl::StatusOr<EpisodeBatch> RunOnce(
      PolicyModel& model, const std::vector<Problem>& problems,
      const std::vector<SequenceKey>& keys, const SamplingParams& params,
      int64_t slots, int row_blocks, bool fused, GradientSync* expert_lockstep,
      std::vector<std::string>* unreachable) const;

  const JobContext& ctx_;
};

// A supervised sample of a demonstrated episode of `problem`
// (Environment::Demonstrate, run against the environment in this thread):
// the loss mask covers the demonstrated turns, the environment's answers
// are masked out. NotFound when the environment has no demonstration for
// it.
absl::StatusOr<Sample> DemonstrationSample(const JobContext& ctx,
                                           const Problem& problem,
                                           uint64_t seed);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_ROLLOUT_AGENT_LOOP_H_
