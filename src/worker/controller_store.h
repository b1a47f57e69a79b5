// The cross-node group of the c10d data plane: the first cards of a job's
// super nodes form a c10d process group (Gloo on CPU), one rank per node,
// rendezvousing through the controller's store (WorkClient::Store, i.e.
// WorkService.Store over gRPC or JobManager::Store in-process).
//
// Why the controller's store and not a TCPStore: the controller is already
// the one address every worker knows and trusts (its auth token, its
// deadlines), and it alone knows when a group must be re-formed (a node
// lost, an attempt aborted): it closes the old rendezvous generation, which
// wakes every card still waiting in it. Only addresses and counters travel
// through it, a few hundred bytes per card and generation; the controller
// stays free of LibTorch.
#ifndef FUSIONRL_WORKER_CONTROLLER_STORE_H_
#define FUSIONRL_WORKER_CONTROLLER_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/collectives/grad_sync.h"
#include "worker/work_client.h"

namespace fusionrl {

// Rank `rank` of the `nodes`-rank group of (job_id, generation), formed
// through `client`'s store within `timeout`. Every collective of the group
// probes the generation once it has run for over a second, so a frozen
// peer costs the survivors only the time the controller takes to declare
// it lost (its generation then ends: Aborted).
//
// Borrows `client`, which must outlive the group.
absl::StatusOr<std::unique_ptr<GradientSync>> FormCrossNodeGroup(
    WorkClient* client, const std::string& job_id, const std::string& node_id,
    int64_t generation, int rank, int nodes, absl::Duration timeout);

// Rank `rank` of the `size`-rank group `name` in the job's own rendezvous
// scope (kJobRendezvousScope, open until the job ends): a group formed once,
// when the cards set up, whose members may be cards of several nodes (an
// expert group spanning worker processes). Its collectives probe the job's
// scope, so the job's end stops them; a lost member costs the others at
// most the collective timeout.
//
// Borrows `client`, which must outlive the group.
absl::StatusOr<std::unique_ptr<GradientSync>> FormJobGroup(
    WorkClient* client, const std::string& job_id, const std::string& node_id,
    const std::string& name, int rank, int size, absl::Duration timeout);

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_CONTROLLER_STORE_H_
