#include "engine/model/hf_model.h"

#include <torch/types.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/hf_config.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "hf/safetensors.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace fs = std::filesystem;
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<c10::ScalarType> TorchType(StDtype d, const std::string& file,
                                          const std::string& name) {
  switch (d) {
    case StDtype::kF32:
      return torch::kFloat;
    case StDtype::kBF16:
      return torch::kBFloat16;
    case StDtype::kF16:
      return torch::kHalf;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": tensor '", name, "' has dtype ", std::string(StDtypeName(d)),
          " (weights must be F32, BF16 or F16)"));
  }
}

// Replaces `out_dir` by the complete directory `tmp_dir`: an existing one
// is moved aside first and removed once the new one is in place.
absl::Status MoveDirIntoPlace(const fs::path& tmp_dir,
                              const std::string& out_dir) {
  std::error_code ec;
  const fs::path final_dir(out_dir);
  const fs::path old_dir(out_dir + ".old");
  fs::remove_all(old_dir, ec);
  ec.clear();
  if (fs::exists(final_dir)) fs::rename(final_dir, old_dir, ec);
  if (!ec) fs::rename(tmp_dir, final_dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("export: cannot move '",
                                               tmp_dir.string(), "' to '",
                                               out_dir, "': ", ec.message()));
  }
  fs::remove_all(old_dir, ec);
  return absl::OkStatus();
}

// A new empty "<out_dir>.tmp" to assemble an export in.
absl::StatusOr<fs::path> FreshTmpDir(const std::string& out_dir) {
  const fs::path tmp_dir(out_dir + ".tmp");
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "export: cannot create '", tmp_dir.string(), "': ", ec.message()));
  }
  return tmp_dir;
}

}  // namespace

