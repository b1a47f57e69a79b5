#include "core/checkpoint_meta.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace fs = std::filesystem;

absl::StatusOr<std::string> FindLatestCheckpoint(
    const std::string& checkpoints_dir, bool committed_only,
    std::vector<std::string>* skipped) {
  std::error_code ec;
  fs::directory_iterator it(checkpoints_dir, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat(
        "no checkpoints in '", checkpoints_dir, "': ", ec.message()));
  }
  // (step, dir) of every complete checkpoint, newest first.
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    // Skip half-written (.tmp) and superseded (.old) directories.
    if (!entry.is_directory() || absl::EndsWith(name, ".tmp") ||
        absl::EndsWith(name, ".old")) {
      continue;
    }
    std::ifstream in(entry.path() / "meta.json");
    if (!in) continue;
    nlohmann::json j =
        nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") ||
        !j["step"].is_number_integer()) {
      continue;
    }
    found.emplace_back(j["step"].get<int64_t>(), entry.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<std::string> uncommitted;
  for (const auto& [step, dir] : found) {
    if (committed_only && absl::IsNotFound(ReadRunTotals(dir).status())) {
      uncommitted.push_back(dir);
      continue;
    }
    if (skipped != nullptr) *skipped = uncommitted;
    return dir;
  }
  if (found.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoints in '", checkpoints_dir, "'"));
  }
  return absl::NotFoundError(
      absl::StrCat("no committed checkpoint in '", checkpoints_dir, "' (",
                   absl::StrJoin(uncommitted, ", "),
                   " have no run.json: their step never committed)"));
}

absl::StatusOr<nlohmann::json> ReadCheckpointMetaJson(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "meta.json");
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", dir,
                     "': no meta.json (not a FusionRL checkpoint "
                     "directory)"));
  }
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint '", dir, "': meta.json: ", e.what()));
  }
  return j;
}

absl::StatusOr<CheckpointMeta> ReadCheckpointMeta(const std::string& dir) {
  FUSIONRL_ASSIGN_OR_RETURN(nlohmann::json j, ReadCheckpointMetaJson(dir));
  return CheckpointMetaFromJson(j, dir);
}

absl::StatusOr<CheckpointMeta> CheckpointMetaFromJson(const nlohmann::json& j,
                                                      const std::string& dir) {
  CheckpointMeta meta;
  try {
    meta.kind = j.value("kind", "");
    meta.job_name = j.value("job_name", "");
    meta.step = j.value("step", int64_t{0});
    meta.policy_version = j.value("policy_version", int64_t{0});
    meta.data_cursor = j.value("data_cursor", uint64_t{0});
    meta.expert_parallel = j.value("expert_parallel", 1);
    meta.expert_weights_split = j.value("expert_weights_split", false);
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint '", dir, "': meta.json: ", e.what()));
  }
  return meta;
}

std::string RunTotalsToJson(const RunTotals& totals) {
  nlohmann::ordered_json j = {
      {"initial_eval_accuracy", totals.initial_eval_accuracy},
      {"last_eval_accuracy", totals.last_eval_accuracy},
      {"rollout_tokens", totals.rollout_tokens},
      {"loop_seconds", totals.loop_seconds},
      {"controller_tensor_bytes", totals.controller_tensor_bytes}};
  return j.dump(2) + "\n";
}

absl::StatusOr<RunTotals> ReadRunTotals(const std::string& dir) {
  const fs::path run_path = fs::path(dir) / kRunTotalsFile;
  const bool has_run = fs::exists(run_path);
  std::ifstream in(has_run ? run_path : fs::path(dir) / "meta.json");
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", dir, "': no ", kRunTotalsFile));
  }
  nlohmann::json j =
      nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint '", dir, "': ", has_run ? kRunTotalsFile : "meta.json",
        ": not a JSON object"));
  }
  if (!has_run && !j.contains("rollout_tokens")) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", dir, "': no ", kRunTotalsFile));
  }
  RunTotals totals;
  try {
    totals.initial_eval_accuracy = j.value("initial_eval_accuracy", -1.0);
    totals.last_eval_accuracy = j.value("last_eval_accuracy", -1.0);
    totals.rollout_tokens = j.value("rollout_tokens", int64_t{0});
    totals.loop_seconds = j.value("loop_seconds", 0.0);
    totals.controller_tensor_bytes =
        j.value("controller_tensor_bytes", int64_t{0});
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint '", dir, "': ", has_run ? kRunTotalsFile : "meta.json",
        ": ", e.what()));
  }
  return totals;
}

}  // namespace fusionrl
