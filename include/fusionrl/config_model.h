// A section of the job configuration: the policy model (model.*: shape, rope,
// LoRA, mixture of experts, activations).
// Include fusionrl/config.h, which holds every section and the functions
// that load and validate a job.
#ifndef FUSIONRL_CONFIG_MODEL_H_
#define FUSIONRL_CONFIG_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fusionrl/activation_config.h"

namespace fusionrl {

// Rotary position scaling (Hugging Face `rope_scaling`).
//   none:   plain rotary.
//   linear: positions divided by `factor` (every frequency / factor).
//   llama3: Llama 3.1's frequency-dependent scaling: wavelengths shorter
//           than original_max_position_embeddings / high_freq_factor are
//           kept, longer than .. / low_freq_factor divided by `factor`,
//           smoothly interpolated in between.
struct RopeScalingConfig {
  std::string type = "none";                    // none | linear | llama3
  double factor = 1.0;                          // linear, llama3: > 0
  double low_freq_factor = 1.0;                 // llama3
  double high_freq_factor = 4.0;                // llama3: > low_freq_factor
  int original_max_position_embeddings = 8192;  // llama3
};

// Decoder-only transformer (Llama style: RMSNorm, rotary, SwiGLU), with the
// variations of the Hugging Face architectures FusionRL imports
// (docs/models.md): grouped-query attention, a head size of its own, q/k/v
// biases (Qwen2), per-head q/k RMSNorm (Qwen3), tied embeddings and rotary
// scaling.
//
// With `hf_path` set, the architecture keys below (marked [arch]) come from
// the directory's config.json: each must be left at its default or equal the
// imported value, and a different value is an error naming both.
// model.attention_kernel (see ModelConfig).
enum class AttentionKernel { kFused, kComposite };
absl::StatusOr<AttentionKernel> ParseAttentionKernel(absl::string_view name);
const char* AttentionKernelName(AttentionKernel kernel);

// LoRA post-training (docs/models.md "LoRA"): the base weights are frozen
// and each targeted projection W gets a trainable low-rank update,
// W + (alpha / rank) * B A with A [rank, in] and B [out, rank], both float32
// whatever model.dtype is. The optimizer holds the adapters only; rollout
// samples from merged weights; weight syncs and checkpoints carry the
// adapters only.
struct LoraConfig {
  int rank = 0;        // r >= 1; 0 = no LoRA (full fine-tuning)
  double alpha = 16;   // the update is scaled by alpha / rank
  double dropout = 0;  // on the adapter's input, training forwards only
  // Comma-separated Hugging Face projection names (a YAML list reads too):
  // q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or
  // all-linear (all seven).
  std::string targets = "all-linear";
};

// The Hugging Face projection names LoRA can target, in layer order.
inline constexpr const char* kLoraTargetNames[] = {
    "q_proj",    "k_proj",  "v_proj",   "o_proj",
    "gate_proj", "up_proj", "down_proj"};
// model.lora.targets as names (all-linear expanded, in kLoraTargetNames
// order, duplicates removed); InvalidArgument naming an unknown one.
absl::StatusOr<std::vector<std::string>> ParseLoraTargets(
    absl::string_view targets);

// How a MoE token's k chosen router probabilities become its combine
// weights (model.moe_gates): auto = the probability itself for k = 1
// (Switch) and renormalised to sum to 1 for k >= 2 (GShard, Mixtral);
// renormalised = always (k = 1: a gate of 1; Hugging Face's
// norm_topk_prob true); probabilities = never (norm_topk_prob false, as
// Qwen3MoeConfig's default, Qwen2-MoE and OLMoE).
enum class MoeGates { kAuto, kRenormalised, kProbabilities };
absl::StatusOr<MoeGates> ParseMoeGates(absl::string_view name);
const char* MoeGatesName(MoeGates gates);
// Whether `gates` renormalises the chosen probabilities of a top-`top_k`
// router (auto resolved by k).
bool RouterRenormalises(MoeGates gates, int top_k);

struct ModelConfig {
  // A Hugging Face model directory (config.json, model.safetensors or a
  // sharded set with model.safetensors.index.json, tokenizer.json,
  // tokenizer_config.json, optional generation_config.json). Its weights are
  // the initial policy, its tokenizer the job's tokenizer. "" = a built-in
  // model initialised from `seed`.
  std::string hf_path;
  // [arch] "" (the built-in decoder) | LlamaForCausalLM | Qwen2ForCausalLM |
  // Qwen3ForCausalLM | MistralForCausalLM: the architecture a checkpoint is
  // exported as; set from config.json with hf_path, or by hand to train a
  // randomly initialised model of that architecture.
  std::string architecture;
  // Tokenizer directory (tokenizer.json + tokenizer_config.json); "" = the
  // hf_path's tokenizer, or the character tokenizer of the built-in tasks.
  std::string tokenizer;
  // Compute and parameter dtype: float32 | bfloat16. Stored weights of any
  // of F32/BF16/F16 are converted to it on load.
  std::string dtype = "float32";
  // Attention core of whole sequences (training, prefill; engine/
  // attention_kernels.h): fused = one CPU kernel per (sequence, head) for
  // forward and backward, keeping one log-sum-exp per query instead of the
  // probabilities, where it supports the policy (float32 on CPU), else
  // composite; composite = the reference ATen ops.
  AttentionKernel attention_kernel = AttentionKernel::kFused;
  int vocab_size = 0;           // [arch] embedding rows; 0 = the tokenizer's
  int d_model = 128;            // [arch] hidden width
  int n_layers = 4;             // [arch] transformer blocks
  int n_heads = 4;              // [arch] query heads
  int n_kv_heads = 0;           // [arch] key/value heads (GQA); 0 = n_heads
  int head_dim = 0;             // [arch] per-head size; 0 = d_model / n_heads
  int d_ff = 384;               // [arch] SwiGLU inner width
  int max_seq_len = 64;         // longest prompt + response, in tokens
  double rope_theta = 10000.0;  // [arch] rotary base
  RopeScalingConfig rope_scaling;  // [arch]
  double norm_eps = 1e-5;          // [arch] RMSNorm epsilon
  bool qkv_bias = false;           // [arch] biases on q/k/v projections
  bool qk_norm = false;            // [arch] per-head RMSNorm of q and k
  bool tie_embeddings = false;     // [arch] lm_head shares the embedding
  double init_std = 0.02;          // std of the normal init of linear weights
  // Mixture of experts: with moe_experts > 0 every block's feed-forward is a
  // routed MoE block (engine/model/moe.h) instead of one dense SwiGLU.
  int moe_experts = 0;  // N experts per block: 0 (dense) or 2..128
  int moe_top_k = 2;    // experts per token: 1..8, <= moe_experts
  // MoGE (Mixture of Grouped Experts, Pangu Pro MoE): the N experts are
  // split into G equal groups of consecutive experts and each token takes
  // its top (top_k / G) experts inside every group, so every group gets
  // exactly T * top_k / G assignments of T tokens. 1 = plain top-k.
  // REQUIRES with G > 1: N and top_k multiples of G.
  int moe_groups = 1;
  // Training forward only (rollout and evaluation are always dropless): each
  // expert takes at most ceil(capacity_factor * T * top_k / N) of the T
  // tokens of a forward call; assignments past that are dropped (the token
  // keeps its residual and the shared expert). 0 = dropless.
  double moe_capacity_factor = 0;
  double moe_aux_loss_coef = 0.01;       // load-balancing loss weight (Switch)
  double moe_z_loss_coef = 0.001;        // router z-loss weight (ST-MoE)
  bool moe_shared_expert = false;        // add one always-on SwiGLU expert
  int moe_d_ff = 0;                      // each expert's inner width; 0 = d_ff
  MoeGates moe_gates = MoeGates::kAuto;  // [arch] see MoeGates
  // Selective recompute / swap of activations (training forward only: a
  // no-grad forward keeps nothing anyway). Not part of the model's shape.
  ActivationConfig activations;
  // LoRA (see LoraConfig); off unless lora.rank > 0 or lora_path is set.
  LoraConfig lora;
  // A PEFT adapter directory (adapter_config.json +
  // adapter_model.safetensors) whose adapters the policy starts from; its
  // r, lora_alpha and target_modules set model.lora (keys set there too
  // must agree).
  std::string lora_path;
};

// Whether LoRA is on: model.lora.rank > 0 (set by lora_path too).
inline bool LoraEnabled(const ModelConfig& m) { return m.lora.rank > 0; }

}  // namespace fusionrl

#endif  // FUSIONRL_CONFIG_MODEL_H_
