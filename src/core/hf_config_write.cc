// The writing side of core/hf_config.h: config.json for an exported policy
// (HfConfigJson), what an architecture can express (HfExportable), and the
// [arch] keys' names and comparison.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/hf_config.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

const char* ModelType(const std::string& arch) {
  if (arch == "Qwen2ForCausalLM") return "qwen2";
  if (arch == "Qwen3ForCausalLM") return "qwen3";
  if (arch == "MistralForCausalLM") return "mistral";
  if (arch == "Qwen3MoeForCausalLM") return "qwen3_moe";
  if (arch == "MixtralForCausalLM") return "mixtral";
  return "llama";
}

}  // namespace

absl::StatusOr<std::string> HfConfigJson(const ModelConfig& m, int vocab_size,
                                         int bos_token_id,
                                         const std::vector<int>& eos_ids,
                                         const std::string& torch_dtype,
                                         int max_position_embeddings) {
  const std::string arch =
      m.architecture.empty() ? "LlamaForCausalLM" : m.architecture;
  const bool qwen2 = arch == "Qwen2ForCausalLM";
  const bool qwen3_moe = arch == "Qwen3MoeForCausalLM";
  const bool mixtral = arch == "MixtralForCausalLM";
  const bool qwen3 = HasQkNorm(arch);
  FUSIONRL_RETURN_IF_ERROR(HfExportable(m));
  const int head_dim = m.head_dim > 0 ? m.head_dim : m.d_model / m.n_heads;
  nlohmann::ordered_json j;
  j["architectures"] = {arch};
  j["model_type"] = ModelType(arch);
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = m.d_model;
  j["intermediate_size"] = m.d_ff;
  if (qwen3_moe) {
    j["num_experts"] = m.moe_experts;
    j["num_experts_per_tok"] = m.moe_top_k;
    j["moe_intermediate_size"] = m.moe_d_ff > 0 ? m.moe_d_ff : m.d_ff;
    j["norm_topk_prob"] = RouterRenormalises(m.moe_gates, m.moe_top_k);
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::ordered_json::array();
  }
  if (mixtral) {
    j["num_local_experts"] = m.moe_experts;
    j["num_experts_per_tok"] = m.moe_top_k;
    j["router_jitter_noise"] = 0.0;
  }
  if (qwen3_moe || mixtral) {
    // FusionRL trains with its own balance losses (model.moe_aux_loss_coef);
    // transformers adds its aux loss only with output_router_logits.
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = m.moe_aux_loss_coef;
  }
  j["num_hidden_layers"] = m.n_layers;
  j["num_attention_heads"] = m.n_heads;
  j["num_key_value_heads"] = m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads;
  if (!qwen2) j["head_dim"] = head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] =
      max_position_embeddings > 0 ? max_position_embeddings : m.max_seq_len;
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = m.rope_theta;
  if (m.rope_scaling.type == "none") {
    j["rope_scaling"] = nullptr;
  } else if (m.rope_scaling.type == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"},
                         {"factor", m.rope_scaling.factor}};
  } else {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", m.rope_scaling.factor},
                         {"low_freq_factor", m.rope_scaling.low_freq_factor},
                         {"high_freq_factor", m.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings",
                          m.rope_scaling.original_max_position_embeddings}};
  }
  j["tie_word_embeddings"] = m.tie_embeddings;
  if (!qwen2) j["attention_bias"] = false;
  if (arch == "LlamaForCausalLM") j["mlp_bias"] = false;
  if (qwen2 || qwen3) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  if (arch == "MistralForCausalLM" || mixtral) j["sliding_window"] = nullptr;
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_ids.size() == 1) j["eos_token_id"] = eos_ids[0];
  if (eos_ids.size() > 1) j["eos_token_id"] = eos_ids;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

