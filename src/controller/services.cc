#include "controller/services.h"

#include <algorithm>
#include <chrono>

#include "absl/time/clock.h"
#include "controller/job_manager_proto.h"
#include "core/clock.h"
#include "rpc/auth.h"
#include "rpc/status_convert.h"

namespace fusionrl {
namespace {

using rpc::CheckAuth;
using rpc::ToGrpcStatus;

// What is left of the call's own deadline (InfiniteDuration when it has
// none). gRPC deadlines are wall-clock times: read here, at the edge, and
// handed on as a duration, which the manager measures on its own clock.
absl::Duration CallTimeout(const grpc::ServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteDuration();
  }
  return std::max(absl::ZeroDuration(),
                  absl::FromChrono(deadline) - absl::Now());
}

grpc::Status CheckId(const std::string& value, const char* field) {
  if (value.empty() || value.size() > 128) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        std::string(field) + ": must be 1..128 characters");
  }
  return grpc::Status::OK;
}

#define FUSIONRL_GRPC_RETURN_IF_ERROR(expr) \
  do {                                      \
    grpc::Status _st = (expr);              \
    if (!_st.ok()) return _st;              \
  } while (0)

}  // namespace

JobServiceImpl::JobServiceImpl(JobManager& jobs, std::string auth_token,
                               std::function<v1::ClusterStatus()> cluster)
    : jobs_(jobs),
      auth_token_(std::move(auth_token)),
      cluster_(std::move(cluster)) {}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* context,
                                       const v1::SubmitJobRequest* request,
                                       v1::SubmitJobResponse* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  absl::StatusOr<std::string> id = rpc::SubmitJob(jobs_, *request);
  if (!id.ok()) return ToGrpcStatus(id.status());
  response->set_job_id(*id);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJobStatus(
    grpc::ServerContext* context, const v1::GetJobStatusRequest* request,
    v1::JobStatus* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->job_id(), "job_id"));
  absl::StatusOr<JobStatus> status = jobs_.Status(request->job_id());
  if (!status.ok()) return ToGrpcStatus(status.status());
  *response = rpc::JobStatusToProto(*status);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::WatchJob(
    grpc::ServerContext* context, const v1::WatchJobRequest* request,
    grpc::ServerWriter<v1::JobStatus>* writer) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->job_id(), "job_id"));
  if (request->min_interval_ms() < 0 || request->min_interval_ms() > 60000) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "min_interval_ms: must be in 0..60000");
  }
  const absl::Duration min_interval =
      absl::Milliseconds(request->min_interval_ms());
  uint64_t seen = ~uint64_t{0};
  // An update at least every 5 s even when nothing changed, so heartbeat
  // ages move and a dead stream is noticed.
  constexpr absl::Duration kRefresh = absl::Seconds(5);
  for (;;) {
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled");
    }
    uint64_t update = 0;
    absl::StatusOr<JobStatus> status = jobs_.WaitForUpdate(
        request->job_id(), seen,
        jobs_.clock().Now() + std::min(CallTimeout(*context), kRefresh),
        &update);
    if (!status.ok()) return ToGrpcStatus(status.status());
    seen = update;
    if (!writer->Write(rpc::JobStatusToProto(*status))) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away");
    }
    if (JobPhaseIsTerminal(status->phase)) return grpc::Status::OK;
    if (min_interval > absl::ZeroDuration()) {
      SleepOnClock(jobs_.clock(), min_interval);
    }
  }
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request,
                                       v1::JobStatus* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->job_id(), "job_id"));
  if (request->reason().size() > 1024) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "reason: at most 1024 characters");
  }
  absl::StatusOr<JobStatus> status =
      jobs_.Cancel(request->job_id(), request->reason());
  if (!status.ok()) return ToGrpcStatus(status.status());
  *response = rpc::JobStatusToProto(*status);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  for (const JobStatus& s : jobs_.List()) {
    *response->add_jobs() = rpc::JobStatusToProto(s);
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetClusterStatus(
    grpc::ServerContext* context, const v1::GetClusterStatusRequest* request,
    v1::ClusterStatus* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  *response = cluster_();
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJobHistory(
    grpc::ServerContext* context, const v1::GetJobHistoryRequest* request,
    v1::JobHistory* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->job_id(), "job_id"));
  if (request->after_seq() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "after_seq: must be >= 0");
  }
  absl::StatusOr<JobHistory> history =
      jobs_.History(request->job_id(), request->after_seq());
  if (!history.ok()) return ToGrpcStatus(history.status());
  *response = rpc::JobHistoryToProto(*history);
  return grpc::Status::OK;
}

