#include "core/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

using Json = nlohmann::json;

constexpr const char* kArchitectures[] = {
    "LlamaForCausalLM",   "Qwen2ForCausalLM",    "Qwen3ForCausalLM",
    "MistralForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM"};

absl::StatusOr<Json> ReadJsonFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path.string(), ": cannot open (no such file?)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": expected a JSON object"));
  }
  return j;
}

// Typed reads of config.json keys with errors naming file and key.
class Fields {
 public:
  Fields(const Json& j, std::string file) : j_(j), file_(std::move(file)) {}

  bool Has(const char* key) const {
    return j_.contains(key) && !j_[key].is_null();
  }

  absl::StatusOr<int> Int(const char* key, std::optional<int> fallback) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return Missing(key);
    }
    const Json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > (int64_t{1} << 31) - 1) {
      return Bad(key, "expected a non-negative integer", v);
    }
    return v.get<int>();
  }

  absl::StatusOr<double> Number(const char* key,
                                std::optional<double> fallback) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return Missing(key);
    }
    const Json& v = j_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      return Bad(key, "expected a number", v);
    }
    return v.get<double>();
  }

  absl::StatusOr<bool> Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    const Json& v = j_[key];
    if (!v.is_boolean()) return Bad(key, "expected true or false", v);
    return v.get<bool>();
  }

  absl::StatusOr<std::string> String(const char* key,
                                     std::string fallback) const {
    if (!Has(key)) return fallback;
    const Json& v = j_[key];
    if (!v.is_string()) return Bad(key, "expected a string", v);
    return v.get<std::string>();
  }

  absl::Status Unsupported(const char* key, const std::string& why) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": ", key, ": ", why));
  }

  absl::Status Bad(const char* key, const char* want, const Json& v) const {
    std::string shown = v.dump();
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": ", key, ": ", want, ", got ", shown));
  }

  const std::string& file() const { return file_; }

  absl::Status Missing(const char* key) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": ", key, ": required key is missing"));
  }

 private:
  const Json& j_;
  std::string file_;
};

#define HF_ASSIGN(lhs, expr)                        \
  do {                                              \
    auto hf_value_ = (expr);                        \
    if (!hf_value_.ok()) return hf_value_.status(); \
    lhs = *std::move(hf_value_);                    \
  } while (0)

absl::StatusOr<std::vector<int>> EosIds(const Json& j, const Fields& f,
                                        const char* key) {
  std::vector<int> ids;
  if (!f.Has(key)) return ids;
  const Json& v = j[key];
  if (v.is_number_integer()) {
    ids.push_back(v.get<int>());
    return ids;
  }
  if (v.is_array()) {
    for (const Json& e : v) {
      if (!e.is_number_integer()) {
        return f.Bad(key, "expected an integer or a list of integers", v);
      }
      ids.push_back(e.get<int>());
    }
    return ids;
  }
  return f.Bad(key, "expected an integer or a list of integers", v);
}

