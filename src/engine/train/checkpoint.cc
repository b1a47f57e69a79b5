#include "engine/train/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "engine/model/expert_parallel.h"
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
  // Architecture keys beyond the built-in decoder's, written only when set,
  // so checkpoints from before them compare equal.
  const ModelConfig d;
  if (!m.architecture.empty()) j["architecture"] = m.architecture;
  if (m.n_kv_heads != d.n_kv_heads && m.n_kv_heads != m.n_heads) {
    j["n_kv_heads"] = m.n_kv_heads;
  }
  if (m.head_dim != d.head_dim && m.head_dim * m.n_heads != m.d_model) {
    j["head_dim"] = m.head_dim;
  }
  if (m.qkv_bias) j["qkv_bias"] = true;
  if (m.qk_norm) j["qk_norm"] = true;
  if (m.tie_embeddings) j["tie_embeddings"] = true;
  if (m.rope_scaling.type != "none") {
    const RopeScalingConfig& r = m.rope_scaling;
    j["rope_scaling"] = {{"type", r.type}, {"factor", r.factor}};
    if (r.type == "llama3") {
      j["rope_scaling"]["low_freq_factor"] = r.low_freq_factor;
      j["rope_scaling"]["high_freq_factor"] = r.high_freq_factor;
      j["rope_scaling"]["original_max_position_embeddings"] =
          r.original_max_position_embeddings;
    }
  }
  if (m.moe_experts > 0) {
    j["moe_experts"] = m.moe_experts;
    j["moe_top_k"] = m.moe_top_k;
    j["moe_d_ff"] = m.moe_d_ff > 0 ? m.moe_d_ff : m.d_ff;
    j["moe_shared_expert"] = m.moe_shared_expert;
    if (m.moe_groups > 1) j["moe_groups"] = m.moe_groups;
    if (m.moe_gates != MoeGates::kAuto)
      j["moe_gates"] = MoeGatesName(m.moe_gates);
  }
  return j;
}

// <dir>/meta.json, parsed (core/checkpoint_meta.h): NotFound without one,
// DataLoss when it is not JSON or has no model section.
absl::StatusOr<nlohmann::json> ReadMetaJson(const std::string& dir) {
  FUSIONRL_ASSIGN_OR_RETURN(nlohmann::json j, ReadCheckpointMetaJson(dir));
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint '", dir, "': meta.json has no model section"));
  }
  return j;
}

