// Shared-token authentication for every FusionRL RPC.
//
// With a token configured, each call must carry the metadata
// "authorization: Bearer <token>"; calls without it (or with another token)
// get UNAUTHENTICATED before any work is done. The token is compared in
// constant time. Health checking and reflection stay open, so load
// balancers and generic clients can probe the server.
//
// The token travels in clear text unless the channel uses TLS
// (docs/cluster.md); on an untrusted network use both.
#ifndef FUSIONRL_RPC_AUTH_H_
#define FUSIONRL_RPC_AUTH_H_

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusionrl::rpc {

inline constexpr char kAuthMetadataKey[] = "authorization";

// OK when `token` is empty (authentication off) or the call carries it.
grpc::Status CheckAuth(const grpc::ServerContextBase& context,
                       const std::string& token);

// a == b, in time that depends on the lengths only (token checks; the
// controller's HTTP endpoints use it too).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Adds the token to an outgoing call (nothing when `token` is empty).
void AttachToken(grpc::ClientContext& context, const std::string& token);

// The token from a file (first line, surrounding whitespace removed) or,
// when `file` is empty, from the environment variable `env` ("" when both
// are empty: no authentication). NotFound / InvalidArgument with the name
// of the file or variable when it is missing or empty.
absl::StatusOr<std::string> LoadToken(const std::string& file,
                                      const std::string& env);

}  // namespace fusionrl::rpc

#endif  // FUSIONRL_RPC_AUTH_H_
