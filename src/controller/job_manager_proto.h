// JobManager at the wire: the conversions between the gRPC services' v1::
// messages and the manager's plain structs (core/step_protocol.h,
// controller/job_view.h). The services (services.cc), the dashboard and
// Prometheus exports and the state journal call these; the manager itself
// never sees a v1:: message.
//
// The WorkService calls check what only the wire can get wrong (wait_ms
// ranges, an unset dtype, the YAML of a submission), convert, run the
// manager's typed entry point with the call's `timeout` (what is left of
// its gRPC deadline; the job's collective timeout applies as well), and
// convert the answer back.
#ifndef FUSIONRL_CONTROLLER_JOB_MANAGER_PROTO_H_
#define FUSIONRL_CONTROLLER_JOB_MANAGER_PROTO_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/job_manager.h"
#include "controller/job_view.h"
#include "fusionrl/v1/common.pb.h"
#include "fusionrl/v1/job.pb.h"
#include "fusionrl/v1/work.pb.h"
#include "rpc/enum_proto.h"

namespace fusionrl::rpc {

// --- JobService -------------------------------------------------------------
// Parses and validates the YAML (InvalidArgument / NotFound with the key,
// as `fusionrl validate`; at most 4 MiB), then JobManager::Submit.
absl::StatusOr<std::string> SubmitJob(JobManager& jobs,
                                      const v1::SubmitJobRequest& request);

v1::CardState CardReportToProto(const CardReport& card);
CardReport CardReportFromProto(const v1::CardState& card);
v1::JobEvent JobEventToProto(const JobEvent& event);
JobEvent JobEventFromProto(const v1::JobEvent& event);
v1::NodeStatus NodeStatusToProto(const NodeStatus& node);
// Also fills the flat `cards` list from the nodes' cards.
v1::JobStatus JobStatusToProto(const JobStatus& status);
// Version, time and uptime are left for the caller.
v1::ClusterStatus ClusterToProto(const ClusterView& cluster);
v1::StepRecord HistoryRecordToProto(const HistoryRecord& record);
v1::JobHistory JobHistoryToProto(const JobHistory& history);

// --- WorkService ------------------------------------------------------------
absl::StatusOr<v1::GetAssignmentResponse> GetAssignment(
    JobManager& jobs, const v1::GetAssignmentRequest& request);
absl::StatusOr<v1::StepPlan> GetStepPlan(JobManager& jobs,
                                         const v1::GetStepPlanRequest& request);
absl::StatusOr<std::string> Reduce(JobManager& jobs,
                                   const v1::ReduceRequest& request,
                                   absl::Duration timeout);
// The lead's metrics come as metrics_json (a JSON object), kept as sent.
absl::StatusOr<v1::FinishStepResponse> FinishStep(
    JobManager& jobs, const v1::FinishStepRequest& request,
    absl::Duration timeout);
// The update's CRC-32C is checked (DataLoss).
absl::StatusOr<v1::ExchangeUpdatesResponse> ExchangeUpdates(
    JobManager& jobs, const v1::ExchangeUpdatesRequest& request,
    absl::Duration timeout);
absl::StatusOr<v1::StoreResponse> Store(JobManager& jobs,
                                        const v1::StoreRequest& request,
                                        absl::Duration timeout);

}  // namespace fusionrl::rpc

#endif  // FUSIONRL_CONTROLLER_JOB_MANAGER_PROTO_H_
