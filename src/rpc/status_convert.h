// absl::Status <-> grpc::Status. The canonical codes are the same numbers in
// both, so errors cross the wire unchanged (code and message).
#ifndef FUSIONRL_RPC_STATUS_CONVERT_H_
#define FUSIONRL_RPC_STATUS_CONVERT_H_

#include <grpcpp/support/status.h>

#include <cstddef>

#include "absl/status/status.h"

namespace fusionrl::rpc {

// A status message travels in a header (percent-encoded, so up to 3x
// longer), and clients refuse headers over 8 KiB by default: longer
// messages (an error quoting a caller's huge input) are cut to this many
// bytes, saying how many were cut, so the code still reaches the caller.
inline constexpr size_t kMaxStatusMessageBytes = 2048;

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace fusionrl::rpc

#endif  // FUSIONRL_RPC_STATUS_CONVERT_H_
