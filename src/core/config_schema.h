// The schema of a job config: every key of JobConfig with its rule, bound
// once in VisitJob() and walked by the three visitors that read YAML into a
// JobConfig (config_reader.cc), check it (config_validation.cc) and write it
// back as YAML (config_emitter.cc); plus the one-line error they share.
//
// Private to fusionrl_core (the public API is fusionrl/config.h). No
// yaml-cpp here: only the reader and the emitter see YAML.
#ifndef FUSIONRL_CORE_CONFIG_SCHEMA_H_
#define FUSIONRL_CORE_CONFIG_SCHEMA_H_

#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "fusionrl/config.h"

namespace fusionrl::config_internal {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------
// Field rules. Each field is bound once, with its rule, in VisitJob(); the
// reader and the emitter ignore the rules, the validator applies them.
// Enum fields (v.Enum) carry their parse and name functions instead: the
// reader parses the YAML spelling once, the emitter writes the name back.

// The interval a number must lie in; the bounds are inclusive unless open.
struct NumRule {
  double lo = -kInf;
  double hi = kInf;
  bool lo_open = false;
  bool hi_open = false;
};

inline NumRule AtLeast(double lo) { return {lo, kInf, false, false}; }
inline NumRule Above(double lo) { return {lo, kInf, true, false}; }
inline NumRule Closed(double lo, double hi) { return {lo, hi, false, false}; }
inline NumRule ClosedOpen(double lo, double hi) {
  return {lo, hi, false, true};
}
inline NumRule OpenClosed(double lo, double hi) {
  return {lo, hi, true, false};
}

struct StrRule {
  bool non_empty = false;
  bool device = false;         // ^(cpu|cuda(:[0-9]+)?|mps)$
  bool existing_file = false;  // must name an existing path when non-empty
  absl::Span<const absl::string_view> one_of;  // empty = anything
  bool list = false;  // a YAML sequence of scalars reads comma-joined
};

inline StrRule AnyString() { return {}; }
inline StrRule StringList() { return {false, false, false, {}, true}; }
inline StrRule NonEmpty() { return {true, false, false, {}}; }
inline StrRule Device() { return {true, true, false, {}}; }
inline StrRule ExistingFile() { return {false, false, true, {}}; }
inline StrRule OneOf(absl::Span<const absl::string_view> values) {
  return {false, false, false, values};
}

// 2^40 MiB = 1 EiB: any real budget, and its bytes still fit in int64.
inline constexpr double kMaxCardBudgetMib = 1099511627776.0;

// ---------------------------------------------------------------------------
// The schema: every key of JobConfig, in file order. `V` is one of Reader
// (config_reader.cc), Emitter (config_emitter.cc), Validator
// (config_validation.cc). Sections call v.Section(key, body).

template <class V>
void VisitActivations(ActivationConfig& a, V& v) {
  v.Enum("policy", &a.policy, ParseActivationPolicy, ActivationPolicyName);
  // "" (the default) or an action; attention_core and mlp_act are refused a
  // swap with a clear message in CheckCrossField.
  for (auto [key, field] :
       {std::pair<const char*, SubBlockActivation*>{"attention", &a.attention},
        {"mlp", &a.mlp},
        {"norm", &a.norm},
        {"attention_core", &a.attention_core},
        {"mlp_act", &a.mlp_act}}) {
    v.Enum(key, field, ParseSubBlockActivation, SubBlockActivationName);
  }
  v.String("layers", &a.layers, AnyString());
  v.Double("budget_mib", &a.budget_mib, AtLeast(0));
}

template <class V>
void VisitRopeScaling(RopeScalingConfig& r, V& v) {
  static constexpr absl::string_view kTypes[] = {"none", "linear", "llama3"};
  v.String("type", &r.type, OneOf(kTypes));
  v.Double("factor", &r.factor, Above(0));
  v.Double("low_freq_factor", &r.low_freq_factor, Above(0));
  v.Double("high_freq_factor", &r.high_freq_factor, Above(0));
  v.Int("original_max_position_embeddings", &r.original_max_position_embeddings,
        AtLeast(1));
}

template <class V>
void VisitLora(LoraConfig& l, V& v) {
  v.Int("rank", &l.rank, AtLeast(0));
  v.Double("alpha", &l.alpha, Above(0));
  v.Double("dropout", &l.dropout, ClosedOpen(0, 1));
  v.String("targets", &l.targets, StringList());
}

template <class V>
void VisitModel(ModelConfig& m, V& v) {
  static constexpr absl::string_view kArchitectures[] = {"",
                                                         "LlamaForCausalLM",
                                                         "Qwen2ForCausalLM",
                                                         "Qwen3ForCausalLM",
                                                         "MistralForCausalLM",
                                                         "Qwen3MoeForCausalLM",
                                                         "MixtralForCausalLM"};
  static constexpr absl::string_view kDtypes[] = {"float32", "bfloat16"};
  v.String("hf_path", &m.hf_path, ExistingFile());
  v.String("architecture", &m.architecture, OneOf(kArchitectures));
  v.String("tokenizer", &m.tokenizer, ExistingFile());
  v.String("dtype", &m.dtype, OneOf(kDtypes));
  v.Enum("attention_kernel", &m.attention_kernel, ParseAttentionKernel,
         AttentionKernelName);
  v.Int("vocab_size", &m.vocab_size, AtLeast(0));
  v.Int("d_model", &m.d_model, AtLeast(8));
  v.Int("n_layers", &m.n_layers, AtLeast(1));
  v.Int("n_heads", &m.n_heads, AtLeast(1));
  v.Int("n_kv_heads", &m.n_kv_heads, AtLeast(0));
  v.Int("head_dim", &m.head_dim, AtLeast(0));
  v.Int("d_ff", &m.d_ff, AtLeast(1));
  v.Int("max_seq_len", &m.max_seq_len, AtLeast(2));
  v.Double("rope_theta", &m.rope_theta, Above(0));
  v.Section("rope_scaling", [&] { VisitRopeScaling(m.rope_scaling, v); });
  v.Double("norm_eps", &m.norm_eps, Above(0));
  v.Bool("qkv_bias", &m.qkv_bias);
  v.Bool("qk_norm", &m.qk_norm);
  v.Bool("tie_embeddings", &m.tie_embeddings);
  v.Double("init_std", &m.init_std, Above(0));
  // At most 128: a rollout records each token's experts in one byte.
  v.Int("moe_experts", &m.moe_experts, Closed(0, 128));
  v.Int("moe_top_k", &m.moe_top_k, Closed(1, 8));
  v.Int("moe_groups", &m.moe_groups, Closed(1, 128));
  v.Double("moe_capacity_factor", &m.moe_capacity_factor, AtLeast(0));
  v.Double("moe_aux_loss_coef", &m.moe_aux_loss_coef, AtLeast(0));
  v.Double("moe_z_loss_coef", &m.moe_z_loss_coef, AtLeast(0));
  v.Bool("moe_shared_expert", &m.moe_shared_expert);
  v.Int("moe_d_ff", &m.moe_d_ff, AtLeast(0));
  v.Enum("moe_gates", &m.moe_gates, ParseMoeGates, MoeGatesName);
  v.Section("activations", [&] { VisitActivations(m.activations, v); });
  v.Section("lora", [&] { VisitLora(m.lora, v); });
  v.String("lora_path", &m.lora_path, ExistingFile());
}

template <class V>
void VisitTask(TaskConfig& t, V& v) {
  v.String("name", &t.name, NonEmpty());
  v.Int64("seed", &t.seed, NumRule());
  v.Int("eval_size", &t.eval_size, AtLeast(1));
  v.Int("min_digits", &t.min_digits, Closed(1, 18));
  v.Int("max_digits", &t.max_digits, Closed(1, 18));
  v.Int("num_operands", &t.num_operands, Closed(2, 6));
  v.Int("max_operand", &t.max_operand, Closed(1, 1000));
  v.Double("long_fraction", &t.long_fraction, Closed(0, 1));
  v.Int("long_max", &t.long_max, Closed(1, 500));
  v.String("train_path", &t.train_path, ExistingFile());
  v.String("eval_path", &t.eval_path, ExistingFile());
  v.String("reward", &t.reward, AnyString());
  // "" (auto) or a format; checked with a clear message in CheckCrossField.
  v.String("chat_template", &t.chat_template, AnyString());
  v.String("system_prompt", &t.system_prompt, AnyString());
}

template <class V>
void VisitRollout(RolloutConfig& r, V& v) {
  v.Int("prompts_per_step", &r.prompts_per_step, AtLeast(1));
  v.Int("group_size", &r.group_size, AtLeast(1));
  v.Int("max_new_tokens", &r.max_new_tokens, AtLeast(1));
  v.Double("temperature", &r.temperature, AtLeast(0));
  v.Int("top_k", &r.top_k, AtLeast(0));
  v.Double("top_p", &r.top_p, OpenClosed(0, 1));
  v.Enum("decode", &r.decode, ParseDecodeMode, DecodeModeName);
  v.Int("decode_slots", &r.decode_slots, AtLeast(0));
  v.Bool("cross_step_batching", &r.cross_step_batching);
  v.Enum("overlong", &r.overlong, ParseOverlongMode, OverlongModeName);
  v.Int("overlong_buffer", &r.overlong_buffer, AtLeast(0));
  v.Double("overlong_penalty", &r.overlong_penalty, AtLeast(0));
}

template <class V>
void VisitAlgorithm(AlgorithmConfig& a, V& v) {
  v.Enum("adv_estimator", &a.adv_estimator, ParseAdvEstimator,
         AdvEstimatorName);
  v.Bool("norm_adv_by_std", &a.norm_adv_by_std);
  v.Double("gamma", &a.gamma, Closed(0, 1));
  v.Double("clip_ratio_low", &a.clip_ratio_low, ClosedOpen(0, 1));
  v.Double("clip_ratio_high", &a.clip_ratio_high, AtLeast(0));
  v.Double("clip_ratio_c", &a.clip_ratio_c, AtLeast(0));
  v.Enum("loss_agg_mode", &a.loss_agg_mode, ParseLossAggMode, LossAggModeName);
  v.Double("kl_coef", &a.kl_coef, AtLeast(0));
  v.Enum("kl_estimator", &a.kl_estimator, ParseKlEstimator, KlEstimatorName);
  v.Enum("kl_mode", &a.kl_mode, ParseKlMode, KlModeName);
  v.Double("entropy_coef", &a.entropy_coef, AtLeast(0));
  v.Int("ppo_epochs", &a.ppo_epochs, AtLeast(1));
  v.Bool("decoupled_loss", &a.decoupled_loss);
  v.Bool("router_replay", &a.router_replay);
  v.Double("behaviour_weight_cap", &a.behaviour_weight_cap, AtLeast(1));
  v.Enum("behaviour_weight_level", &a.behaviour_weight_level,
         ParseBehaviourWeightLevel, BehaviourWeightLevelName);
  v.Enum("behaviour_weight_mode", &a.behaviour_weight_mode,
         ParseBehaviourWeightMode, BehaviourWeightModeName);
  v.Enum("rollout_correction", &a.rollout_correction, ParseRolloutCorrection,
         RolloutCorrectionName);
  v.Double("rollout_correction_cap", &a.rollout_correction_cap, Above(1));
}

template <class V>
void VisitOptim(OptimConfig& o, V& v) {
  v.Double("lr", &o.lr, Above(0));
  v.Double("weight_decay", &o.weight_decay, AtLeast(0));
  v.Double("beta1", &o.beta1, ClosedOpen(0, 1));
  v.Double("beta2", &o.beta2, ClosedOpen(0, 1));
  v.Double("eps", &o.eps, Above(0));
  v.Double("grad_clip", &o.grad_clip, AtLeast(0));
  v.Int("warmup_steps", &o.warmup_steps, AtLeast(0));
  v.Int("mini_batch_size", &o.mini_batch_size, AtLeast(0));
  v.Int("micro_batch_size", &o.micro_batch_size, AtLeast(1));
  v.Int("logits_chunk_tokens", &o.logits_chunk_tokens, AtLeast(0));
  v.Bool("length_bucketing", &o.length_bucketing);
}

template <class V>
void VisitRun(RunConfig& r, V& v) {
  v.Int("total_steps", &r.total_steps, AtLeast(1));
  v.Int("eval_every", &r.eval_every, AtLeast(0));
  v.Int("checkpoint_every", &r.checkpoint_every, AtLeast(0));
  v.Int("log_every", &r.log_every, AtLeast(1));
  v.Double("collective_timeout_seconds", &r.collective_timeout_seconds,
           Above(0));
  v.Enum("data_plane", &r.data_plane, ParseDataPlane, DataPlaneName);
  static constexpr absl::string_view kExportDtypes[] = {"float32", "bfloat16"};
  v.Bool("export_final", &r.export_final);
  v.Bool("tensorboard", &r.tensorboard);
  v.String("export_dtype", &r.export_dtype, OneOf(kExportDtypes));
}

template <class V>
void VisitSft(SftConfig& s, V& v) {
  v.Int("steps", &s.steps, AtLeast(0));
  v.Int("batch_size", &s.batch_size, AtLeast(1));
  v.Double("lr", &s.lr, Above(0));
  v.Int("warmup_steps", &s.warmup_steps, AtLeast(0));
  v.Int("eval_every", &s.eval_every, AtLeast(0));
}

template <class V>
void VisitPlacement(PlacementConfig& p, V& v) {
  v.Enum("mode", &p.mode, ParsePlacementMode, PlacementModeName);
  v.Int("super_nodes", &p.super_nodes, Closed(1, 4096));
  v.Int("cards_per_super_node", &p.cards_per_super_node, Closed(1, 4096));
  v.Int("rollout_cards_per_super_node", &p.rollout_cards_per_super_node,
        AtLeast(0));
  v.Int("fused_train_threads", &p.fused_train_threads, Closed(0, 1024));
  v.Int("fused_rollout_threads", &p.fused_rollout_threads, Closed(0, 1024));
  v.Bool("fused_share_idle_threads", &p.fused_share_idle_threads);
  v.Enum("fused_turns", &p.fused_turns, ParseFusedTurns, FusedTurnsName);
  v.Int("expert_parallel", &p.expert_parallel, Closed(1, 4096));
  v.Enum("expert_sampling", &p.expert_sampling, ParseExpertSampling,
         ExpertSamplingName);
  v.Bool("fail_if_unplaceable", &p.fail_if_unplaceable);
}

template <class V>
void VisitStaleSync(StaleSyncConfig& c, V& v) {
  v.Int("max_policy_lag", &c.max_policy_lag, Closed(0, 1024));
  v.Enum("over_stale", &c.over_stale, ParseOverStalePolicy,
         OverStalePolicyName);
  v.Enum("rollout_version", &c.rollout_version, ParseRolloutVersion,
         RolloutVersionName);
  v.Int("max_clock_skew", &c.max_clock_skew, Closed(0, 1024));
  v.Int("partial_rollout_tokens", &c.partial_rollout_tokens,
        Closed(0, 1 << 20));
  v.Int("steps_per_version", &c.steps_per_version, Closed(1, 1025));
}

template <class V>
void VisitMemory(MemoryConfig& m, V& v) {
  v.Double("card_budget_mib", &m.card_budget_mib, Closed(0, kMaxCardBudgetMib));
  v.Enum("offload_optimizer", &m.offload_optimizer, ParseOffloadPolicy,
         OffloadPolicyName);
}

template <class V>
void VisitCluster(ClusterConfig& c, V& v) {
  v.String("auth_token_file", &c.auth_token_file, AnyString());
  v.String("auth_token_env", &c.auth_token_env, AnyString());
}

inline constexpr absl::string_view kToolFormats[] = {"auto", "hermes", "llama3",
                                                     "plain"};
inline constexpr absl::string_view kEnvFailurePolicies[] = {"zero", "drop"};

template <class V>
void VisitEnv(EnvConfig& e, V& v) {
  v.String("name", &e.name, AnyString());
  v.String("address", &e.address, AnyString());
  v.String("tool_format", &e.tool_format, OneOf(kToolFormats));
  v.Int("max_turns", &e.max_turns, Closed(1, 1024));
  v.Int("max_episode_tokens", &e.max_episode_tokens, Closed(0, 1 << 24));
  v.Double("call_deadline_seconds", &e.call_deadline_seconds,
           OpenClosed(0, 86400));
  v.Double("episode_env_seconds", &e.episode_env_seconds, OpenClosed(0, 86400));
  v.Int("max_concurrency", &e.max_concurrency, Closed(1, 4096));
  v.String("on_failure", &e.on_failure, OneOf(kEnvFailurePolicies));
  v.Double("unavailable_seconds", &e.unavailable_seconds, Closed(0, 86400));
  v.Int("admit_after_steps", &e.admit_after_steps, Closed(1, 1 << 20));
}

// `source_path` is deliberately not a key.
template <class V>
void VisitJob(JobConfig& c, V& v) {
  v.String("name", &c.name, NonEmpty());
  v.Int64("seed", &c.seed, AtLeast(0));
  v.String("device", &c.device, Device());
  v.Int("num_threads", &c.num_threads, Closed(1, 1024));
  v.String("output_dir", &c.output_dir, NonEmpty());
  v.String("init_checkpoint", &c.init_checkpoint, ExistingFile());
  v.Section("model", [&] { VisitModel(c.model, v); });
  v.Section("task", [&] { VisitTask(c.task, v); });
  v.Section("rollout", [&] { VisitRollout(c.rollout, v); });
  v.Section("algorithm", [&] { VisitAlgorithm(c.algorithm, v); });
  v.Section("optim", [&] { VisitOptim(c.optim, v); });
  v.Section("run", [&] { VisitRun(c.run, v); });
  v.Section("sft", [&] { VisitSft(c.sft, v); });
  v.Section("placement", [&] { VisitPlacement(c.placement, v); });
  v.Section("stalesync", [&] { VisitStaleSync(c.stalesync, v); });
  v.Section("memory", [&] { VisitMemory(c.memory, v); });
  v.Section("cluster", [&] { VisitCluster(c.cluster, v); });
  v.Section("env", [&] { VisitEnv(c.env, v); });
}

// ---------------------------------------------------------------------------
// Errors.

// The first error found; formatted into a one-line status by FormatError.
struct FieldError {
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  std::string path;    // "rollout.top_p"; "" = the whole document
  std::string reason;  // "must be in (0, 1], got 1.5"
};

inline FieldError Invalid(std::string path, std::string reason) {
  return {absl::StatusCode::kInvalidArgument, std::move(path),
          std::move(reason)};
}

// "<source>: <path>: <reason>", leaving out the empty parts.
absl::Status FormatError(absl::string_view source, const FieldError& e);

// Shortest text that parses back to exactly `v` (0.2 -> "0.2").
std::string FormatDouble(double v);

// The per-field rules, then the checks across fields (config_validation.cc);
// the first error, if any.
std::optional<FieldError> Validate(const JobConfig& config);

// The checks across fields (config_cross_field.cc), for a config whose
// fields each pass their rule: the first error, if any.
std::optional<FieldError> CheckCrossField(const JobConfig& config);

}  // namespace fusionrl::config_internal

#endif  // FUSIONRL_CORE_CONFIG_SCHEMA_H_
