// Hugging Face model directories: config.json and generation_config.json
// read into FusionRL's ModelConfig, and written back for export.
//
// Supported architectures: LlamaForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM and MistralForCausalLM (without a sliding window), and
// the mixtures of experts Qwen3MoeForCausalLM and MixtralForCausalLM. What
// they need is exact (docs/models.md): grouped-query attention, head_dim,
// rotary in the rotate-half convention with rope_theta and rope_scaling
// (linear, llama3), tie_word_embeddings, q/k/v bias (Qwen2), q/k RMSNorm
// (Qwen3, Qwen3-MoE), rms_norm_eps, SiLU; for MoE a softmax router, top-k,
// gates renormalised for k >= 2, every layer sparse (docs/moe.md). Anything
// else that changes the function (another activation, rope type, sliding
// window, attention or MLP biases of another shape, dense layers among the
// sparse ones, unnormalised top-k gates) is refused by name rather than
// approximated.
//
// Torch-free: the controller and the config layer use it.
#ifndef FUSIONRL_CORE_HF_CONFIG_H_
#define FUSIONRL_CORE_HF_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fusionrl/config.h"

namespace fusionrl {

struct HfModelInfo {
  // The [arch] fields of ModelConfig (architecture, vocab_size, d_model,
  // n_layers, n_heads, n_kv_heads, head_dim, d_ff, rope_theta,
  // rope_scaling, norm_eps, qkv_bias, qk_norm, tie_embeddings); the others
  // keep their defaults.
  ModelConfig model;
  int max_position_embeddings = 0;  // 0 when config.json has none
  std::string torch_dtype;          // as stored ("" when absent)
  int bos_token_id = -1;            // -1 when absent
  // generation_config.json's eos_token_id (a number or a list), else
  // config.json's; may be empty.
  std::vector<int> eos_token_ids;
};

// Reads <dir>/config.json (and <dir>/generation_config.json when present).
// NotFound when config.json is missing; InvalidArgument naming the file and
// the key for a malformed or unsupported config.
absl::StatusOr<HfModelInfo> ReadHfModelConfig(const std::string& dir);

// The config.json that ReadHfModelConfig reads back as `model` (pretty
// JSON text). max_position_embeddings: the context the model supports (the
// imported model's); 0 = model.max_seq_len, the context it was trained at.
// `model.architecture` "" is written as LlamaForCausalLM; InvalidArgument when
// the model has features its architecture cannot express (e.g. q/k norm in a
// Llama).
absl::StatusOr<std::string> HfConfigJson(const ModelConfig& model,
                                         int vocab_size, int bos_token_id,
                                         const std::vector<int>& eos_ids,
                                         const std::string& torch_dtype,
                                         int max_position_embeddings = 0);

// A PEFT LoRA adapter directory's adapter_config.json: peft_type LORA, r,
// lora_alpha, lora_dropout, target_modules (a list, a string or
// "all-linear"), base_model_name_or_path. NotFound when the file is missing;
// InvalidArgument naming the file and the key otherwise (another peft_type,
// a target FusionRL does not adapt, bias != "none", use_dora, use_rslora,
// modules_to_save, a non-empty alpha_pattern or rank_pattern).
struct PeftAdapterInfo {
  LoraConfig lora;  // targets comma-joined in kLoraTargetNames order
  std::string base_model;
};
absl::StatusOr<PeftAdapterInfo> ReadPeftAdapterConfig(const std::string& dir);

// adapter_config.json for `lora` (pretty JSON text).
std::string PeftAdapterConfigJson(const LoraConfig& lora,
                                  const std::string& base_model);

// Facts of the supported architectures, shared by import, export and the
// config's validation: the mixtures of experts (Qwen3-MoE, Mixtral) and
// those with per-head q/k RMSNorm (Qwen3, Qwen3-MoE). The router's gate rule,
// which an HF MoE config names with norm_topk_prob, is model.moe_gates
// (RouterRenormalises, fusionrl/config.h).
bool IsMoeArchitecture(const std::string& architecture);
bool HasQkNorm(const std::string& architecture);

// OK when HfConfigJson can write `model` as its architecture; otherwise
// InvalidArgument saying what the architecture cannot express (a MoE policy
// under a dense architecture, MoGE groups, a shared expert, ...). Torch-free,
// so a job's config is checked before it trains (run.export_final).
absl::Status HfExportable(const ModelConfig& model);

// The names of the [arch] keys, for error messages and docs.
const std::vector<std::string>& ArchitectureKeys();

// True when the [arch] fields of `a` and `b` are equal.
bool SameArchitecture(const ModelConfig& a, const ModelConfig& b);

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_HF_CONFIG_H_
