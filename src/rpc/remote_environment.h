// `env.name: remote`: an Environment whose episodes live in environment
// servers reached over gRPC (proto/fusionrl/v1/environment.proto,
// docs/agents.md), written in any language; examples/env_server/ has a
// Python one.
//
// env.address lists the servers ("host:port[,host:port...]"); each gets one
// channel (plain TCP: environment servers are trusted local services), and
// an episode goes to server `seed % n`, so where an episode runs is as
// reproducible as the episode. Every call carries the deadline it is given;
// failures name the server and the call ("environment server
// 127.0.0.1:5000: Step: DEADLINE_EXCEEDED: ..."), keeping gRPC's code. A
// server that restarts is used again by the next call (its open episodes
// are lost: their Steps fail NOT_FOUND or UNAVAILABLE).
#ifndef FUSIONRL_RPC_REMOTE_ENVIRONMENT_H_
#define FUSIONRL_RPC_REMOTE_ENVIRONMENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "fusionrl/config.h"
#include "fusionrl/environment.h"

namespace fusionrl::rpc {

// InvalidArgument (naming env.address) when config.address is empty or an
// entry is not host:port. Connects lazily: an unreachable server fails the
// calls, not this.
absl::StatusOr<std::unique_ptr<Environment>> MakeRemoteEnvironment(
    const EnvConfig& config);

// Registers "remote" -> MakeRemoteEnvironment in
// EnvironmentRegistry::Global() (which lives in fusionrl_tasks, below the
// gRPC layer, so it cannot do this itself). Idempotent and thread-safe;
// call it before the job's environment is created.
void RegisterRemoteEnvironment();

}  // namespace fusionrl::rpc

#endif  // FUSIONRL_RPC_REMOTE_ENVIRONMENT_H_
