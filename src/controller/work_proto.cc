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
#include "rpc/step_protocol_proto.h"

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

}  // namespace

absl::StatusOr<v1::GetAssignmentResponse> JobManager::GetAssignment(
    const v1::GetAssignmentRequest& request) {
  FUSIONRL_RETURN_IF_ERROR(CheckWaitMs(request.wait_ms(), "wait_ms"));
  FUSIONRL_ASSIGN_OR_RETURN(
      Assignment a,
      GetAssignment(request.node_id(), absl::Milliseconds(request.wait_ms())));
  return rpc::AssignmentToProto(a);
}

absl::StatusOr<v1::StepPlan> JobManager::GetStepPlan(
    const v1::GetStepPlanRequest& r) {
  FUSIONRL_RETURN_IF_ERROR(CheckWaitMs(r.wait_ms(), "wait_ms"));
  FUSIONRL_ASSIGN_OR_RETURN(
      StepPlan plan, GetStepPlan(r.job_id(), r.node_id(), r.local_rank(),
                                 r.step(), absl::Milliseconds(r.wait_ms())));
  return rpc::StepPlanToProto(plan);
}

absl::StatusOr<std::string> JobManager::Reduce(const v1::ReduceRequest& r,
                                               absl::Time deadline) {
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
  return ReduceImpl(std::move(call), deadline);
}

absl::StatusOr<v1::FinishStepResponse> JobManager::FinishStep(
    const v1::FinishStepRequest& request, absl::Time deadline) {
  ReportedStep r;
  r.report = rpc::StepReportFromProto(request);
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
  static_cast<StepCallHeader&>(call) = {r.job_id(), u.node_id(), u.step(),
                                        r.attempt(), u.round()};
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

absl::StatusOr<v1::StoreResponse> JobManager::Store(
    const v1::StoreRequest& request, absl::Time deadline) {
  FUSIONRL_ASSIGN_OR_RETURN(StoreCall call, rpc::StoreCallFromProto(request));
  FUSIONRL_ASSIGN_OR_RETURN(StoreReply reply,
                            Store(call, deadline - clock_.Now()));
  v1::StoreResponse response;
  response.set_value(std::move(reply.value));
  response.set_number(reply.number);
  response.set_flag(reply.flag);
  return response;
}

}  // namespace fusionrl