// One rope settings object: transformers v4's `rope_scaling`, or v5's
// `rope_parameters` (which also holds rope_theta). `key` names it in
// messages. The type comes from rope_type (or v4's older `type`); default
// is no scaling; linear and llama3 are read; any other (yarn, dynamic,
// longrope, ...) is refused by name.
absl::Status ReadRopeObject(const Json& r, const Fields& f, const char* key,
                            RopeScalingConfig* out) {
  *out = RopeScalingConfig{};
  if (!r.is_object()) return f.Bad(key, "expected an object or null", r);
  std::string type;
  if (r.contains("rope_type") && r["rope_type"].is_string()) {
    type = r["rope_type"].get<std::string>();
  } else if (r.contains("type") && r["type"].is_string()) {
    type = r["type"].get<std::string>();
  } else {
    return f.Bad(key, "expected a rope_type", r);
  }
  const Fields rf(r, absl::StrCat(f.file(), ": ", key));
  if (type == "default") return absl::OkStatus();
  if (type != "linear" && type != "llama3") {
    return f.Unsupported(
        key, absl::StrCat("rope type '", type,
                          "' is not supported (default, linear and llama3 "
                          "are)"));
  }
  out->type = type;
  auto factor = rf.Number("factor", std::nullopt);
  if (!factor.ok()) return factor.status();
  if (!(*factor > 0)) return f.Bad(key, "expected factor > 0", r);
  out->factor = *factor;
  if (type == "llama3") {
    auto low = rf.Number("low_freq_factor", std::nullopt);
    if (!low.ok()) return low.status();
    auto high = rf.Number("high_freq_factor", std::nullopt);
    if (!high.ok()) return high.status();
    auto orig = rf.Int("original_max_position_embeddings", std::nullopt);
    if (!orig.ok()) return orig.status();
    if (!(*high > *low) || *low <= 0 || *orig <= 0) {
      return f.Bad(key,
                   "expected 0 < low_freq_factor < high_freq_factor and "
                   "original_max_position_embeddings > 0",
                   r);
    }
    out->low_freq_factor = *low;
    out->high_freq_factor = *high;
    out->original_max_position_embeddings = *orig;
  }
  return absl::OkStatus();
}

bool SameRope(const RopeScalingConfig& a, const RopeScalingConfig& b) {
  return a.type == b.type && a.factor == b.factor &&
         a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position_embeddings ==
             b.original_max_position_embeddings;
}

// rope_theta and the rotary scaling, from either form transformers writes:
// v4's top-level rope_theta and rope_scaling, or v5's rope_parameters
// {rope_type, rope_theta, ...}. Where a file holds both forms they must
// agree: silently taking one would train a different model than the
// file's authors describe.
absl::Status ReadRope(const Json& j, const Fields& f, double default_theta,
                      ModelConfig* m) {
  auto theta = f.Number("rope_theta", default_theta);
  if (!theta.ok()) return theta.status();
  m->rope_theta = *theta;
  RopeScalingConfig v4;
  if (f.Has("rope_scaling")) {
    FUSIONRL_RETURN_IF_ERROR(
        ReadRopeObject(j["rope_scaling"], f, "rope_scaling", &v4));
  }
  m->rope_scaling = v4;
  if (!f.Has("rope_parameters")) return absl::OkStatus();
  const Json& p = j["rope_parameters"];
  if (p.is_object() && !p.contains("rope_type") && !p.contains("type") &&
      !p.empty() && p.begin()->is_object()) {
    return f.Unsupported(
        "rope_parameters",
        "rope parameters per layer type (an object of objects) are not "
        "supported; one set for every layer is");
  }
  RopeScalingConfig v5;
  FUSIONRL_RETURN_IF_ERROR(ReadRopeObject(p, f, "rope_parameters", &v5));
  const Fields pf(p, absl::StrCat(f.file(), ": rope_parameters"));
  auto v5_theta = pf.Number("rope_theta", *theta);
  if (!v5_theta.ok()) return v5_theta.status();
  if (f.Has("rope_theta") && *v5_theta != *theta) {
    return f.Unsupported(
        "rope_theta",
        absl::StrCat(*theta, " differs from rope_parameters.rope_theta (",
                     *v5_theta, ")"));
  }
  if (f.Has("rope_scaling") && !SameRope(v4, v5)) {
    return f.Unsupported("rope_scaling",
                         "differs from rope_parameters (rope type '" + v4.type +
                             "' against '" + v5.type + "')");
  }
  m->rope_theta = *v5_theta;
  m->rope_scaling = v5;
  return absl::OkStatus();
}

