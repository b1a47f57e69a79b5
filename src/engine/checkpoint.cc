#include "engine/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace fs = std::filesystem;
namespace {

// The keys that must match for the weights to load and mean the same
// function. MoE keys are written only for MoE models, so dense checkpoints
// from before MoE still compare equal; a missing moe_experts reads as 0.
// (moe_capacity_factor and the loss weights are training knobs, not shape.)
nlohmann::ordered_json ModelJson(const ModelConfig& m, int vocab) {
  nlohmann::ordered_json j = {{"vocab_size", vocab},
                              {"d_model", m.d_model},
                              {"n_layers", m.n_layers},
                              {"n_heads", m.n_heads},
                              {"d_ff", m.d_ff},
                              {"max_seq_len", m.max_seq_len},
                              {"rope_theta", m.rope_theta},
                              {"norm_eps", m.norm_eps}};
  if (m.moe_experts > 0) {
    j["moe_experts"] = m.moe_experts;
    j["moe_top_k"] = m.moe_top_k;
    j["moe_d_ff"] = m.moe_d_ff > 0 ? m.moe_d_ff : m.d_ff;
    j["moe_shared_expert"] = m.moe_shared_expert;
  }
  return j;
}

}  // namespace

absl::Status WriteCheckpoint(const std::string& dir, const PolicyModel& model,
                             const Trainer* trainer,
                             const CheckpointMeta& meta) {
  const fs::path final_dir(dir);
  const fs::path tmp_dir = fs::path(dir + ".tmp");
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "checkpoint: cannot create '", tmp_dir.string(), "': ", ec.message()));
  }
  FUSIONRL_RETURN_IF_ERROR(model.Save((tmp_dir / "model.pt").string()));
  if (trainer != nullptr) {
    FUSIONRL_RETURN_IF_ERROR(
        trainer->SaveOptimizer((tmp_dir / "optim.pt").string()));
  }
  nlohmann::ordered_json j = {
      {"format", "fusionrl-checkpoint-v1"},
      {"kind", meta.kind},
      {"job_name", meta.job_name},
      {"step", meta.step},
      {"policy_version", meta.policy_version},
      {"data_cursor", meta.data_cursor},
      {"initial_eval_accuracy", meta.initial_eval_accuracy},
      {"last_eval_accuracy", meta.last_eval_accuracy},
      {"rollout_tokens", meta.rollout_tokens},
      {"loop_seconds", meta.loop_seconds},
      {"model", ModelJson(model.config(), model.vocab_size())}};
  FUSIONRL_RETURN_IF_ERROR(
      WriteFileAtomic((tmp_dir / "meta.json").string(), j.dump(2) + "\n"));
  // Swap into place: the old checkpoint is removed only once the new one is
  // complete on disk.
  const fs::path old_dir = fs::path(dir + ".old");
  fs::remove_all(old_dir, ec);
  if (fs::exists(final_dir)) fs::rename(final_dir, old_dir, ec);
  if (!ec) fs::rename(tmp_dir, final_dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("checkpoint: cannot move '",
                                               tmp_dir.string(), "' to '", dir,
                                               "': ", ec.message()));
  }
  fs::remove_all(old_dir, ec);
  return absl::OkStatus();
}

absl::StatusOr<CheckpointMeta> ReadCheckpoint(const std::string& dir,
                                              PolicyModel& model,
                                              Trainer* trainer) {
  const fs::path root(dir);
  const fs::path meta_path = root / "meta.json";
  std::ifstream in(meta_path);
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
  const auto expected = ModelJson(model.config(), model.vocab_size());
  if (!j.contains("model") || !j["model"].is_object()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint '", dir, "': meta.json has no model section"));
  }
  // A dense config must not read a MoE checkpoint either.
  const nlohmann::json stored_experts =
      j["model"].value("moe_experts", nlohmann::json(0));
  if (stored_experts != nlohmann::json(model.config().moe_experts)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", dir, "': model.moe_experts is ",
                     stored_experts.dump(), " in the checkpoint but ",
                     model.config().moe_experts, " in this config"));
  }
  for (const auto& [key, value] : expected.items()) {
    const auto& stored = j["model"].value(key, nlohmann::json());
    if (stored.dump() != value.dump()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint '", dir, "': model.", key, " is ", stored.dump(),
          " in the checkpoint but ", value.dump(), " in this config"));
    }
  }
  FUSIONRL_ASSIGN_OR_RETURN(CheckpointMeta meta, ReadCheckpointMeta(dir));
  FUSIONRL_RETURN_IF_ERROR(model.Load((root / "model.pt").string()));
  if (trainer != nullptr && fs::exists(root / "optim.pt")) {
    FUSIONRL_RETURN_IF_ERROR(
        trainer->LoadOptimizer((root / "optim.pt").string()));
  }
  return meta;
}

}  // namespace fusionrl
