// The step protocol's plain structs (core/step_protocol.h) <-> their
// WorkService messages (proto/fusionrl/v1/work.proto), both directions in
// one place: the worker's GrpcWorkClient and the controller's WorkService
// edge (controller/job_manager_proto.cc) use the same conversions.
#ifndef FUSIONRL_RPC_STEP_PROTOCOL_PROTO_H_
#define FUSIONRL_RPC_STEP_PROTOCOL_PROTO_H_

#include "absl/status/statusor.h"
#include "core/step_protocol.h"
#include "fusionrl/v1/work.pb.h"

namespace fusionrl::rpc {

v1::StepPlan StepPlanToProto(const StepPlan& plan);
// An unknown plan kind becomes kWait (callers check the kind first).
StepPlan StepPlanFromProto(const v1::StepPlan& plan);

v1::GetAssignmentResponse AssignmentToProto(const Assignment& assignment);
Assignment AssignmentFromProto(const v1::GetAssignmentResponse& assignment);

// Typed metrics go on the wire as metrics_json (formatted once, here).
v1::FinishStepRequest StepReportToProto(const StepReport& report);
// Leaves `metrics` empty: the wire's metrics_json is the receiver's to read.
StepReport StepReportFromProto(const v1::FinishStepRequest& report);

v1::StoreRequest StoreCallToProto(const StoreCall& call);
// InvalidArgument on an unknown operation.
absl::StatusOr<StoreCall> StoreCallFromProto(const v1::StoreRequest& request);

}  // namespace fusionrl::rpc

#endif  // FUSIONRL_RPC_STEP_PROTOCOL_PROTO_H_
