// absl::Status <-> grpc::Status. The canonical codes are the same numbers in
// both, so errors cross the wire unchanged (code and message).
#ifndef FUSIONRL_RPC_STATUS_CONVERT_H_
#define FUSIONRL_RPC_STATUS_CONVERT_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace fusionrl::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace fusionrl::rpc

#endif  // FUSIONRL_RPC_STATUS_CONVERT_H_