// The sparse feed-forward of Qwen3MoeForCausalLM and MixtralForCausalLM:
// every layer routed (a dense layer between them is refused), softmax
// router, top-k, gates renormalised (norm_topk_prob; Mixtral always) or the
// probabilities themselves: model.moe_gates auto where that is auto's rule
// for k, else named.
absl::Status ReadMoe(const Json& j, const Fields& f, const std::string& arch,
                     ModelConfig* m) {
  const bool qwen3_moe = arch == "Qwen3MoeForCausalLM";
  int experts = 0, top_k = 0;
  bool normalise = true;
  const char* experts_key = qwen3_moe ? "num_experts" : "num_local_experts";
  // Defaults as Qwen3MoeConfig's / MixtralConfig's.
  HF_ASSIGN(experts, f.Int(experts_key, qwen3_moe ? 128 : 8));
  HF_ASSIGN(top_k, f.Int("num_experts_per_tok", qwen3_moe ? 8 : 2));
  if (experts < 2 || experts > 128) {
    return f.Unsupported(
        experts_key,
        absl::StrCat("must be in [2, 128] (a rollout records each token's "
                     "experts in one byte), got ",
                     experts));
  }
  if (top_k < 1 || top_k > 8 || top_k > experts) {
    return f.Unsupported(
        "num_experts_per_tok",
        absl::StrCat("must be in [1, 8] and at most ", experts_key, " (",
                     experts, "), got ", top_k));
  }
  if (qwen3_moe) {
    HF_ASSIGN(normalise, f.Bool("norm_topk_prob", false));
    HF_ASSIGN(m->moe_d_ff, f.Int("moe_intermediate_size", 768));
    if (m->moe_d_ff < 1) {
      return f.Unsupported("moe_intermediate_size", "must be >= 1");
    }
    int step = 1;
    HF_ASSIGN(step, f.Int("decoder_sparse_step", 1));
    if (step != 1) {
      return f.Unsupported(
          "decoder_sparse_step",
          absl::StrCat("must be 1 (every layer a mixture of experts; dense "
                       "layers between them are not supported), got ",
                       step));
    }
    if (f.Has("mlp_only_layers") &&
        !(j["mlp_only_layers"].is_array() && j["mlp_only_layers"].empty())) {
      return f.Unsupported("mlp_only_layers",
                           "must be empty (every layer a mixture of experts; "
                           "dense layers between them are not supported)");
    }
  } else {
    // Mixtral: intermediate_size is each expert's width; the top-k
    // probabilities are always renormalised.
    m->moe_d_ff = 0;
    double jitter = 0;
    HF_ASSIGN(jitter, f.Number("router_jitter_noise", 0.0));
    if (jitter != 0) {
      return f.Unsupported("router_jitter_noise",
                           "must be 0 (the router's training noise is not "
                           "supported)");
    }
  }
  m->moe_gates =
      normalise == RouterRenormalises(MoeGates::kAuto, top_k)
          ? MoeGates::kAuto
          : (normalise ? MoeGates::kRenormalised : MoeGates::kProbabilities);
  m->moe_experts = experts;
  m->moe_top_k = top_k;
  return absl::OkStatus();
}

// config.json's one architecture, which must be one FusionRL builds.
absl::Status ReadArchitecture(const Json& j, const Fields& f, ModelConfig* m) {
  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].size() != 1 || !j["architectures"][0].is_string()) {
    return f.Bad("architectures", "expected a list of one name",
                 j.value("architectures", Json()));
  }
  m->architecture = j["architectures"][0].get<std::string>();
  bool known = false;
  for (const char* a : kArchitectures) known = known || m->architecture == a;
  if (!known) {
    return f.Unsupported(
        "architectures",
        absl::StrCat("'", m->architecture, "' is not supported (",
                     absl::StrJoin(kArchitectures, ", "), " are)"));
  }
  return absl::OkStatus();
}

