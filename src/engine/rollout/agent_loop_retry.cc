// AgentLoop::Run: RunOnce, and again for the episodes whose environment
// was unreachable, with backoff within env.unavailable_seconds
// (engine/rollout/agent_loop.h).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "engine/rollout/agent_loop.h"
#include "spdlog/spdlog.h"

namespace fusionrl {
namespace {

// A retry's decode work added to the step's.
void AddStats(const EpisodeDecodeStats& more, EpisodeDecodeStats& into) {
  into.decode_steps += more.decode_steps;
  into.rows_computed += more.rows_computed;
  into.env_tokens_fed += more.env_tokens_fed;
  into.wait_seconds += more.wait_seconds;
  into.total_seconds += more.total_seconds;
  into.expert_joins += more.expert_joins;
}

}  // namespace

absl::StatusOr<EpisodeBatch> AgentLoop::Run(
    PolicyModel& model, const std::vector<Problem>& problems,
    const std::vector<SequenceKey>& keys, const SamplingParams& params,
    int64_t slots, int row_blocks, bool fused,
    GradientSync* expert_lockstep) const {
  if (ctx_.environment == nullptr) {
    return absl::FailedPreconditionError("AgentLoop: the job has no env");
  }
  std::vector<std::string> unreachable(problems.size());
  FUSIONRL_ASSIGN_OR_RETURN(
      EpisodeBatch batch,
      RunOnce(model, problems, keys, params, slots, row_blocks, fused,
              expert_lockstep, &unreachable));
  const absl::Time first = absl::Now();
  const absl::Duration budget = absl::Seconds(ctx_.env.unavailable_seconds);
  absl::Duration wait = absl::Milliseconds(500);
  for (int attempt = 1;; ++attempt) {
    std::vector<size_t> down;
    for (size_t i = 0; i < unreachable.size(); ++i) {
      if (!unreachable[i].empty()) down.push_back(i);
    }
    if (down.empty()) {
      if (attempt > 1) {
        spdlog::info("env: the environment answered again after {:.1f} s",
                     absl::ToDoubleSeconds(absl::Now() - first));
      }
      return batch;
    }
    const absl::Duration left = budget - (absl::Now() - first);
    // Ranks of an expert group decode in lockstep: one cannot run again
    // alone.
    if (left <= absl::ZeroDuration() || expert_lockstep != nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "env: the environment is unreachable: ", down.size(), " of ",
          problems.size(), " episodes of the step could not reach it",
          expert_lockstep != nullptr
              ? " (expert lockstep: no retry)"
              : absl::StrCat(" after ", attempt, " attempts over ",
                             absl::FormatDuration(absl::Now() - first),
                             " (env.unavailable_seconds: ",
                             ctx_.env.unavailable_seconds, ")"),
          "; the last error: ", unreachable[down.back()]));
    }
    wait = std::min(wait, left);
    spdlog::warn(
        "env: {} of {} episodes could not reach the environment ({}); "
        "retrying them in {} ({} left of env.unavailable_seconds)",
        down.size(), problems.size(), unreachable[down.back()],
        absl::FormatDuration(wait), absl::FormatDuration(left));
    absl::SleepFor(wait);
    wait = std::min(2 * wait, absl::Seconds(8));
    std::vector<Problem> again;
    std::vector<SequenceKey> again_keys;
    for (size_t i : down) {
      again.push_back(problems[i]);
      again_keys.push_back(keys[i]);
    }
    std::vector<std::string> again_down(down.size());
    FUSIONRL_ASSIGN_OR_RETURN(EpisodeBatch retry,
                              RunOnce(model, again, again_keys, params, slots,
                                      row_blocks, fused, nullptr, &again_down));
    for (size_t k = 0; k < down.size(); ++k) {
      batch.samples[down[k]] = std::move(retry.samples[k]);
      unreachable[down[k]] = std::move(again_down[k]);
    }
    AddStats(retry.decode, batch.decode);
  }
}

}  // namespace fusionrl
