#include "engine/jobs/evaluate.h"

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/rollout/agent_loop.h"
#include "engine/rollout/rollout.h"
#include "spdlog/spdlog.h"

namespace fusionrl {

absl::StatusOr<EvalResult> EvaluateGreedy(PolicyModel& model,
                                          const JobContext& ctx,
                                          int max_new_tokens, bool joins_only) {
  const auto start = std::chrono::steady_clock::now();
  const auto& problems = ctx.task->eval_set();
  GradientSync* lockstep =
      model.expert_shard().size > 1 ? model.expert_group() : nullptr;
  if (joins_only && lockstep == nullptr) {
    return absl::FailedPreconditionError(
        "EvaluateGreedy: only a rank of an expert group joins another's "
        "evaluation");
  }
  RolloutEngine engine(model, ctx.tokenizer->pad_id(), ctx.stop_ids);
  engine.set_expert_lockstep(lockstep);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = max_new_tokens;
  constexpr size_t kBatch = 256;
  EvalResult result;
  double reward_sum = 0;
  int64_t correct = 0;
  for (size_t i = 0; i < problems.size(); i += kBatch) {
    // A joining rank runs every batch's call with nothing of its own.
    const size_t end = joins_only ? i : std::min(problems.size(), i + kBatch);
    if (ctx.environment != nullptr) {
      // Multi-turn: greedy episodes against the job's environment.
      const std::vector<Problem> slice(problems.begin() + i,
                                       problems.begin() + end);
      std::vector<SequenceKey> keys;
      for (size_t j = i; j < end; ++j) {
        keys.push_back(SequenceKey{0, static_cast<int64_t>(j), 0, 0});
      }
      FUSIONRL_ASSIGN_OR_RETURN(
          EpisodeBatch episodes,
          AgentLoop(ctx).Run(model, slice, keys, greedy, /*slots=*/0,
                             /*row_blocks=*/0, /*fused=*/true, lockstep));
      for (const Sample& s : episodes.samples) {
        reward_sum += s.reward;
        correct += s.correct ? 1 : 0;
      }
      continue;
    }
    std::vector<std::vector<int>> prompts;
    for (size_t j = i; j < end; ++j) {
      FUSIONRL_ASSIGN_OR_RETURN(auto ids,
                                EncodeProblemPrompt(ctx, problems[j]));
      prompts.push_back(std::move(ids));
    }
    FUSIONRL_ASSIGN_OR_RETURN(auto completions,
                              engine.Generate(prompts, greedy, /*seed=*/0));
    for (size_t j = i; j < end; ++j) {
      const Verdict v = ScoreCompletion(ctx, problems[j], prompts[j - i],
                                        completions[j - i].tokens);
      reward_sum += v.reward;
      correct += v.correct ? 1 : 0;
    }
  }
  if (joins_only) {
    result.seconds = SecondsSince(start);
    return result;
  }
  result.problems = static_cast<int64_t>(problems.size());
  if (result.problems > 0) {
    result.accuracy = static_cast<double>(correct) / result.problems;
    result.reward_mean = reward_sum / result.problems;
  }
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace fusionrl
