// JobManager at the wire (job_manager_proto.h).
#include "controller/job_manager_proto.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "fusionrl/config.h"
#include "rpc/enum_proto.h"
#include "rpc/step_protocol_proto.h"

namespace fusionrl::rpc {
namespace {

constexpr int kMaxWaitMs = 60000;
constexpr size_t kMaxConfigBytes = 4 << 20;

absl::Status CheckWaitMs(int32_t wait_ms, const char* field) {
  if (wait_ms < 0 || wait_ms > kMaxWaitMs) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be in 0..", kMaxWaitMs, ", got ", wait_ms));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SubmitJob(JobManager& jobs,
                                      const v1::SubmitJobRequest& request) {
  if (request.config_yaml().empty()) {
    return absl::InvalidArgumentError("config_yaml: empty job description");
  }
  if (request.config_yaml().size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("config_yaml: ", request.config_yaml().size(),
                     " bytes; a job description is at most 4 MiB"));
  }
  const std::string source =
      request.source_name().empty() ? "<submitted>" : request.source_name();
  std::vector<std::string> overrides(request.overrides().begin(),
                                     request.overrides().end());
  JobSubmission submission;
  FUSIONRL_ASSIGN_OR_RETURN(
      submission.config,
      ParseJobConfig(request.config_yaml(), source, overrides));
  submission.resume = request.resume();
  return jobs.Submit(std::move(submission));
}

v1::CardState CardReportToProto(const CardReport& card) {
  v1::CardState out;
  out.set_index(card.index);
  out.set_role(CardRoleToProto(card.role));
  out.set_busy_fraction(card.busy_fraction);
  for (const auto& [book, bytes] : card.memory_bytes) {
    (*out.mutable_memory_bytes())[book] = bytes;
  }
  out.set_activity(card.activity);
  out.set_activity_seconds(card.activity_seconds);
  return out;
}

CardReport CardReportFromProto(const v1::CardState& card) {
  CardReport out;
  out.index = card.index();
  out.role = CardRoleFromProto(card.role());
  out.busy_fraction = card.busy_fraction();
  out.memory_bytes.insert(card.memory_bytes().begin(),
                          card.memory_bytes().end());
  out.activity = card.activity();
  out.activity_seconds = card.activity_seconds();
  return out;
}

v1::JobEvent JobEventToProto(const JobEvent& event) {
  v1::JobEvent out;
  out.set_time_us(absl::ToUnixMicros(event.time));
  out.set_text(event.text);
  return out;
}

JobEvent JobEventFromProto(const v1::JobEvent& event) {
  return {absl::FromUnixMicros(event.time_us()), event.text()};
}

v1::NodeStatus NodeStatusToProto(const NodeStatus& node) {
  v1::NodeStatus n;
  n.set_node_id(node.node_id);
  n.set_host(node.host);
  n.set_super_node(node.super_node);
  n.set_state(node.state);
  n.set_heartbeat_age_ms(absl::ToInt64Milliseconds(node.heartbeat_age));
  for (const CardReport& c : node.cards) *n.add_cards() = CardReportToProto(c);
  n.set_clock(node.clock);
  n.set_job_id(node.job_id);
  n.set_version(node.version);
  for (const CardSpec& card : node.card_specs) {
    v1::Card* spec = n.add_card_specs();
    spec->set_index(card.index);
    spec->set_device(card.device);
    spec->set_memory_bytes(card.memory_bytes);
  }
  return n;
}

v1::JobStatus JobStatusToProto(const JobStatus& status) {
  v1::JobStatus s;
  s.set_job_id(status.job_id);
  s.set_name(status.name);
  s.set_phase(JobPhaseToProto(status.phase));
  s.set_message(status.message);
  s.set_step(status.step);
  s.set_total_steps(status.total_steps);
  s.set_policy_version(status.policy_version);
  s.set_reward_mean(status.reward_mean);
  s.set_train_accuracy(status.train_accuracy);
  s.set_initial_eval_accuracy(status.initial_eval_accuracy);
  s.set_eval_accuracy(status.eval_accuracy);
  s.set_rollout_tokens(status.rollout_tokens);
  s.set_tokens_per_second(status.tokens_per_second);
  s.set_groups_submitted(status.groups_submitted);
  s.set_groups_trained(status.groups_trained);
  s.set_groups_requeued(status.groups_requeued);
  s.set_submitted_at_us(absl::ToUnixMicros(status.submitted_at));
  s.set_updated_at_us(absl::ToUnixMicros(status.updated_at));
  for (const NodeStatus& node : status.nodes) {
    *s.add_nodes() = NodeStatusToProto(node);
    for (const CardReport& card : node.cards) {
      v1::CardStatus* cs = s.add_cards();
      cs->set_node_id(node.node_id);
      *cs->mutable_state() = CardReportToProto(card);
    }
  }
  for (const JobEvent& e : status.events) *s.add_events() = JobEventToProto(e);
  s.set_summary_json(status.summary_json);
  s.set_error_code(status.error_code);
  s.set_max_clock_skew(status.max_clock_skew);
  s.set_max_clock_skew_seen(status.max_clock_skew_seen);
  s.set_last_metrics_json(status.last_metrics_json);
  s.set_controller_tensor_bytes(status.controller_tensor_bytes);
  s.set_placement(status.placement);
  return s;
}

v1::ClusterStatus ClusterToProto(const ClusterView& cluster) {
  v1::ClusterStatus out;
  for (const NodeStatus& n : cluster.nodes) {
    *out.add_nodes() = NodeStatusToProto(n);
  }
  for (const JobStatus& j : cluster.jobs) *out.add_jobs() = JobStatusToProto(j);
  return out;
}

v1::StepRecord HistoryRecordToProto(const HistoryRecord& record) {
  v1::StepRecord r;
  r.set_seq(record.seq);
  r.set_step(record.step);
  r.set_time_us(absl::ToUnixMicros(record.time));
  r.set_metrics_json(record.metrics_json);
  r.set_eval_accuracy(record.eval_accuracy);
  r.set_checkpoint_dir(record.checkpoint_dir);
  return r;
}

v1::JobHistory JobHistoryToProto(const JobHistory& history) {
  v1::JobHistory out;
  out.set_first_seq(history.first_seq);
  for (const HistoryRecord& r : history.records) {
    *out.add_records() = HistoryRecordToProto(r);
  }
  return out;
}

absl::StatusOr<v1::GetAssignmentResponse> GetAssignment(
    JobManager& jobs, const v1::GetAssignmentRequest& request) {
  FUSIONRL_RETURN_IF_ERROR(CheckWaitMs(request.wait_ms(), "wait_ms"));
  FUSIONRL_ASSIGN_OR_RETURN(
      Assignment a, jobs.GetAssignment(request.node_id(),
                                       absl::Milliseconds(request.wait_ms())));
  return AssignmentToProto(a);
}

absl::StatusOr<v1::StepPlan> GetStepPlan(JobManager& jobs,
                                         const v1::GetStepPlanRequest& r) {
  FUSIONRL_RETURN_IF_ERROR(CheckWaitMs(r.wait_ms(), "wait_ms"));
  FUSIONRL_ASSIGN_OR_RETURN(
      StepPlan plan,
      jobs.GetStepPlan(r.job_id(), r.node_id(), r.local_rank(), r.step(),
                       absl::Milliseconds(r.wait_ms())));
  return StepPlanToProto(plan);
}

absl::StatusOr<std::string> Reduce(JobManager& jobs, const v1::ReduceRequest& r,
                                   absl::Duration timeout) {
  if (r.dtype() != v1::REDUCE_DTYPE_FLOAT32 &&
      r.dtype() != v1::REDUCE_DTYPE_FLOAT64) {
    return absl::InvalidArgumentError("dtype: must be FLOAT32 or FLOAT64");
  }
  ReduceCall call;
  static_cast<StepCallHeader&>(call) = {r.job_id(), r.node_id(), r.step(),
                                        r.attempt(), r.round()};
  call.dtype = r.dtype() == v1::REDUCE_DTYPE_FLOAT64 ? ReduceDtype::kFloat64
                                                     : ReduceDtype::kFloat32;
  call.payload = r.payload();
  return jobs.Reduce(std::move(call), timeout);
}

absl::StatusOr<v1::FinishStepResponse> FinishStep(
    JobManager& jobs, const v1::FinishStepRequest& request,
    absl::Duration timeout) {
  FUSIONRL_ASSIGN_OR_RETURN(bool committed,
                            jobs.FinishStep(StepReportFromProto(request),
                                            request.metrics_json(), timeout));
  v1::FinishStepResponse response;
  response.set_committed(committed);
  return response;
}

absl::StatusOr<v1::ExchangeUpdatesResponse> ExchangeUpdates(
    JobManager& jobs, const v1::ExchangeUpdatesRequest& r,
    absl::Duration timeout) {
  const v1::GradientUpdate& u = r.update();
  UpdateCall call;
  static_cast<StepCallHeader&>(call) = {r.job_id(), u.node_id(), u.step(),
                                        r.attempt(), u.round()};
  call.due_step = r.due_step();
  call.payload = u.payload();
  call.crc32c = u.crc32c();
  FUSIONRL_ASSIGN_OR_RETURN(std::vector<ReceivedUpdate> got,
                            jobs.ExchangeUpdates(std::move(call), timeout));
  v1::ExchangeUpdatesResponse response;
  for (ReceivedUpdate& h : got) {
    v1::GradientUpdate* out = response.add_updates();
    out->set_node_id(h.node_id);
    out->set_step(h.step);
    out->set_round(h.round);
    out->set_payload(std::move(h.payload));
    out->set_crc32c(h.crc32c);
  }
  return response;
}

absl::StatusOr<v1::StoreResponse> Store(JobManager& jobs,
                                        const v1::StoreRequest& request,
                                        absl::Duration timeout) {
  FUSIONRL_ASSIGN_OR_RETURN(StoreCall call, StoreCallFromProto(request));
  FUSIONRL_ASSIGN_OR_RETURN(StoreReply reply, jobs.Store(call, timeout));
  v1::StoreResponse response;
  response.set_value(std::move(reply.value));
  response.set_number(reply.number);
  response.set_flag(reply.flag);
  return response;
}

}  // namespace fusionrl::rpc