// The activation and the sizes: vocabulary, layers, heads, head_dim (each
// architecture's default where the key is missing), feed-forward.
absl::Status ReadShape(const Fields& f, ModelConfig* m) {
  const std::string& arch = m->architecture;
  std::string act;
  HF_ASSIGN(act, f.String("hidden_act", "silu"));
  if (act != "silu") {
    return f.Unsupported(
        "hidden_act",
        absl::StrCat("activation '", act, "' is not supported (silu is)"));
  }
  HF_ASSIGN(m->vocab_size, f.Int("vocab_size", std::nullopt));
  HF_ASSIGN(m->d_model, f.Int("hidden_size", std::nullopt));
  HF_ASSIGN(m->n_layers, f.Int("num_hidden_layers", std::nullopt));
  HF_ASSIGN(m->n_heads, f.Int("num_attention_heads", std::nullopt));
  HF_ASSIGN(m->n_kv_heads, f.Int("num_key_value_heads", m->n_heads));
  HF_ASSIGN(m->d_ff, f.Int("intermediate_size", std::nullopt));
  if (m->vocab_size < 1 || m->d_model < 1 || m->n_layers < 1 ||
      m->n_heads < 1 || m->n_kv_heads < 1 || m->d_ff < 1) {
    return f.Unsupported("hidden_size",
                         "sizes (vocab_size, hidden_size, num_hidden_layers, "
                         "num_attention_heads, num_key_value_heads, "
                         "intermediate_size) must be >= 1");
  }
  // Each architecture's own default where config.json has no head_dim:
  // Qwen3Config's is 128 (not hidden_size / heads); Llama's, Mistral's,
  // Mixtral's and Qwen3-MoE's fall back to hidden_size / heads.
  const int default_head_dim =
      arch == "Qwen3ForCausalLM" ? 128 : m->d_model / m->n_heads;
  // Qwen2's modeling code always uses hidden_size / num_attention_heads.
  if (arch == "Qwen2ForCausalLM") {
    m->head_dim = default_head_dim;
  } else {
    HF_ASSIGN(m->head_dim, f.Int("head_dim", default_head_dim));
  }
  if (m->n_heads % m->n_kv_heads != 0) {
    return f.Unsupported(
        "num_key_value_heads",
        absl::StrCat("num_attention_heads (", m->n_heads,
                     ") must be a multiple of num_key_value_heads (",
                     m->n_kv_heads, ")"));
  }
  if (m->head_dim < 2 || m->head_dim % 2 != 0) {
    return f.Unsupported(
        "head_dim",
        absl::StrCat("must be even for rotary embeddings, got ", m->head_dim));
  }
  return absl::OkStatus();
}

// Rotary embeddings, the norm, tied embeddings and the scalars HfModelInfo
// carries besides the model (context length, dtype, bos token).
absl::Status ReadRopeAndScalars(const Json& j, const Fields& f,
                                HfModelInfo* info) {
  ModelConfig& m = info->model;
  // Without the key, the architecture's config class default (MixtralConfig
  // has 1e6, the others 10000).
  const double default_theta =
      m.architecture == "MixtralForCausalLM" ? 1e6 : 10000.0;
  if (auto s = ReadRope(j, f, default_theta, &m); !s.ok()) return s;
  HF_ASSIGN(m.norm_eps, f.Number("rms_norm_eps", 1e-6));
  HF_ASSIGN(m.tie_embeddings, f.Bool("tie_word_embeddings", false));
  HF_ASSIGN(info->max_position_embeddings, f.Int("max_position_embeddings", 0));
  HF_ASSIGN(info->torch_dtype, f.String("torch_dtype", ""));
  HF_ASSIGN(info->bos_token_id, f.Int("bos_token_id", -1));
  return absl::OkStatus();
}