absl::StatusOr<std::string> HfParameterName(const std::string& name,
                                            const std::string& architecture) {
  if (name == "embed.weight") return std::string("model.embed_tokens.weight");
  if (name == "norm.weight") return std::string("model.norm.weight");
  if (name == "lm_head.weight") return std::string("lm_head.weight");
  // block<i>.<module path>.<weight|bias>
  std::vector<std::string> parts = absl::StrSplit(name, '.');
  int layer = -1;
  if (parts.size() >= 3 && absl::StartsWith(parts[0], "block") &&
      absl::SimpleAtoi(parts[0].substr(5), &layer) && layer >= 0) {
    const std::string prefix = absl::StrCat("model.layers.", layer, ".");
    const std::string leaf = parts.back();
    const std::string path = absl::StrJoin(
        std::vector<std::string>(parts.begin() + 1, parts.end() - 1), ".");
    static const std::map<std::string, std::string> kMap = {
        {"attn_norm", "input_layernorm"},
        {"mlp_norm", "post_attention_layernorm"},
        {"attn.wq", "self_attn.q_proj"},
        {"attn.wk", "self_attn.k_proj"},
        {"attn.wv", "self_attn.v_proj"},
        {"attn.wo", "self_attn.o_proj"},
        {"attn.q_norm", "self_attn.q_norm"},
        {"attn.k_norm", "self_attn.k_norm"},
        {"mlp.w1", "mlp.gate_proj"},
        {"mlp.w3", "mlp.up_proj"},
        {"mlp.w2", "mlp.down_proj"}};
    auto it = kMap.find(path);
    if (it != kMap.end()) return absl::StrCat(prefix, it->second, ".", leaf);
    // The sparse block: "mlp.router", "mlp.expert<e>.w1|w2|w3".
    const bool qwen3_moe = architecture == "Qwen3MoeForCausalLM";
    if (IsMoeArchitecture(architecture) && parts.size() >= 4 &&
        parts[1] == "mlp") {
      const std::string block = qwen3_moe ? "mlp" : "block_sparse_moe";
      int expert = -1;
      if (path == "mlp.router") {
        return absl::StrCat(prefix, block, ".gate.", leaf);
      }
      if (parts.size() == 5 && absl::StartsWith(parts[2], "expert") &&
          absl::SimpleAtoi(parts[2].substr(6), &expert) && expert >= 0) {
        static const std::map<std::string, std::string> kQwen = {
            {"w1", "gate_proj"}, {"w3", "up_proj"}, {"w2", "down_proj"}};
        const std::string& w = parts[3];
        if (w == "w1" || w == "w2" || w == "w3") {
          return absl::StrCat(prefix, block, ".experts.", expert, ".",
                              qwen3_moe ? kQwen.at(w) : w, ".", leaf);
        }
      }
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("parameter '", name, "' has no Hugging Face name under ",
                   architecture.empty() ? "LlamaForCausalLM" : architecture,
                   " (mixture-of-experts weights need Qwen3MoeForCausalLM or "
                   "MixtralForCausalLM)"));
}

absl::Status LoadHfWeights(const std::string& dir, PolicyModel& model) {
  // Which file holds which tensor.
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, std::pair<const SafetensorsFile*, const StTensorInfo*>>
      stored;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  std::vector<std::string> paths;
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index_path)) {
    FUSIONRL_ASSIGN_OR_RETURN(weight_map,
                              ReadSafetensorsIndex(index_path.string()));
    std::set<std::string> names;
    for (const auto& [tensor, file] : weight_map) names.insert(file);
    for (const auto& file : names) {
      paths.push_back((fs::path(dir) / file).string());
    }
  } else if (fs::exists(single_path)) {
    paths.push_back(single_path.string());
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": no model.safetensors or model.safetensors.index.json"));
  }
  for (const std::string& path : paths) {
    FUSIONRL_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    for (const StTensorInfo& info : file->tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(info.name);
        const std::string base = fs::path(path).filename().string();
        if (it == weight_map.end() || it->second != base) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": tensor '", info.name,
              "' is not listed for this file in model.safetensors.index.json"));
        }
      }
      if (!stored.emplace(info.name, std::make_pair(file.get(), &info))
               .second) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor '", info.name, "' is stored in two files"));
      }
    }
    files.push_back(std::move(file));
  }
  for (const auto& [tensor, file] : weight_map) {
    if (stored.count(tensor) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": tensor '", tensor,
                       "' is listed for ", file, " but not stored there"));
    }
  }

  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  const std::string where = paths.size() == 1 ? paths[0] : dir;
  for (auto& [name, param] : model.named_parameters()) {
    FUSIONRL_ASSIGN_OR_RETURN(
        std::string hf, HfParameterName(name, model.config().architecture));
    auto it = stored.find(hf);
    if (it == stored.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": missing tensor '", hf,
                       "' (config.json's architecture "
                       "needs it)"));
    }
    const SafetensorsFile& file = *it->second.first;
    const StTensorInfo& info = *it->second.second;
    const std::vector<int64_t> want = param.sizes().vec();
    if (info.shape != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": tensor '", hf, "' has shape ",
                       ShapeString(info.shape), " but config.json needs ",
                       ShapeString(want)));
    }
    FUSIONRL_ASSIGN_OR_RETURN(c10::ScalarType type,
                              TorchType(info.dtype, file.path(), hf));
    const absl::Span<const uint8_t> bytes = file.Data(info);
    at::Tensor host = torch::empty(want, torch::TensorOptions().dtype(type));
    if (!bytes.empty())
      std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
    param.copy_(host);
    used.insert(hf);
  }
  for (const auto& [hf, where_stored] : stored) {
    if (used.count(hf) > 0) continue;
    if (absl::EndsWith(hf, "rotary_emb.inv_freq")) continue;
    if (hf == "lm_head.weight" && model.config().tie_embeddings) continue;
    return absl::InvalidArgumentError(
        absl::StrCat(where_stored.first->path(), ": unexpected tensor '", hf,
                     "' (config.json's architecture has no such weight)"));
  }
  return absl::OkStatus();
}

