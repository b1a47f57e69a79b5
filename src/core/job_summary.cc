#include "core/job_summary.h"

#include "absl/strings/str_cat.h"
#include "core/metrics.h"
#include "nlohmann/json.hpp"

namespace fusionrl {

absl::Status WriteSummary(const JobSummary& s) {
  nlohmann::ordered_json j = {
      {"kind", s.kind},
      {"initial_eval_accuracy", s.initial_eval_accuracy},
      {"final_eval_accuracy", s.final_eval_accuracy},
      {"steps", s.steps},
      {"rollout_tokens", s.rollout_tokens},
      {"wall_seconds", s.wall_seconds},
      {"tokens_per_second", s.tokens_per_second},
      {"final_train_reward", s.final_train_reward},
      {"policy_version", s.policy_version},
      {"checkpoint_dir", s.checkpoint_dir},
      {"interrupted", s.interrupted},
      {"resumed_from_step", s.resumed_from_step}};
  if (!s.final_weights_crc32c.empty()) {
    j["max_clock_skew_seen"] = s.max_clock_skew_seen;
    j["final_weights_crc32c"] = s.final_weights_crc32c;
  }
  return WriteFileAtomic(s.summary_path, j.dump(2) + "\n");
}

absl::StatusOr<JobSummary> ParseSummary(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InternalError("the job ended without a readable summary");
  }
  JobSummary s;
  try {
    s.kind = j.value("kind", "rl");
    s.initial_eval_accuracy = j.value("initial_eval_accuracy", 0.0);
    s.final_eval_accuracy = j.value("final_eval_accuracy", 0.0);
    s.steps = j.value("steps", int64_t{0});
    s.rollout_tokens = j.value("rollout_tokens", int64_t{0});
    s.wall_seconds = j.value("wall_seconds", 0.0);
    s.tokens_per_second = j.value("tokens_per_second", 0.0);
    s.final_train_reward = j.value("final_train_reward", 0.0);
    s.policy_version = j.value("policy_version", int64_t{0});
    s.checkpoint_dir = j.value("checkpoint_dir", "");
    s.interrupted = j.value("interrupted", false);
    s.resumed_from_step = j.value("resumed_from_step", int64_t{0});
    s.max_clock_skew_seen = j.value("max_clock_skew_seen", int64_t{0});
    if (j.contains("final_weights_crc32c")) {
      s.final_weights_crc32c =
          j["final_weights_crc32c"].get<std::map<std::string, uint32_t>>();
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("summary: ", e.what()));
  }
  return s;
}

const char* JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kPending:
      return "pending";
    case JobPhase::kWaitingForCapacity:
      return "waiting_for_capacity";
    case JobPhase::kRunning:
      return "running";
    case JobPhase::kSucceeded:
      return "succeeded";
    case JobPhase::kFailed:
      return "failed";
    case JobPhase::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

}  // namespace fusionrl