WorkServiceImpl::WorkServiceImpl(JobManager& jobs, std::string auth_token)
    : jobs_(jobs), auth_token_(std::move(auth_token)) {}

grpc::Status WorkServiceImpl::GetAssignment(
    grpc::ServerContext* context, const v1::GetAssignmentRequest* request,
    v1::GetAssignmentResponse* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->node_id(), "node_id"));
  absl::StatusOr<v1::GetAssignmentResponse> r =
      rpc::GetAssignment(jobs_, *request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status WorkServiceImpl::GetStepPlan(grpc::ServerContext* context,
                                          const v1::GetStepPlanRequest* request,
                                          v1::StepPlan* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->job_id(), "job_id"));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->node_id(), "node_id"));
  absl::StatusOr<v1::StepPlan> plan = rpc::GetStepPlan(jobs_, *request);
  if (!plan.ok()) return ToGrpcStatus(plan.status());
  *response = *std::move(plan);
  return grpc::Status::OK;
}

grpc::Status WorkServiceImpl::ExchangeUpdates(
    grpc::ServerContext* context, const v1::ExchangeUpdatesRequest* request,
    v1::ExchangeUpdatesResponse* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->job_id(), "job_id"));
  FUSIONRL_GRPC_RETURN_IF_ERROR(
      CheckId(request->update().node_id(), "update.node_id"));
  absl::StatusOr<v1::ExchangeUpdatesResponse> got =
      rpc::ExchangeUpdates(jobs_, *request, CallTimeout(*context));
  if (!got.ok()) return ToGrpcStatus(got.status());
  *response = *std::move(got);
  return grpc::Status::OK;
}

grpc::Status WorkServiceImpl::Store(grpc::ServerContext* context,
                                    const v1::StoreRequest* request,
                                    v1::StoreResponse* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->job_id(), "job_id"));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->node_id(), "node_id"));
  absl::StatusOr<v1::StoreResponse> got =
      rpc::Store(jobs_, *request, CallTimeout(*context));
  if (!got.ok()) return ToGrpcStatus(got.status());
  *response = *std::move(got);
  return grpc::Status::OK;
}

grpc::Status WorkServiceImpl::Reduce(grpc::ServerContext* context,
                                     const v1::ReduceRequest* request,
                                     v1::ReduceResponse* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->job_id(), "job_id"));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->node_id(), "node_id"));
  absl::StatusOr<std::string> sum =
      rpc::Reduce(jobs_, *request, CallTimeout(*context));
  if (!sum.ok()) return ToGrpcStatus(sum.status());
  *response->mutable_payload() = *std::move(sum);
  return grpc::Status::OK;
}

grpc::Status WorkServiceImpl::FinishStep(grpc::ServerContext* context,
                                         const v1::FinishStepRequest* request,
                                         v1::FinishStepResponse* response) {
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckAuth(*context, auth_token_));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->job_id(), "job_id"));
  FUSIONRL_GRPC_RETURN_IF_ERROR(CheckId(request->node_id(), "node_id"));
  if (request->metrics_json().size() > (1 << 20)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "metrics_json: at most 1 MiB");
  }
  absl::StatusOr<v1::FinishStepResponse> r =
      rpc::FinishStep(jobs_, *request, CallTimeout(*context));
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

}  // namespace fusionrl