// The inverse of ModelJson. Missing optional keys keep their defaults.
absl::Status ModelFromJson(const nlohmann::json& j, const std::string& where,
                           ModelConfig* m, int* vocab) {
  try {
    *vocab = j.at("vocab_size").get<int>();
    m->d_model = j.at("d_model").get<int>();
    m->n_layers = j.at("n_layers").get<int>();
    m->n_heads = j.at("n_heads").get<int>();
    m->d_ff = j.at("d_ff").get<int>();
    m->max_seq_len = j.at("max_seq_len").get<int>();
    m->rope_theta = j.at("rope_theta").get<double>();
    m->norm_eps = j.at("norm_eps").get<double>();
    m->architecture = j.value("architecture", std::string());
    m->n_kv_heads = j.value("n_kv_heads", 0);
    m->head_dim = j.value("head_dim", 0);
    m->qkv_bias = j.value("qkv_bias", false);
    m->qk_norm = j.value("qk_norm", false);
    m->tie_embeddings = j.value("tie_embeddings", false);
    if (j.contains("rope_scaling")) {
      const auto& r = j["rope_scaling"];
      m->rope_scaling.type = r.at("type").get<std::string>();
      m->rope_scaling.factor = r.at("factor").get<double>();
      m->rope_scaling.low_freq_factor = r.value("low_freq_factor", 1.0);
      m->rope_scaling.high_freq_factor = r.value("high_freq_factor", 4.0);
      m->rope_scaling.original_max_position_embeddings =
          r.value("original_max_position_embeddings", 8192);
    }
    m->moe_experts = j.value("moe_experts", 0);
    if (m->moe_experts > 0) {
      m->moe_top_k = j.at("moe_top_k").get<int>();
      m->moe_d_ff = j.at("moe_d_ff").get<int>();
      m->moe_shared_expert = j.at("moe_shared_expert").get<bool>();
      m->moe_groups = j.value("moe_groups", 1);
      if (j.contains("moe_gates")) {
        absl::StatusOr<MoeGates> gates =
            ParseMoeGates(j.at("moe_gates").get<std::string>());
        if (!gates.ok()) {
          return absl::DataLossError(
              absl::StrCat("checkpoint model config: moe_gates: ",
                           gates.status().message()));
        }
        m->moe_gates = *gates;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(
        absl::StrCat(where, ": meta.json model section: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointModel> ReadCheckpointModel(const std::string& dir) {
  FUSIONRL_ASSIGN_OR_RETURN(nlohmann::json j, ReadMetaJson(dir));
  CheckpointModel out;
  FUSIONRL_RETURN_IF_ERROR(ModelFromJson(j["model"],
                                         absl::StrCat("checkpoint '", dir, "'"),
                                         &out.model, &out.vocab_size));
  if (j.contains("source") && j["source"].is_object()) {
    out.hf_path = j["source"].value("hf_path", std::string());
    out.tokenizer = j["source"].value("tokenizer", std::string());
  }
  out.model.hf_path = out.hf_path;
  out.model.tokenizer = out.tokenizer;
  if (j.contains("lora") && j["lora"].is_object()) {
    try {
      const auto& l = j["lora"];
      out.model.lora.rank = l.at("r").get<int>();
      out.model.lora.alpha = l.at("alpha").get<double>();
      out.model.lora.dropout = l.value("dropout", 0.0);
      out.model.lora.targets = l.at("targets").get<std::string>();
      out.lora_base = l.value("base_model", std::string());
    } catch (const nlohmann::json::exception& e) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint '", dir, "': meta.json lora section: ", e.what()));
    }
  }
  return out;
}

namespace {

std::string ShardOptimizerName(int shard) {
  return absl::StrCat("optim.expert-shard-", shard, ".pt");
}

std::string ShardWeightsName(int shard) {
  return absl::StrCat("model.expert-shard-", shard, ".pt");
}

// Where a shard's card stages the file `name` ("<stem>.pt") of checkpoint
// `dir` of `step` until the lead moves it in:
// "<dir>.shards/<stem>.step-<step>.pt".
std::string StagedPath(const std::string& dir, const std::string& name,
                       int64_t step) {
  const std::string stem = name.substr(0, name.size() - 3);
  return (fs::path(dir + ".shards") / absl::StrCat(stem, ".step-", step, ".pt"))
      .string();
}

// Writes `path` whole through `write` (to path + ".tmp", then renamed): the
// lead never moves a partial file in.
absl::Status WriteWhole(
    const fs::path& path,
    const std::function<absl::Status(const std::string&)>& write) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("checkpoint: cannot create '",
                                               path.parent_path().string(),
                                               "': ", ec.message()));
  }
  const std::string tmp = path.string() + ".tmp";
  FUSIONRL_RETURN_IF_ERROR(write(tmp));
  fs::rename(tmp, path, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("checkpoint: cannot move '", tmp,
                                               "' into place: ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ExpertShardOptimizerPath(const std::string& dir, int shard,
                                     int64_t step) {
  return StagedPath(dir, ShardOptimizerName(shard), step);
}

absl::Status WriteExpertShard(const std::string& dir, int shard, int64_t step,
                              const Trainer& trainer,
                              const PolicyModel* weights) {
  if (weights != nullptr) {
    // Its own experts only: the dense parameters are in model.pt.
    FUSIONRL_RETURN_IF_ERROR(
        WriteWhole(StagedPath(dir, ShardWeightsName(shard), step),
                   [&](const std::string& tmp) {
                     return weights->Save(tmp, IsExpertParameter);
                   }));
  }
  return WriteWhole(
      ExpertShardOptimizerPath(dir, shard, step),
      [&](const std::string& tmp) { return trainer.SaveOptimizer(tmp); });
}

absl::Status WriteCheckpoint(const std::string& dir, const PolicyModel& model,
                             const Trainer* trainer, const CheckpointMeta& meta,
                             const std::function<void()>& before_swap) {
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
  // Expert parallelism: the other shards' optimizer states (and experts),
  // written by their cards before this call.
  auto move_in = [&](const std::string& name,
                     const std::string& what) -> absl::Status {
    const std::string from = StagedPath(dir, name, meta.step);
    fs::rename(from, tmp_dir / name, ec);
    if (!ec) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", dir, "': ", what, " was not written (expected at ",
        from, "): ", ec.message()));
  };
  for (int r = 1; r < meta.expert_parallel; ++r) {
    FUSIONRL_RETURN_IF_ERROR(
        move_in(ShardOptimizerName(r),
                absl::StrCat("the optimizer state of expert shard ", r)));
    if (meta.expert_weights_split) {
      FUSIONRL_RETURN_IF_ERROR(
          move_in(ShardWeightsName(r),
                  absl::StrCat("the experts of expert shard ", r)));
    }
  }
  nlohmann::ordered_json j = {
      {"format", "fusionrl-checkpoint-v1"},
      {"kind", meta.kind},
      {"job_name", meta.job_name},
      {"step", meta.step},
      {"policy_version", meta.policy_version},
      {"data_cursor", meta.data_cursor},
      {"model", ModelJson(model.config(), model.vocab_size())}};
  if (meta.expert_parallel > 1) j["expert_parallel"] = meta.expert_parallel;
  if (meta.expert_weights_split) j["expert_weights_split"] = true;
  // Where the model and tokenizer came from (not compared on load): what
  // `fusionrl export` copies the tokenizer files from.
  if (!model.config().hf_path.empty() || !model.config().tokenizer.empty()) {
    j["source"] = {{"hf_path", model.config().hf_path},
                   {"tokenizer", model.config().tokenizer}};
  }
  if (model.lora()) {
    // model.pt holds the adapters only: what they apply to, for `fusionrl
    // export` and `generate` (not compared on load: the job's config says
    // its LoRA shape).
    const LoraConfig& l = model.config().lora;
    j["lora"] = {{"r", l.rank},
                 {"alpha", l.alpha},
                 {"dropout", l.dropout},
                 {"targets", l.targets},
                 {"base_model", meta.lora_base.empty() ? model.config().hf_path
                                                       : meta.lora_base}};
  }
  FUSIONRL_RETURN_IF_ERROR(
      WriteFileAtomic((tmp_dir / "meta.json").string(), j.dump(2) + "\n"));
  if (before_swap) before_swap();
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
  if (meta.expert_parallel > 1) fs::remove_all(dir + ".shards", ec);
  return absl::OkStatus();
}

absl::StatusOr<CheckpointMeta> ReadCheckpoint(const std::string& dir,
                                              PolicyModel& model,
                                              Trainer* trainer) {
  const fs::path root(dir);
  // One parse of meta.json serves the config check and the returned meta.
  FUSIONRL_ASSIGN_OR_RETURN(nlohmann::json j, ReadMetaJson(dir));
  const auto expected = ModelJson(model.config(), model.vocab_size());
  // A dense config must not read a MoE checkpoint either.
  const nlohmann::json stored_experts =
      j["model"].value("moe_experts", nlohmann::json(0));
  if (stored_experts != nlohmann::json(model.config().moe_experts)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", dir, "': model.moe_experts is ",
                     stored_experts.dump(), " in the checkpoint but ",
                     model.config().moe_experts, " in this config"));
  }
  // MoGE groups change the function, not the shapes; absent means 1 (top-k
  // checkpoints, and those from before groups), checked both ways.
  if (model.config().moe_experts > 0) {
    const int stored_groups = j["model"].value("moe_groups", 1);
    if (stored_groups != model.config().moe_groups) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint '", dir, "': model.moe_groups is ", stored_groups,
          " in the checkpoint but ", model.config().moe_groups,
          " in this config (the routing is part of the trained function)"));
    }
  }
  for (const auto& [key, value] : expected.items()) {
    const auto& stored = j["model"].value(key, nlohmann::json());
    if (stored.dump() != value.dump()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint '", dir, "': model.", key, " is ", stored.dump(),
          " in the checkpoint but ", value.dump(), " in this config"));
    }
  }
  FUSIONRL_ASSIGN_OR_RETURN(CheckpointMeta meta,
                            CheckpointMetaFromJson(j, dir));
  const int shards = model.expert_shard().size;
  if (trainer != nullptr && meta.expert_parallel != shards) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", dir, "' was written with placement.expert_parallel ",
        meta.expert_parallel, " and this job has ", shards,
        ": the optimizer state is split per expert shard, so a resume needs "
        "the same value (its weights alone load with any: "
        "model.init_checkpoint)"));
  }
  std::vector<std::string> weights = {(root / "model.pt").string()};
  if (meta.expert_weights_split) {
    for (int r = 1; r < meta.expert_parallel; ++r) {
      weights.push_back((root / ShardWeightsName(r)).string());
    }
  }
  FUSIONRL_RETURN_IF_ERROR(model.Load(weights));
  if (trainer != nullptr) {
    // Continuing training needs the optimizer state: without it AdamW's
    // moments and step count (and the warm-up) would silently restart.
    const int shard = model.expert_shard().rank;
    const fs::path optim = root / (shard == 0 ? std::string("optim.pt")
                                              : ShardOptimizerName(shard));
    if (!fs::exists(optim)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint '", dir, "': no ", optim.filename().string(),
          " (the optimizer state); a resume continues training "
          "and needs it. To start a new run from these weights, use them as "
          "init_checkpoint instead"));
    }
    FUSIONRL_RETURN_IF_ERROR(trainer->LoadOptimizer(optim.string()));
  }
  return meta;
}

}  // namespace fusionrl
