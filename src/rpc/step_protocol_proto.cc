#include "rpc/step_protocol_proto.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/metrics.h"
#include "fusionrl/config.h"

namespace fusionrl::rpc {
namespace {

v1::PlanKind KindToProto(PlanKind kind) {
  switch (kind) {
    case PlanKind::kWait:
      return v1::PLAN_KIND_WAIT;
    case PlanKind::kTrain:
      return v1::PLAN_KIND_TRAIN;
    case PlanKind::kEnd:
      return v1::PLAN_KIND_END;
    case PlanKind::kAbandon:
      return v1::PLAN_KIND_ABANDON;
  }
  return v1::PLAN_KIND_UNSPECIFIED;
}

PlanKind KindFromProto(v1::PlanKind kind) {
  switch (kind) {
    case v1::PLAN_KIND_TRAIN:
      return PlanKind::kTrain;
    case v1::PLAN_KIND_END:
      return PlanKind::kEnd;
    case v1::PLAN_KIND_ABANDON:
      return PlanKind::kAbandon;
    default:
      return PlanKind::kWait;
  }
}

}  // namespace

v1::StepPlan StepPlanToProto(const StepPlan& p) {
  v1::StepPlan out;
  out.set_kind(KindToProto(p.kind));
  out.set_step(p.step);
  out.set_attempt(p.attempt);
  out.set_rank(p.rank);
  out.set_world_size(p.world_size);
  out.set_nodes(p.nodes);
  for (uint64_t g : p.groups) out.add_groups(g);
  out.set_eval_before(p.eval_before);
  out.set_eval_after(p.eval_after);
  out.set_checkpoint_name(p.checkpoint_name);
  out.set_message(p.message);
  out.set_data_cursor_after(p.data_cursor_after);
  out.set_exchange_updates(p.exchange_updates);
  out.set_updates_due_step(p.updates_due_step);
  out.set_sync_weights(p.sync_weights);
  out.set_c10d_data_plane(p.c10d_data_plane);
  out.set_rendezvous_generation(p.rendezvous_generation);
  out.set_node_rank(p.node_rank);
  if (p.rollback_to_step >= 0) out.set_rollback_to_step(p.rollback_to_step);
  return out;
}

StepPlan StepPlanFromProto(const v1::StepPlan& p) {
  StepPlan plan;
  plan.kind = KindFromProto(p.kind());
  plan.step = p.step();
  plan.attempt = p.attempt();
  plan.rank = p.rank();
  plan.world_size = p.world_size();
  plan.nodes = p.nodes();
  plan.groups.assign(p.groups().begin(), p.groups().end());
  plan.eval_before = p.eval_before();
  plan.eval_after = p.eval_after();
  plan.checkpoint_name = p.checkpoint_name();
  plan.message = p.message();
  plan.data_cursor_after = p.data_cursor_after();
  plan.exchange_updates = p.exchange_updates();
  plan.updates_due_step = p.updates_due_step();
  plan.sync_weights = p.sync_weights();
  plan.c10d_data_plane = p.c10d_data_plane();
  plan.rendezvous_generation = p.rendezvous_generation();
  plan.node_rank = p.node_rank();
  plan.rollback_to_step = p.has_rollback_to_step()
                              ? std::max<int64_t>(-1, p.rollback_to_step())
                              : -1;
  return plan;
}

v1::GetAssignmentResponse AssignmentToProto(const Assignment& a) {
  v1::GetAssignmentResponse out;
  out.set_job_id(a.job_id);
  if (a.config != nullptr) {
    // The resolved config: the worker applies no overrides of its own.
    out.set_config_yaml(JobConfigToYaml(*a.config));
    out.set_source_name(a.config->source_path.empty() ? a.config->name
                                                      : a.config->source_path);
  }
  for (int c : a.card_indices) out.add_card_indices(c);
  out.set_resume_checkpoint(a.resume_checkpoint);
  out.set_rollout_cards(a.rollout_cards);
  out.set_train_rank_offset(a.train_rank_offset);
  return out;
}

Assignment AssignmentFromProto(const v1::GetAssignmentResponse& response) {
  Assignment a;
  a.job_id = response.job_id();
  if (!a.job_id.empty()) {
    absl::StatusOr<JobConfig> config =
        ParseJobConfig(response.config_yaml(), response.source_name(),
                       std::vector<std::string>(response.overrides().begin(),
                                                response.overrides().end()));
    if (config.ok()) {
      a.config = std::make_shared<const JobConfig>(*std::move(config));
    } else {
      a.config_error = config.status();
    }
  }
  a.card_indices.assign(response.card_indices().begin(),
                        response.card_indices().end());
  a.resume_checkpoint = response.resume_checkpoint();
  a.rollout_cards = response.rollout_cards();
  a.train_rank_offset = response.train_rank_offset();
  return a;
}

v1::FinishStepRequest StepReportToProto(const StepReport& r) {
  v1::FinishStepRequest out;
  out.set_job_id(r.job_id);
  out.set_node_id(r.node_id);
  out.set_step(r.step);
  out.set_attempt(r.attempt);
  if (!r.metrics.empty()) out.set_metrics_json(MetricRecordToJson(r.metrics));
  out.set_rollout_tokens(r.rollout_tokens);
  out.set_loop_seconds(r.loop_seconds);
  out.set_initial_eval_accuracy(r.initial_eval_accuracy);
  out.set_eval_accuracy(r.eval_accuracy);
  out.set_checkpoint_dir(r.checkpoint_dir);
  out.set_reward_mean(r.reward_mean);
  out.set_train_accuracy(r.train_accuracy);
  out.set_policy_version(r.policy_version);
  if (!r.error.ok()) {
    out.set_error(std::string(r.error.message()));
    out.set_error_code(static_cast<int>(r.error.code()));
  }
  out.set_has_weights_crc32c(r.has_weights_crc32c);
  out.set_weights_crc32c(r.weights_crc32c);
  out.set_abort_reason(r.abort_reason);
  out.set_has_trained_groups(r.has_trained_groups);
  out.set_trained_groups(r.trained_groups);
  out.set_trained_group_id_sum(r.trained_group_id_sum);
  out.set_trained_group_id_sq_sum(r.trained_group_id_sq_sum);
  return out;
}

StepReport StepReportFromProto(const v1::FinishStepRequest& r) {
  StepReport out;
  out.job_id = r.job_id();
  out.node_id = r.node_id();
  out.step = r.step();
  out.attempt = r.attempt();
  out.rollout_tokens = r.rollout_tokens();
  out.loop_seconds = r.loop_seconds();
  out.initial_eval_accuracy = r.initial_eval_accuracy();
  out.eval_accuracy = r.eval_accuracy();
  out.checkpoint_dir = r.checkpoint_dir();
  out.reward_mean = r.reward_mean();
  out.train_accuracy = r.train_accuracy();
  out.policy_version = r.policy_version();
  if (!r.error().empty()) {
    out.error = absl::Status(r.error_code() != 0
                                 ? static_cast<absl::StatusCode>(r.error_code())
                                 : absl::StatusCode::kUnknown,
                             r.error());
  }
  out.has_weights_crc32c = r.has_weights_crc32c();
  out.weights_crc32c = r.weights_crc32c();
  out.abort_reason = r.abort_reason();
  out.has_trained_groups = r.has_trained_groups();
  out.trained_groups = r.trained_groups();
  out.trained_group_id_sum = r.trained_group_id_sum();
  out.trained_group_id_sq_sum = r.trained_group_id_sq_sum();
  return out;
}

namespace {

// StoreOp <-> its wire enum, one row per operation.
constexpr std::pair<StoreOp, v1::StoreOp> kStoreOps[] = {
    {StoreOp::kSet, v1::STORE_OP_SET},
    {StoreOp::kCompareSet, v1::STORE_OP_COMPARE_SET},
    {StoreOp::kGet, v1::STORE_OP_GET},
    {StoreOp::kAdd, v1::STORE_OP_ADD},
    {StoreOp::kCheck, v1::STORE_OP_CHECK},
    {StoreOp::kWait, v1::STORE_OP_WAIT},
    {StoreOp::kDelete, v1::STORE_OP_DELETE},
};

}  // namespace

v1::StoreRequest StoreCallToProto(const StoreCall& call) {
  v1::StoreRequest out;
  out.set_job_id(call.job_id);
  out.set_node_id(call.node_id);
  out.set_generation(call.generation);
  for (const auto& [op, wire] : kStoreOps) {
    if (op == call.op) out.set_op(wire);
  }
  for (const std::string& k : call.keys) out.add_keys(k);
  out.set_value(call.value);
  out.set_expected(call.expected);
  out.set_delta(call.delta);
  return out;
}

absl::StatusOr<StoreCall> StoreCallFromProto(const v1::StoreRequest& r) {
  StoreCall call;
  bool known = false;
  for (const auto& [op, wire] : kStoreOps) {
    if (wire == r.op()) {
      call.op = op;
      known = true;
    }
  }
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("op: unknown store operation ", r.op()));
  }
  call.job_id = r.job_id();
  call.node_id = r.node_id();
  call.generation = r.generation();
  call.keys.assign(r.keys().begin(), r.keys().end());
  call.value = r.value();
  call.expected = r.expected();
  call.delta = r.delta();
  return call;
}

}  // namespace fusionrl::rpc
