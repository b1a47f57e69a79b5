// Client helpers for fusionrl.v1.WeightService: publish one version as a
// stream of checked chunks, fetch one version and check it end to end.
//
// Both are blocking calls on the caller's thread, each under a deadline the
// caller gives (a call never waits longer), with the shared token when
// `auth_token` is set (rpc/auth.h); errors keep the server's code
// and message, prefixed with what was being done:
// "FetchWeights(job-1 version 2): job-1 has no version 2; kept: 4, 5, 6".
//
// Thread safety: a Stub may be shared; concurrent calls are independent.
#ifndef FUSIONRL_RPC_WEIGHT_CLIENT_H_
#define FUSIONRL_RPC_WEIGHT_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "fusionrl/v1/weight.grpc.pb.h"

namespace fusionrl::rpc {

// Uploads `bytes` as `version` of `job_id` from `super_node`, in chunks of
// `chunk_bytes` (the last may be shorter; an empty version is one chunk),
// each with its CRC-32C, the last with the size and CRC-32C of the whole.
// OK once the server stored the version (or already held it identically).
//   InvalidArgument: chunk_bytes outside [1, kMaxWeightChunkBytes] or a
//     deadline that is not finite and positive (nothing is sent);
//   otherwise the server's status (weight_service.h lists the codes), or
//   DEADLINE_EXCEEDED / UNAVAILABLE from gRPC.
absl::Status PublishWeights(fusionrl::v1::WeightService::StubInterface& stub,
                            const std::string& job_id, int64_t version,
                            const std::string& super_node,
                            absl::string_view bytes, size_t chunk_bytes,
                            absl::Duration deadline,
                            const std::string& auth_token = "");

// Downloads `version` of `job_id` (0 = the newest) and returns its bytes;
// sets *version_out (when not null) to the version received. Checks every
// chunk as it arrives (fields, offsets, CRC-32C) and the whole version's size
// and CRC-32C; any mismatch cancels the call and returns DataLoss naming the
// chunk offset, as does a stream that ends without its last chunk.
//   InvalidArgument: a deadline that is not finite and positive;
//   otherwise the server's status (NOT_FOUND names the kept versions), or
//   DEADLINE_EXCEEDED / UNAVAILABLE from gRPC.
// The channel's receive limit must fit the server's chunks (4 MiB by
// default, enough for chunks up to about 4 MiB - 64 KiB).
absl::StatusOr<std::string> FetchWeights(
    fusionrl::v1::WeightService::StubInterface& stub, const std::string& job_id,
    int64_t version, absl::Duration deadline, int64_t* version_out,
    const std::string& auth_token = "");

}  // namespace fusionrl::rpc

#endif  // FUSIONRL_RPC_WEIGHT_CLIENT_H_
