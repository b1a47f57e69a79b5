// The checks of a job config that involve more than one field, one per
// section, run in a fixed order after the per-field rules
// (config_validation.cc).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/config_schema.h"
#include "core/hf_config.h"
#include "fusionrl/config.h"

namespace fusionrl {
namespace config_internal {
namespace {

// model: the head size (even, for rotary embeddings), the grouped-query
// heads and the llama3 rope scaling.
std::optional<FieldError> CheckModelHeads(const JobConfig& c) {
  const ModelConfig& m = c.model;
  if (m.head_dim == 0) {
    if (m.d_model % m.n_heads != 0) {
      return Invalid("model.d_model",
                     absl::StrCat("must be divisible by model.n_heads (",
                                  m.n_heads, "), got ", m.d_model));
    }
    if ((m.d_model / m.n_heads) % 2 != 0) {
      return Invalid(
          "model.d_model",
          absl::StrCat("head size model.d_model / model.n_heads must be even "
                       "for rotary embeddings, got ",
                       m.d_model, " / ", m.n_heads, " = ",
                       m.d_model / m.n_heads));
    }
  } else if (m.head_dim % 2 != 0) {
    return Invalid(
        "model.head_dim",
        absl::StrCat("must be even for rotary embeddings, got ", m.head_dim));
  }
  if (m.n_kv_heads > 0 && m.n_heads % m.n_kv_heads != 0) {
    return Invalid(
        "model.n_kv_heads",
        absl::StrCat("model.n_heads (", m.n_heads,
                     ") must be a multiple of it, got ", m.n_kv_heads));
  }
  if (m.rope_scaling.type == "llama3" &&
      m.rope_scaling.high_freq_factor <= m.rope_scaling.low_freq_factor) {
    return Invalid("model.rope_scaling.high_freq_factor",
                   "must be > model.rope_scaling.low_freq_factor");
  }
  return std::nullopt;
}

// model: the flags an HF architecture fixes (qkv_bias, qk_norm, experts).
std::optional<FieldError> CheckModelArchitecture(const JobConfig& c) {
  const ModelConfig& m = c.model;
  const bool qwen2 = m.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = HasQkNorm(m.architecture);
  if (!m.architecture.empty() && m.qkv_bias != qwen2) {
    return Invalid("model.qkv_bias",
                   absl::StrCat("must be ", qwen2 ? "true" : "false",
                                " for model.architecture ", m.architecture));
  }
  if (!m.architecture.empty() && m.qk_norm != qwen3) {
    return Invalid("model.qk_norm",
                   absl::StrCat("must be ", qwen3 ? "true" : "false",
                                " for model.architecture ", m.architecture));
  }
  if (IsMoeArchitecture(m.architecture) && m.moe_experts == 0) {
    return Invalid("model.moe_experts",
                   absl::StrCat("must be > 0 for model.architecture ",
                                m.architecture, " (a mixture of experts)"));
  }
  return std::nullopt;
}

// model: top-k, gates and groups of a mixture of experts.
std::optional<FieldError> CheckMoeLayout(const JobConfig& c) {
  const ModelConfig& m = c.model;
  if (m.moe_experts > 0 && m.moe_top_k > m.moe_experts) {
    return Invalid("model.moe_top_k",
                   absl::StrCat("must be <= model.moe_experts (", m.moe_experts,
                                "), got ", m.moe_top_k));
  }
  if (m.moe_gates != MoeGates::kAuto && m.moe_experts == 0) {
    return Invalid("model.moe_gates",
                   absl::StrCat("applies to a mixture of experts only "
                                "(model.moe_experts 0), got ",
                                MoeGatesName(m.moe_gates), "; leave it auto"));
  }
  if (m.moe_groups > 1) {
    if (m.moe_experts == 0) {
      return Invalid("model.moe_groups",
                     absl::StrCat("must be 1 for a dense model (model."
                                  "moe_experts 0), got ",
                                  m.moe_groups));
    }
    if (m.moe_experts % m.moe_groups != 0) {
      return Invalid(
          "model.moe_groups",
          absl::StrCat("must divide model.moe_experts (", m.moe_experts,
                       ") into equal groups, got ", m.moe_groups));
    }
    if (m.moe_top_k % m.moe_groups != 0) {
      return Invalid(
          "model.moe_groups",
          absl::StrCat("must divide model.moe_top_k (", m.moe_top_k,
                       "): every token takes top_k / groups experts in each "
                       "group, got ",
                       m.moe_groups));
    }
  }
  return std::nullopt;
}

// model.lora: a rank when other keys are set, and targets this model has.
std::optional<FieldError> CheckLora(const JobConfig& c) {
  const ModelConfig& m = c.model;
  if (m.lora.rank == 0 &&
      (m.lora.targets != LoraConfig().targets ||
       m.lora.alpha != LoraConfig().alpha || m.lora.dropout != 0)) {
    return Invalid("model.lora.rank",
                   "must be >= 1 when other model.lora keys are set (0, the "
                   "default, means full fine-tuning)");
  }
  if (LoraEnabled(m)) {
    absl::StatusOr<std::vector<std::string>> targets =
        ParseLoraTargets(m.lora.targets);
    if (!targets.ok()) {
      return Invalid("model.lora.targets",
                     std::string(targets.status().message()));
    }
    if (m.moe_experts > 0) {
      for (const std::string& t : *targets) {
        if (t == "gate_proj" || t == "up_proj" || t == "down_proj") {
          return Invalid(
              "model.lora.targets",
              absl::StrCat("'", t,
                           "' is not a layer of this model: with "
                           "model.moe_experts > 0 the feed-forward is a "
                           "mixture of experts; LoRA targets its attention "
                           "projections (q_proj, k_proj, v_proj, o_proj)"));
        }
      }
    }
  }
  return std::nullopt;
}

// model.moe_experts: one expert is neither dense nor a mixture.
std::optional<FieldError> CheckExpertCount(const JobConfig& c) {
  const ModelConfig& m = c.model;
  if (m.moe_experts == 1) {
    return Invalid("model.moe_experts",
                   "must be 0 (dense) or in [2, 128], got 1");
  }
  return std::nullopt;
}

// model.activations: the planner's budget, or a hand-written plan.
std::optional<FieldError> CheckActivations(const JobConfig& c) {
  const ModelConfig& m = c.model;
  const ActivationConfig& act = m.activations;
  const bool planned = act.policy == ActivationPolicy::kAuto;
  if (planned && act.budget_mib <= 0) {
    return Invalid("model.activations.budget_mib",
                   "must be > 0 when model.activations.policy is auto");
  }
  // The finer units: keep or recompute.
  for (const auto& [key, value] : {std::pair<const char*, SubBlockActivation>{
                                       "attention_core", act.attention_core},
                                   {"mlp_act", act.mlp_act}}) {
    if (value == SubBlockActivation::kSwap) {
      return Invalid(absl::StrCat("model.activations.", key),
                     "must be keep or recompute (empty = keep); got 'swap'");
    }
  }
  const SubBlockActivation kDefault = SubBlockActivation::kDefault;
  if (planned && !(act.attention == kDefault && act.mlp == kDefault &&
                   act.norm == kDefault && act.attention_core == kDefault &&
                   act.mlp_act == kDefault && act.layers.empty())) {
    return Invalid("model.activations",
                   "under policy auto the planner chooses every sub-block: "
                   "leave attention, mlp, norm, attention_core, mlp_act and "
                   "layers unset");
  }
  if (!planned) {
    auto plan = ResolveActivationPlan(act, m.n_layers);
    if (!plan.ok()) {
      return Invalid("model.activations.layers",
                     std::string(plan.status().message()));
    }
  }
  return std::nullopt;
}

// task: digit range, data path and chat template.
std::optional<FieldError> CheckTask(const JobConfig& c) {
  if (c.task.max_digits < c.task.min_digits) {
    return Invalid(
        "task.max_digits",
        absl::StrCat("must be >= task.min_digits (", c.task.min_digits,
                     "), got ", c.task.max_digits));
  }
  if ((c.task.name == "jsonl" || c.task.name == "math") &&
      c.task.train_path.empty()) {
    return Invalid("task.train_path",
                   absl::StrCat("required when task.name is ", c.task.name));
  }
  const std::string& t = c.task.chat_template;
  if (!t.empty() && t != "chatml" && t != "llama3" && t != "none") {
    return Invalid("task.chat_template",
                   absl::StrCat("must be chatml, llama3 or none (empty = "
                                "auto, from the model's "
                                "tokenizer_config.json); got '",
                                t, "'"));
  }
  return std::nullopt;
}

// rollout: group size for RLOO, and responses that fit the context.
std::optional<FieldError> CheckRolloutLength(const JobConfig& c) {
  const ModelConfig& m = c.model;
  if (c.algorithm.adv_estimator == AdvEstimator::kRloo &&
      c.rollout.group_size < 2) {
    return Invalid("rollout.group_size",
                   absl::StrCat("must be >= 2 when algorithm.adv_estimator is "
                                "rloo, got ",
                                c.rollout.group_size));
  }
  if (c.rollout.max_new_tokens >= m.max_seq_len) {
    return Invalid("rollout.max_new_tokens",
                   absl::StrCat("must be < model.max_seq_len (", m.max_seq_len,
                                "), got ", c.rollout.max_new_tokens));
  }
  return std::nullopt;
}

// placement: the rollout cards of a disaggregated super node.
std::optional<FieldError> CheckPlacementRoles(const JobConfig& c) {
  const PlacementConfig& p = c.placement;
  if (p.mode == PlacementMode::kDisaggregated) {
    if (p.cards_per_super_node < 2) {
      return Invalid(
          "placement.cards_per_super_node",
          absl::StrCat("must be >= 2 when placement.mode is disaggregated "
                       "(at least one rollout and one train card), got ",
                       p.cards_per_super_node));
    }
    if (p.rollout_cards_per_super_node < 1 ||
        p.rollout_cards_per_super_node > p.cards_per_super_node - 1) {
      return Invalid(
          "placement.rollout_cards_per_super_node",
          absl::StrCat("disaggregated needs 1..cards_per_super_node-1 "
                       "rollout cards, got ",
                       p.rollout_cards_per_super_node));
    }
  } else if (p.rollout_cards_per_super_node != 0) {
    return Invalid("placement.rollout_cards_per_super_node",
                   absl::StrCat("must be 0 unless placement.mode is "
                                "disaggregated, got ",
                                p.rollout_cards_per_super_node));
  }
  return std::nullopt;
}

// run.export_final: the model must be exportable to HF.
std::optional<FieldError> CheckExportFinal(const JobConfig& c) {
  const ModelConfig& m = c.model;
  // Known before the job trains rather than after its last step (which
  // would then fail with the weights only in the final checkpoint).
  if (c.run.export_final) {
    if (absl::Status s = HfExportable(m); !s.ok()) {
      return Invalid("run.export_final",
                     absl::StrCat(s.message(),
                                  "; the checkpoints hold the weights "
                                  "(model.pt)"));
    }
  }
  return std::nullopt;
}

// placement.expert_parallel: shards that divide the experts and cards.
std::optional<FieldError> CheckExpertParallel(const JobConfig& c) {
  const ModelConfig& m = c.model;
  const PlacementConfig& p = c.placement;
  if (p.expert_parallel > 1) {
    const int e = p.expert_parallel;
    std::string why;
    if (m.moe_experts == 0) {
      why = "needs a mixture-of-experts policy (model.moe_experts > 0)";
    } else if (m.moe_experts % e != 0) {
      why = absl::StrCat("must divide model.moe_experts (", m.moe_experts,
                         ") into equal shards");
    } else if (p.cards_per_super_node % e != 0) {
      why = absl::StrCat(
          "must divide placement.cards_per_super_node (",
          p.cards_per_super_node,
          "): each run of that many cards holds one policy's shards");
    } else if (p.mode == PlacementMode::kDisaggregated) {
      why =
          "is not built for placement.mode disaggregated (its rollout "
          "cards would need the gathered experts); use colocated-sync or "
          "fused";
    } else if (LoraEnabled(m)) {
      why =
          "does not apply to LoRA (model.lora.rank > 0): a MoE block's "
          "experts are not adapted, so only the frozen base would be "
          "sharded";
    }
    if (!why.empty()) {
      return Invalid("placement.expert_parallel",
                     absl::StrCat(why, ", got ", e));
    }
  }
  return std::nullopt;
}

// placement.expert_sampling: shard sampling needs one version a step.
std::optional<FieldError> CheckExpertSampling(const JobConfig& c) {
  const PlacementConfig& p = c.placement;
  if (p.expert_sampling == ExpertSampling::kShard) {
    // The cards of a group run every decode step together, so each of
    // them must sample a step from the same policy version, in the same
    // rounds.
    const StaleSyncConfig& st = c.stalesync;
    const bool overlapped =
        p.mode == PlacementMode::kFused && st.max_policy_lag > 0;
    std::string why;
    if (p.expert_parallel < 2) {
      why =
          "needs placement.expert_parallel > 1 (without expert shards every "
          "card samples from its whole model)";
    } else if (overlapped && st.rollout_version != RolloutVersion::kLagged) {
      why = absl::StrCat(
          "needs stalesync.rollout_version: lagged with placement.mode fused "
          "and stalesync.max_policy_lag > 0 (got ",
          RolloutVersionName(st.rollout_version),
          ", which picks a step's policy version by the clock, on each card "
          "its own; the cards of an expert group must sample a step from "
          "one version)");
    } else if (overlapped && st.partial_rollout_tokens > 0) {
      why =
          "is not built for stalesync.partial_rollout_tokens (a card's "
          "rounds would follow its own responses' lengths; the cards of an "
          "expert group decode in the same rounds)";
    }
    if (!why.empty()) {
      return Invalid("placement.expert_sampling", absl::StrCat("shard ", why));
    }
  }
  return std::nullopt;
}

// algorithm: router replay, and the one weight that corrects a lag.
std::optional<FieldError> CheckAlgorithm(const JobConfig& c) {
  const ModelConfig& m = c.model;
  const AlgorithmConfig& a = c.algorithm;
  if (a.router_replay && m.moe_experts == 0) {
    return Invalid("algorithm.router_replay",
                   "needs a mixture-of-experts policy (model.moe_experts > "
                   "0): a dense model has no routing to replay");
  }
  // decoupled_loss and rollout_correction are one weight, pi_prox /
  // pi_behaviour, each with its own rule: both at once would be ambiguous.
  if (a.decoupled_loss && a.rollout_correction != RolloutCorrection::kNone) {
    return Invalid(
        "algorithm.rollout_correction",
        absl::StrCat(RolloutCorrectionName(a.rollout_correction),
                     " with algorithm.decoupled_loss: true weights each token "
                     "by the same pi_prox / pi_behaviour twice; use one: "
                     "rollout_correction (its cap and rule) or decoupled_loss "
                     "(behaviour_weight_cap/_level/_mode)"));
  }
  // A lag lets samples of an older policy reach the trainer; the plain PPO
  // ratio takes their behaviour log-probs as the proximal policy's, which
  // biases the update. Only a recomputed proximal policy with a behaviour
  // weight (decoupled PPO, or a rollout correction) corrects for it.
  if (c.stalesync.max_policy_lag > 0 && !a.RecomputesProximal()) {
    return Invalid(
        "stalesync.max_policy_lag",
        absl::StrCat(c.stalesync.max_policy_lag,
                     " > 0 requires algorithm.decoupled_loss: true (samples "
                     "from an older policy trained with the plain PPO ratio "
                     "give a biased update); set algorithm.decoupled_loss: "
                     "true (or algorithm.rollout_correction: tis | mis), or "
                     "stalesync.max_policy_lag: 0"));
  }
  return std::nullopt;
}

// rollout: truncated sampling and the overlong buffer.
std::optional<FieldError> CheckSampling(const JobConfig& c) {
  const AlgorithmConfig& a = c.algorithm;
  // Top-k / top-p sampling draws from a truncated distribution, and the
  // behaviour log-probs are that distribution's; the trainer's are the full
  // distribution's. Taken as the PPO ratio's old log-probs they would make
  // every ratio < 1 from the start: only a recomputed proximal policy with
  // the behaviour weight pi_prox / pi_sampled uses them rightly.
  const RolloutConfig& r = c.rollout;
  const bool truncated = r.top_k > 0 || r.top_p < 1.0;
  if (r.temperature > 0 && truncated && !a.RecomputesProximal()) {
    return Invalid(
        r.top_k > 0 ? "rollout.top_k" : "rollout.top_p",
        "sampling from a top-k / top-p truncated distribution needs the "
        "trainer to recompute the proximal log-probs (the behaviour log-probs "
        "are the truncated distribution's, not the policy's); set "
        "algorithm.rollout_correction: tis (or algorithm.decoupled_loss: "
        "true), or rollout.top_k: 0 and rollout.top_p: 1");
  }
  if (r.overlong_buffer > r.max_new_tokens) {
    return Invalid(
        "rollout.overlong_buffer",
        absl::StrCat("must be <= rollout.max_new_tokens (", r.max_new_tokens,
                     "), got ", r.overlong_buffer));
  }
  return std::nullopt;
}

// env: what an environment's episodes allow, and its server address.
std::optional<FieldError> CheckEnv(const JobConfig& c) {
  if (!c.env.name.empty()) {
    if (c.stalesync.partial_rollout_tokens > 0) {
      return Invalid("stalesync.partial_rollout_tokens",
                     "must be 0 with env.name set (an episode is sampled "
                     "whole, from one policy version; interrupting it between "
                     "environment turns is not supported)");
    }
    if (c.rollout.overlong == OverlongMode::kPenalize) {
      return Invalid("rollout.overlong",
                     "penalize ramps a response's reward by its length against "
                     "rollout.max_new_tokens, which with env.name set bounds "
                     "one turn, not the episode; use mask (episodes a limit "
                     "cut leave the loss) or keep");
    }
    if (c.env.name == "remote" && c.env.address.empty()) {
      return Invalid("env.address",
                     "env.name: remote needs the environment server's "
                     "host:port (several comma-separated)");
    }
    if (c.env.max_episode_tokens > 0 &&
        c.env.max_episode_tokens < c.rollout.max_new_tokens) {
      return Invalid("env.max_episode_tokens",
                     absl::StrCat("must be 0 or >= rollout.max_new_tokens (",
                                  c.rollout.max_new_tokens, "), got ",
                                  c.env.max_episode_tokens));
    }
  } else if (!c.env.address.empty()) {
    return Invalid("env.address",
                   "is set but env.name is not: set env.name: remote to use "
                   "environment servers");
  }
  return std::nullopt;
}

// stalesync.partial_rollout_tokens: carried tails need a lagged version.
std::optional<FieldError> CheckPartialRollout(const JobConfig& c) {
  const PlacementConfig& p = c.placement;
  if (const int n = c.stalesync.partial_rollout_tokens; n > 0) {
    const std::string key = "stalesync.partial_rollout_tokens";
    if (p.mode == PlacementMode::kColocatedSync) {
      return Invalid(key, absl::StrCat(n,
                                       " > 0 needs placement.mode fused or "
                                       "disaggregated (colocated-sync samples "
                                       "every step from the trainer's weights "
                                       "of that step); set it to 0"));
    }
    if (c.stalesync.max_policy_lag < 2) {
      return Invalid(
          key,
          absl::StrCat(n, " > 0 needs stalesync.max_policy_lag >= 2 (got ",
                       c.stalesync.max_policy_lag,
                       "): a response's tail comes from a version at most s - "
                       "1 newer than its head, so with s < 2 nothing can be "
                       "carried; set it to 0 or raise the lag"));
    }
    if (c.stalesync.rollout_version != RolloutVersion::kLagged) {
      return Invalid(key, absl::StrCat(n,
                                       " > 0 needs stalesync.rollout_version: "
                                       "lagged (the versions of a response's "
                                       "segments follow from the step, not "
                                       "from timing)"));
    }
    if (n >= c.rollout.max_new_tokens) {
      return Invalid(key,
                     absl::StrCat(n, " must be below rollout.max_new_tokens (",
                                  c.rollout.max_new_tokens,
                                  "): no response could be carried"));
    }
  }
  return std::nullopt;
}

// stalesync.steps_per_version: a block of steps on one version.
std::optional<FieldError> CheckStepsPerVersion(const JobConfig& c) {
  const PlacementConfig& p = c.placement;
  if (const int m = c.stalesync.steps_per_version; m > 1) {
    const std::string key = "stalesync.steps_per_version";
    if (p.mode == PlacementMode::kColocatedSync) {
      return Invalid(key, absl::StrCat(m,
                                       " > 1 needs placement.mode fused or "
                                       "disaggregated (colocated-sync samples "
                                       "every step from the trainer's weights "
                                       "of that step); set it to 1"));
    }
    if (m > c.stalesync.max_policy_lag + 1) {
      return Invalid(
          key,
          absl::StrCat(m, " must be at most stalesync.max_policy_lag + 1 (",
                       c.stalesync.max_policy_lag + 1,
                       "): the block's first step would have to sample "
                       "from a version its own training step has not "
                       "produced yet"));
    }
    if (c.stalesync.rollout_version != RolloutVersion::kLagged) {
      return Invalid(key, absl::StrCat(m,
                                       " > 1 needs stalesync.rollout_version: "
                                       "lagged (with newest or jit, timing "
                                       "decides which steps share a version)"));
    }
    if (c.stalesync.partial_rollout_tokens > 0) {
      return Invalid(
          key, absl::StrCat(m,
                            " > 1 does not combine with "
                            "stalesync.partial_rollout_tokens (a response's "
                            "tail would need a version its own step's "
                            "training has not published yet); set one of "
                            "them off"));
    }
  }
  return std::nullopt;
}

// placement.fused_turns: only where a card's roles share its threads.
std::optional<FieldError> CheckFusedTurns(const JobConfig& c) {
  const PlacementConfig& p = c.placement;
  if (p.fused_turns != FusedTurns::kAuto &&
      (p.mode != PlacementMode::kFused || !p.fused_share_idle_threads ||
       c.stalesync.max_policy_lag == 0)) {
    return Invalid(
        "placement.fused_turns",
        absl::StrCat(FusedTurnsName(p.fused_turns),
                     " applies only to placement.mode fused with "
                     "stalesync.max_policy_lag > 0 and "
                     "placement.fused_share_idle_threads: true (elsewhere the "
                     "card's roles never share its threads, or never overlap); "
                     "set it to auto"));
  }
  return std::nullopt;
}

}  // namespace

// Checks that involve more than one field. Runs after the per-field rules,
// so single fields are already in range (e.g. n_heads >= 1). The checks run
// in this order and the first error wins.
std::optional<FieldError> CheckCrossField(const JobConfig& c) {
  using Check = std::optional<FieldError> (*)(const JobConfig&);
  static constexpr Check kChecks[] = {
      CheckModelHeads,     CheckModelArchitecture, CheckMoeLayout,
      CheckLora,           CheckExpertCount,       CheckActivations,
      CheckTask,           CheckRolloutLength,     CheckPlacementRoles,
      CheckExportFinal,    CheckExpertParallel,    CheckExpertSampling,
      CheckAlgorithm,      CheckSampling,          CheckEnv,
      CheckPartialRollout, CheckStepsPerVersion,   CheckFusedTurns};
  for (Check check : kChecks) {
    if (std::optional<FieldError> error = check(c)) return error;
  }
  return std::nullopt;
}

}  // namespace config_internal
}  // namespace fusionrl
