// The WorkService's wire types at the JobManager's edge: each v1:: entry
// point checks what only the wire can get wrong (wait_ms ranges, an unset
// dtype, a CRC-32C), converts to the plain structs of core/step_protocol.h,
// runs the same code as the typed entry points, and converts the answer
// back.
#include <utility>

#include "absl/strings/str_cat.h"
#include "controller/job_manager.h"
#include "controller/job_state.h"
#include "core/status_macros.h"

namespace fusionrl {
namespace {

constexpr int kMaxWaitMs = 60000;

absl::Status CheckWaitMs(int32_t wait_ms, const char* field) {
  if (wait_ms < 0 || wait_ms > kMaxWaitMs) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be in 0..", kMaxWaitMs, ", got ", wait_ms));
  }
  return absl::OkStatus();
}

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

v1::StepPlan ToProto(const StepPlan& p) {
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
  out.set_rollout_tokens_before(p.rollout_tokens_before);
  out.set_loop_seconds_before(p.loop_seconds_before);
  out.set_initial_eval_accuracy(p.initial_eval_accuracy);
  out.set_last_eval_accuracy(p.last_eval_accuracy);
  out.set_message(p.message);
  out.set_data_cursor_after(p.data_cursor_after);
  out.set_exchange_updates(p.exchange_updates);
  out.set_updates_due_step(p.updates_due_step);
  out.set_sync_weights(p.sync_weights);
  return out;
}

v1::GetAssignmentResponse ToProto(const Assignment& a) {
  v1::GetAssignmentResponse out;
  out.set_job_id(a.job_id);
  out.set_config_yaml(a.config_yaml);
  out.set_source_name(a.source_name);
  for (const std::string& o : a.overrides) out.add_overrides(o);
  for (int c : a.card_indices) out.add_card_indices(c);
  out.set_resume_checkpoint(a.resume_checkpoint);
  out.set_rollout_cards(a.rollout_cards);
  return out;
}

StepReport FromProto(const v1::FinishStepRequest& r) {
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
  return out;
}

}  // namespace

absl::StatusOr<v1::GetAssignmentResponse> JobManager::GetAssignment(
    const v1::GetAssignmentRequest& request) {
  FUSIONRL_RETURN_IF_ERROR(CheckWaitMs(request.wait_ms(), "wait_ms"));
  FUSIONRL_ASSIGN_OR_RETURN(
      Assignment a,
      GetAssignment(request.node_id(), absl::Milliseconds(request.wait_ms())));
  return ToProto(a);
}

absl::StatusOr<v1::StepPlan> JobManager::GetStepPlan(
    const v1::GetStepPlanRequest& r) {
  FUSIONRL_RETURN_IF_ERROR(CheckWaitMs(r.wait_ms(), "wait_ms"));
  FUSIONRL_ASSIGN_OR_RETURN(
      StepPlan plan, GetStepPlan(r.job_id(), r.node_id(), r.local_rank(),
                                 r.step(), absl::Milliseconds(r.wait_ms())));
  return ToProto(plan);
}

absl::StatusOr<std::string> JobManager::Reduce(const v1::ReduceRequest& r,
                                               absl::Time deadline) {
  if (r.dtype() != v1::REDUCE_DTYPE_FLOAT32 &&
      r.dtype() != v1::REDUCE_DTYPE_FLOAT64) {
    return absl::InvalidArgumentError("dtype: must be FLOAT32 or FLOAT64");
  }
  ReduceCall call;
  call.job_id = r.job_id();
  call.node_id = r.node_id();
  call.step = r.step();
  call.attempt = r.attempt();
  call.round = r.round();
  call.dtype = r.dtype() == v1::REDUCE_DTYPE_FLOAT64 ? ReduceDtype::kFloat64
                                                     : ReduceDtype::kFloat32;
  call.payload = r.payload();
  return ReduceImpl(std::move(call), deadline);
}

absl::StatusOr<v1::FinishStepResponse> JobManager::FinishStep(
    const v1::FinishStepRequest& request, absl::Time deadline) {
  ReportedStep r;
  r.report = FromProto(request);
  r.metrics_json = request.metrics_json();
  FUSIONRL_ASSIGN_OR_RETURN(bool committed,
                            FinishStepImpl(std::move(r), deadline));
  v1::FinishStepResponse response;
  response.set_committed(committed);
  return response;
}

absl::StatusOr<v1::ExchangeUpdatesResponse> JobManager::ExchangeUpdates(
    const v1::ExchangeUpdatesRequest& r, absl::Time deadline) {
  const v1::GradientUpdate& u = r.update();
  UpdateCall call;
  call.job_id = r.job_id();
  call.node_id = u.node_id();
  call.step = u.step();
  call.round = u.round();
  call.due_step = r.due_step();
  call.payload = u.payload();
  FUSIONRL_ASSIGN_OR_RETURN(
      std::vector<HandedUpdate> got,
      ExchangeUpdatesImpl(std::move(call), u.crc32c(), deadline));
  v1::ExchangeUpdatesResponse response;
  for (HandedUpdate& h : got) {
    v1::GradientUpdate* out = response.add_updates();
    out->set_node_id(h.node_id);
    out->set_step(h.step);
    out->set_round(h.round);
    out->set_payload(std::move(h.payload));
    out->set_crc32c(h.crc32c);
  }
  return response;
}

}  // namespace fusionrl