absl::Status HfExportable(const ModelConfig& m) {
  const std::string arch =
      m.architecture.empty() ? "LlamaForCausalLM" : m.architecture;
  const bool moe_arch = IsMoeArchitecture(arch);
  const bool qwen2 = arch == "Qwen2ForCausalLM";
  if (m.qkv_bias != qwen2 || m.qk_norm != HasQkNorm(arch)) {
    return absl::InvalidArgumentError(
        absl::StrCat("export: ", arch, " cannot express this model (qkv_bias ",
                     m.qkv_bias ? "true" : "false", ", qk_norm ",
                     m.qk_norm ? "true" : "false",
                     "); set model.architecture to the matching one"));
  }
  const int head_dim = m.head_dim > 0 ? m.head_dim : m.d_model / m.n_heads;
  if (qwen2 && head_dim * m.n_heads != m.d_model) {
    return absl::InvalidArgumentError(
        "export: Qwen2ForCausalLM needs head_dim == hidden_size / heads");
  }
  if (m.moe_experts > 0 && !moe_arch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "export: a mixture-of-experts policy needs model.architecture "
        "Qwen3MoeForCausalLM or MixtralForCausalLM (",
        arch, " is dense)"));
  }
  if (moe_arch && m.moe_experts == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "export: ", arch, " is a mixture of experts; set model.moe_experts"));
  }
  if (!moe_arch) return absl::OkStatus();
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("export: ", arch, " cannot express ", why));
  };
  if (m.moe_groups > 1) {
    return refuse("MoGE grouped routing (model.moe_groups > 1)");
  }
  if (m.moe_shared_expert) {
    return refuse("a shared expert (model.moe_shared_expert)");
  }
  if (arch == "MixtralForCausalLM") {
    if (!RouterRenormalises(m.moe_gates, m.moe_top_k)) {
      return refuse(
          "gates that are the router's probabilities themselves (Mixtral "
          "renormalises the chosen ones; model.moe_gates renormalised, or "
          "auto with k >= 2); use Qwen3MoeForCausalLM");
    }
    if (m.moe_d_ff > 0 && m.moe_d_ff != m.d_ff) {
      return refuse(
          "experts narrower than model.d_ff (its experts are "
          "intermediate_size wide); leave model.moe_d_ff 0");
    }
  }
  return absl::OkStatus();
}

const std::vector<std::string>& ArchitectureKeys() {
  static const std::vector<std::string> keys = {
      "architecture", "vocab_size",     "d_model",     "n_layers",
      "n_heads",      "n_kv_heads",     "head_dim",    "d_ff",
      "rope_theta",   "rope_scaling",   "norm_eps",    "qkv_bias",
      "qk_norm",      "tie_embeddings", "moe_experts", "moe_top_k",
      "moe_d_ff",     "moe_gates"};
  return keys;
}

bool SameArchitecture(const ModelConfig& a, const ModelConfig& b) {
  const auto& ra = a.rope_scaling;
  const auto& rb = b.rope_scaling;
  return a.architecture == b.architecture && a.vocab_size == b.vocab_size &&
         a.d_model == b.d_model && a.n_layers == b.n_layers &&
         a.n_heads == b.n_heads && a.n_kv_heads == b.n_kv_heads &&
         a.head_dim == b.head_dim && a.d_ff == b.d_ff &&
         a.rope_theta == b.rope_theta && a.norm_eps == b.norm_eps &&
         a.qkv_bias == b.qkv_bias && a.qk_norm == b.qk_norm &&
         a.tie_embeddings == b.tie_embeddings &&
         a.moe_experts == b.moe_experts && a.moe_top_k == b.moe_top_k &&
         (a.moe_experts == 0 ||
          RouterRenormalises(a.moe_gates, a.moe_top_k) ==
              RouterRenormalises(b.moe_gates, b.moe_top_k)) &&
         a.moe_d_ff == b.moe_d_ff && ra.type == rb.type &&
         ra.factor == rb.factor && ra.low_freq_factor == rb.low_freq_factor &&
         ra.high_freq_factor == rb.high_freq_factor &&
         ra.original_max_position_embeddings ==
             rb.original_max_position_embeddings;
}

}  // namespace fusionrl