// What would change the function and FusionRL does not build: biases
// beyond Qwen2's q/k/v, sliding-window attention.
absl::Status RefuseUnsupportedLayers(const Fields& f, const std::string& arch) {
  bool attention_bias = false, mlp_bias = false, sliding = false;
  HF_ASSIGN(attention_bias, f.Bool("attention_bias", false));
  HF_ASSIGN(mlp_bias, f.Bool("mlp_bias", false));
  HF_ASSIGN(sliding, f.Bool("use_sliding_window", false));
  if (attention_bias) {
    return f.Unsupported("attention_bias",
                         "biases on all attention projections are not "
                         "supported (only Qwen2's q/k/v biases are)");
  }
  if (mlp_bias) {
    return f.Unsupported("mlp_bias", "MLP biases are not supported");
  }
  if (sliding) {
    return f.Unsupported("use_sliding_window",
                         "sliding-window attention is not supported");
  }
  if ((arch == "MistralForCausalLM" || arch == "MixtralForCausalLM") &&
      f.Has("sliding_window")) {
    return f.Unsupported("sliding_window",
                         "sliding-window attention is not supported (set it "
                         "to null if the model never needs it)");
  }
  return absl::OkStatus();
}

// config.json's eos ids; generation_config.json's list and bos id win.
absl::Status ReadSpecialTokens(const Json& j, const Fields& f,
                               const std::filesystem::path& dir,
                               HfModelInfo* info) {
  namespace fs = std::filesystem;
  HF_ASSIGN(info->eos_token_ids, EosIds(j, f, "eos_token_id"));
  const fs::path gen_path = dir / "generation_config.json";
  if (fs::exists(gen_path)) {
    auto gen = ReadJsonFile(gen_path);
    if (!gen.ok()) return gen.status();
    const Fields gf(*gen, gen_path.string());
    std::vector<int> ids;
    HF_ASSIGN(ids, EosIds(*gen, gf, "eos_token_id"));
    if (!ids.empty()) info->eos_token_ids = ids;
    if (gf.Has("bos_token_id")) {
      HF_ASSIGN(info->bos_token_id, gf.Int("bos_token_id", -1));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsMoeArchitecture(const std::string& architecture) {
  return architecture == "Qwen3MoeForCausalLM" ||
         architecture == "MixtralForCausalLM";
}

bool HasQkNorm(const std::string& architecture) {
  return architecture == "Qwen3ForCausalLM" ||
         architecture == "Qwen3MoeForCausalLM";
}

absl::StatusOr<HfModelInfo> ReadHfModelConfig(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(dir) / "config.json";
  FUSIONRL_ASSIGN_OR_RETURN(const Json j, ReadJsonFile(path));
  const Fields f(j, path.string());
  HfModelInfo info;
  ModelConfig& m = info.model;
  FUSIONRL_RETURN_IF_ERROR(ReadArchitecture(j, f, &m));
  const std::string arch = m.architecture;
  FUSIONRL_RETURN_IF_ERROR(ReadShape(f, &m));
  FUSIONRL_RETURN_IF_ERROR(ReadRopeAndScalars(j, f, &info));
  FUSIONRL_RETURN_IF_ERROR(RefuseUnsupportedLayers(f, arch));
  m.qkv_bias = arch == "Qwen2ForCausalLM";
  m.qk_norm = HasQkNorm(arch);
  if (IsMoeArchitecture(arch)) {
    FUSIONRL_RETURN_IF_ERROR(ReadMoe(j, f, arch, &m));
  }
  FUSIONRL_RETURN_IF_ERROR(ReadSpecialTokens(j, f, fs::path(dir), &info));
  return info;
}

absl::StatusOr<PeftAdapterInfo> ReadPeftAdapterConfig(const std::string& dir) {
  const std::filesystem::path path =
      std::filesystem::path(dir) / "adapter_config.json";
  FUSIONRL_ASSIGN_OR_RETURN(Json j, ReadJsonFile(path));
  const std::string file = path.string();
  auto bad = [&](const char* key, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": '", key, "': ", why));
  };
  if (!j.contains("peft_type") || !j["peft_type"].is_string() ||
      j["peft_type"].get<std::string>() != "LORA") {
    return bad("peft_type", "must be \"LORA\" (a PEFT LoRA adapter)");
  }
  PeftAdapterInfo info;
  if (!j.contains("r") || !j["r"].is_number_integer() ||
      j["r"].get<int64_t>() < 1 || j["r"].get<int64_t>() > (1 << 20)) {
    return bad("r", "expected a rank >= 1");
  }
  info.lora.rank = j["r"].get<int>();
  if (j.contains("lora_alpha") && !j["lora_alpha"].is_null()) {
    if (!j["lora_alpha"].is_number() || j["lora_alpha"].get<double>() <= 0) {
      return bad("lora_alpha", "expected a number > 0");
    }
    info.lora.alpha = j["lora_alpha"].get<double>();
  } else {
    info.lora.alpha = 8;  // PEFT's default
  }
  if (j.contains("lora_dropout") && !j["lora_dropout"].is_null()) {
    const Json& d = j["lora_dropout"];
    if (!d.is_number() || d.get<double>() < 0 || d.get<double>() >= 1) {
      return bad("lora_dropout", "expected a number in [0, 1)");
    }
    info.lora.dropout = d.get<double>();
  }
  std::string targets;
  const Json& t = j.contains("target_modules") ? j["target_modules"] : Json();
  if (t.is_string()) {
    targets = t.get<std::string>();
  } else if (t.is_array()) {
    for (const Json& item : t) {
      if (!item.is_string()) return bad("target_modules", "expected strings");
      absl::StrAppend(&targets, targets.empty() ? "" : ",",
                      item.get<std::string>());
    }
  } else {
    return bad("target_modules", "expected a list of module names");
  }
  absl::StatusOr<std::vector<std::string>> names = ParseLoraTargets(targets);
  if (!names.ok()) {
    return bad("target_modules", std::string(names.status().message()));
  }
  info.lora.targets = absl::StrJoin(*names, ",");
  if (j.contains("bias") && j["bias"].is_string() &&
      j["bias"].get<std::string>() != "none") {
    return bad("bias", "only \"none\" is supported");
  }
  for (const char* key : {"use_dora", "use_rslora"}) {
    if (j.contains(key) && j[key].is_boolean() && j[key].get<bool>()) {
      return bad(key, "not supported (plain LoRA only)");
    }
  }
  // Per-module overrides of lora_alpha / r (PEFT scales a module matching a
  // pattern by its own alpha / r): every adapter here has one rank and one
  // scale, so a non-empty map would be applied wrongly.
  for (const char* key : {"alpha_pattern", "rank_pattern"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_object()) return bad(key, "expected a map");
    if (!j[key].empty()) {
      return bad(key, absl::StrCat(
                          "per-module ", key[0] == 'a' ? "lora_alpha" : "r",
                          " overrides (", j[key].dump(),
                          ") are not supported: every adapter takes r and "
                          "lora_alpha (merge the adapter, or retrain it "
                          "without them)"));
    }
  }
  if (j.contains("modules_to_save") && !j["modules_to_save"].is_null() &&
      !(j["modules_to_save"].is_array() && j["modules_to_save"].empty())) {
    return bad("modules_to_save", "not supported (adapters only)");
  }
  if (j.contains("base_model_name_or_path") &&
      j["base_model_name_or_path"].is_string()) {
    info.base_model = j["base_model_name_or_path"].get<std::string>();
  }
  return info;
}

std::string PeftAdapterConfigJson(const LoraConfig& lora,
                                  const std::string& base_model) {
  Json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["r"] = lora.rank;
  j["lora_alpha"] = lora.alpha;
  j["lora_dropout"] = lora.dropout;
  std::vector<std::string> targets;
  if (auto names = ParseLoraTargets(lora.targets); names.ok()) {
    targets = *names;
  }
  j["target_modules"] = targets;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["use_rslora"] = false;
  j["use_dora"] = false;
  j["modules_to_save"] = nullptr;
  j["base_model_name_or_path"] = base_model;
  j["revision"] = nullptr;
  return j.dump(2) + "\n";
}

}  // namespace fusionrl
