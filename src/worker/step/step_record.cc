#include "worker/step/step_record.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/train/trainer.h"

namespace fusionrl {

MetricFields StepRecord(const StepRecordParts& p) {
  const StepTotals& t = *p.totals;
  const TrainStats& ts = *p.train;
  const double n = t.samples;
  MetricFields rec = {
      {"step", static_cast<double>(p.step)},
      {"policy_version", static_cast<double>(p.policy_version)},
      {"reward_mean", t.reward_sum / n},
      {"train_accuracy", t.correct / n},
      {"response_len_mean", t.tokens / n},
      {"finished_frac", t.finished / n},
      {"loss", ts.loss},
      {"pg_loss", ts.pg_loss},
      {"kl", ts.kl},
      {"entropy", ts.entropy},
      {"clip_frac", ts.clip_frac},
      {"grad_norm", ts.grad_norm},
      {"lr", ts.lr},
      {"advantage_abs_mean", ts.advantage_abs_mean},
      {"behaviour_weight_mean", ts.behaviour_weight_mean},
      {"behaviour_weight_truncated", ts.behaviour_weight_truncated},
      {"logp_diff_mean", ts.logp_diff_mean},
      {"logp_diff_max", ts.logp_diff_max},
      {"overlong_frac", ts.overlong_frac},
      {"overlong_penalty_mean", ts.overlong_penalty_mean},
      {"max_staleness", static_cast<double>(p.max_staleness)},
      {"over_stale_samples", t.over_stale},
      {"partial_rollout_samples", t.partial_samples},
      {"partial_rollout_newer_tokens", t.partial_newer_tokens},
      {"rollout_tokens", t.tokens},
      {"rollout_seconds", p.times.rollout},
      {"rollout_wait_seconds", p.times.rollout_wait},
      {"train_seconds", p.times.train},
      {"step_seconds", p.times.step},
      {"card_turns_interleaved", p.interleaved ? 1.0 : 0.0},
      {"cards", static_cast<double>(p.cards)},
      {"nodes", static_cast<double>(p.nodes)},
      {"attempt", static_cast<double>(p.attempt)},
      {"cross_node_rounds", static_cast<double>(p.exchange.cross_node_rounds)},
      {"cross_node_seconds", p.exchange.cross_node_seconds},
      {"cross_node_bytes", static_cast<double>(p.exchange.cross_node_bytes)},
      {"rollout_gate_wait_seconds", p.times.gate_wait},
      {"card_idle_seconds", p.split.idle},
      {"card_trainer_only_seconds", p.split.trainer_only},
      {"card_rollout_only_seconds", p.split.rollout_only},
      {"card_both_seconds", p.split.both},
      {"updates_received", static_cast<double>(p.exchange.updates_received)},
      {"max_update_lag", static_cast<double>(p.exchange.max_update_lag)},
      {"weight_sync_seconds", p.times.weight_sync},
      {"weight_sync_bytes", static_cast<double>(p.exchange.weight_sync_bytes)},
      {"trained_groups", t.trained_groups},
      {"trained_group_id_sum", t.trained_group_id_sum},
      {"trained_group_id_sq_sum", t.trained_group_id_sq_sum},
      {"rollout_thread_samples", t.thread_samples},
      {"rollout_snapshot_updates", static_cast<double>(p.snapshot_updates)}};
  for (size_t i = 0; i < t.staleness.size(); ++i) {
    rec.push_back({absl::StrCat("staleness_", i), t.staleness[i]});
  }
  if (p.admission_lag >= 0) {
    rec.push_back(
        {"rollout_admission_lag", static_cast<double>(p.admission_lag)});
  }
  if (p.env) {
    const double tokens = std::max(1.0, t.tokens);
    rec.push_back({"env_turns_mean", t.env_turns / n});
    rec.push_back({"env_tool_calls_mean", t.env_tool_calls / n});
    rec.push_back({"env_tool_errors_mean", t.env_tool_errors / n});
    rec.push_back({"env_seconds_mean", t.env_seconds / n});
    rec.push_back({"env_masked_frac", t.env_tokens / tokens});
    rec.push_back({"env_failed_episodes", t.env_failed});
    for (const auto& [name, value] : p.env_metrics) {
      rec.push_back({absl::StrCat("env_", name), value});
    }
  }
  if (p.lora_rank > 0) {
    rec.push_back({"lora_rank", static_cast<double>(p.lora_rank)});
    rec.push_back({"lora_trainable_parameters",
                   static_cast<double>(p.trainable_parameters)});
  }
  if (p.moe) {
    // The lead card's own router statistics (like the other trainer stats).
    rec.push_back({"moe_aux_loss", ts.moe_aux_loss});
    rec.push_back({"moe_z_loss", ts.moe_z_loss});
    rec.push_back({"moe_dropped_frac", ts.moe_dropped_frac});
    for (size_t i = 0; i < ts.moe_expert_load.size(); ++i) {
      rec.push_back({absl::StrCat("moe_load_", i), ts.moe_expert_load[i]});
    }
    if (ts.moe_group_load.size() > 1) {
      for (size_t g = 0; g < ts.moe_group_load.size(); ++g) {
        rec.push_back(
            {absl::StrCat("moe_group_load_", g), ts.moe_group_load[g]});
      }
    }
    if (ts.moe_route_disagreement >= 0) {
      rec.push_back({"moe_route_disagreement", ts.moe_route_disagreement});
    }
  }
  for (const auto& [category, bytes] : p.card_memory) {
    rec.push_back({absl::StrCat("card_memory_", category, "_bytes"),
                   static_cast<double>(bytes)});
  }
  if (p.expert_parallel > 1) {
    const StepExchange& x = p.exchange;
    rec.push_back({"expert_parallel", static_cast<double>(p.expert_parallel)});
    rec.push_back({"expert_alltoall_calls",
                   static_cast<double>(x.expert_alltoall_calls)});
    rec.push_back({"expert_alltoall_bytes",
                   static_cast<double>(x.expert_alltoall_bytes)});
    rec.push_back({"expert_alltoall_seconds", x.expert_alltoall_seconds});
    rec.push_back({"expert_gather_seconds", p.times.expert_gather});
    if (p.samples_shard) {
      rec.push_back({"expert_sampling_alltoall_bytes",
                     static_cast<double>(x.sampling_alltoall_bytes)});
      rec.push_back(
          {"expert_sampling_alltoall_seconds", x.sampling_alltoall_seconds});
    }
  }
  return rec;
}

}  // namespace fusionrl