absl::Status ExportHfModel(const PolicyModel& model, const std::string& out_dir,
                           const HfExportOptions& options) {
  if (options.dtype != "float32" && options.dtype != "bfloat16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "export: dtype '", options.dtype, "' (float32 or bfloat16)"));
  }
  const bool bf16 = options.dtype == "bfloat16";
  FUSIONRL_ASSIGN_OR_RETURN(
      std::string config_json,
      HfConfigJson(model.config(), model.vocab_size(), options.bos_token_id,
                   options.eos_token_ids, options.dtype,
                   options.max_position_embeddings));

  FUSIONRL_ASSIGN_OR_RETURN(const fs::path tmp_dir, FreshTmpDir(out_dir));
  std::error_code ec;

  // Host copies in the stored dtype, kept alive while the files are written.
  std::vector<at::Tensor> host;
  std::vector<StTensorView> views;
  {
    torch::NoGradGuard no_grad;
    // An unmerged LoRA model (a bfloat16 view, or a trainer's policy): its
    // weights are the base, so each targeted one is written merged,
    // W + (alpha / r) B A in float32, rounded once to the stored dtype.
    std::map<std::string, at::Tensor> adapters;
    if (model.lora() && !model.lora_merged()) {
      for (const auto& [name, t] : model.named_trainable_parameters()) {
        adapters[name] = t.detach().to(torch::kCPU).to(torch::kFloat);
      }
    }
    const double scale = model.config().lora.alpha / model.config().lora.rank;
    for (const auto& [name, param] : model.named_parameters()) {
      FUSIONRL_ASSIGN_OR_RETURN(
          std::string hf, HfParameterName(name, model.config().architecture));
      at::Tensor t = param.detach().to(torch::kCPU);
      const std::string slot =
          absl::EndsWith(name, ".weight")
              ? name.substr(0, name.size() - std::string(".weight").size())
              : name;
      if (auto a = adapters.find(slot + ".lora_A"); a != adapters.end()) {
        t = t.to(torch::kFloat) +
            adapters.at(slot + ".lora_B").mm(a->second) * scale;
      }
      t = t.to(bf16 ? torch::kBFloat16 : torch::kFloat).contiguous();
      StTensorView v;
      v.name = hf;
      v.dtype = bf16 ? StDtype::kBF16 : StDtype::kF32;
      v.shape = t.sizes().vec();
      v.data = t.data_ptr();
      v.bytes = static_cast<size_t>(t.nbytes());
      views.push_back(std::move(v));
      host.push_back(std::move(t));
    }
  }
  FUSIONRL_RETURN_IF_ERROR(WriteShardedSafetensors(tmp_dir.string(), views,
                                                   {{"format", "pt"}},
                                                   options.max_shard_bytes)
                               .status());
  FUSIONRL_RETURN_IF_ERROR(
      WriteFileAtomic((tmp_dir / "config.json").string(), config_json));
  nlohmann::ordered_json gen = nlohmann::ordered_json::object();
  if (!options.source_dir.empty()) {
    const fs::path source_gen =
        fs::path(options.source_dir) / "generation_config.json";
    if (fs::exists(source_gen)) {
      std::ifstream in(source_gen);
      gen = nlohmann::ordered_json::parse(in, nullptr,
                                          /*allow_exceptions=*/false);
      if (!gen.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "export: ", source_gen.string(), " is not a JSON object"));
      }
    }
  }
  if (options.bos_token_id >= 0) gen["bos_token_id"] = options.bos_token_id;
  if (options.eos_token_ids.size() == 1) {
    gen["eos_token_id"] = options.eos_token_ids[0];
  } else if (!options.eos_token_ids.empty()) {
    gen["eos_token_id"] = options.eos_token_ids;
  }
  FUSIONRL_RETURN_IF_ERROR(WriteFileAtomic(
      (tmp_dir / "generation_config.json").string(), gen.dump(2) + "\n"));
  if (!options.tokenizer_dir.empty()) {
    const fs::path src(options.tokenizer_dir);
    if (!fs::exists(src / "tokenizer.json")) {
      return absl::NotFoundError(absl::StrCat("export: no tokenizer.json in '",
                                              options.tokenizer_dir, "'"));
    }
    for (const char* name : {"tokenizer.json", "tokenizer_config.json",
                             "chat_template.jinja", "special_tokens_map.json",
                             "vocab.json", "merges.txt", "added_tokens.json"}) {
      if (!fs::exists(src / name)) continue;
      fs::copy_file(src / name, tmp_dir / name,
                    fs::copy_options::overwrite_existing, ec);
      if (ec) {
        return absl::UnavailableError(absl::StrCat("export: cannot copy '",
                                                   (src / name).string(),
                                                   "': ", ec.message()));
      }
    }
  }
  return MoveDirIntoPlace(tmp_dir, out_dir);
}

absl::StatusOr<std::string> PeftTensorName(const std::string& name) {
  // "<param>.lora_A" / "<param>.lora_B"
  const size_t dot = name.rfind('.');
  const std::string leaf = dot == std::string::npos ? "" : name.substr(dot + 1);
  if (leaf != "lora_A" && leaf != "lora_B") {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not a LoRA adapter tensor"));
  }
  FUSIONRL_ASSIGN_OR_RETURN(std::string hf,
                            HfParameterName(name.substr(0, dot) + ".weight"));
  return absl::StrCat("base_model.model.",
                      hf.substr(0, hf.size() - std::strlen(".weight")), ".",
                      leaf, ".weight");
}

absl::Status LoadPeftAdapter(const std::string& dir, PolicyModel& model) {
  if (!model.lora()) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": a LoRA adapter needs a model with model.lora set"));
  }
  const fs::path path = fs::path(dir) / "adapter_model.safetensors";
  if (!fs::exists(path)) {
    return absl::NotFoundError(absl::StrCat(
        dir,
        ": no adapter_model.safetensors (PEFT's adapter_model.bin is "
        "not read: save with safe_serialization=True)"));
  }
  FUSIONRL_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path.string()));
  std::map<std::string, const StTensorInfo*> stored;
  for (const StTensorInfo& info : file->tensors()) {
    std::string name = info.name;
    // PEFT keeps the adapter's name in memory (".lora_A.default.weight");
    // save_pretrained drops it.
    const size_t at = name.find(".default.");
    if (at != std::string::npos) name.erase(at, std::strlen(".default"));
    stored.emplace(name, &info);
  }
  std::vector<at::Tensor> values;
  std::set<std::string> used;
  for (const auto& [name, param] : model.named_trainable_parameters()) {
    FUSIONRL_ASSIGN_OR_RETURN(std::string peft, PeftTensorName(name));
    auto it = stored.find(peft);
    if (it == stored.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.string(), ": missing tensor '", peft,
                       "' (model.lora.targets needs it)"));
    }
    const StTensorInfo& info = *it->second;
    const std::vector<int64_t> want = param.sizes().vec();
    if (info.shape != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          path.string(), ": tensor '", peft, "' has shape ",
          ShapeString(info.shape),
          " but the base model with r = ", model.config().lora.rank, " needs ",
          ShapeString(want), " (an adapter for another base model or rank?)"));
    }
    FUSIONRL_ASSIGN_OR_RETURN(c10::ScalarType type,
                              TorchType(info.dtype, path.string(), peft));
    const absl::Span<const uint8_t> bytes = file->Data(info);
    at::Tensor host = torch::empty(want, torch::TensorOptions().dtype(type));
    if (!bytes.empty())
      std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
    values.push_back(host.to(torch::kFloat));
    used.insert(peft);
  }
  for (const auto& [name, info] : stored) {
    if (used.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.string(), ": unexpected tensor '", info->name,
                       "' (not an adapter of model.lora.targets: ",
                       model.config().lora.targets, ")"));
    }
  }
  model.LoadTrainable(values);
  return absl::OkStatus();
}

absl::Status ExportPeftAdapter(const PolicyModel& model,
                               const std::string& out_dir,
                               const std::string& base_model) {
  if (!model.lora()) {
    return absl::FailedPreconditionError(
        "export: the model has no LoRA adapters");
  }
  FUSIONRL_ASSIGN_OR_RETURN(const fs::path tmp_dir, FreshTmpDir(out_dir));
  std::vector<at::Tensor> host;
  std::vector<StTensorView> views;
  for (const auto& [name, param] : model.named_trainable_parameters()) {
    FUSIONRL_ASSIGN_OR_RETURN(std::string peft, PeftTensorName(name));
    at::Tensor t =
        param.detach().to(torch::kCPU).to(torch::kFloat).contiguous();
    StTensorView v;
    v.name = peft;
    v.dtype = StDtype::kF32;
    v.shape = t.sizes().vec();
    v.data = t.data_ptr();
    v.bytes = static_cast<size_t>(t.nbytes());
    views.push_back(std::move(v));
    host.push_back(std::move(t));
  }
  FUSIONRL_RETURN_IF_ERROR(
      WriteSafetensors((tmp_dir / "adapter_model.safetensors").string(), views,
                       {{"format", "pt"}}));
  FUSIONRL_RETURN_IF_ERROR(
      WriteFileAtomic((tmp_dir / "adapter_config.json").string(),
                      PeftAdapterConfigJson(model.config().lora, base_model)));
  return MoveDirIntoPlace(tmp_dir, out_dir);
}

}  // namespace fusionrl
