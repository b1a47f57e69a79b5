// HierarchicalSync: the data-parallel collective of a card that may share
// its job with cards of other nodes. A sum is taken first over the node's
// cards (c10d, `local`), then over the nodes by the node's first card
// (run.data_plane: through the controller's WorkService.Reduce, or over a
// c10d group of the nodes' first cards), and handed back to the node's
// other cards through one more local sum. Every node receives the same bytes
// (the controller sums in node order; Gloo's ring hands every rank the same
// result), so all replicas stay identical.
//
// A round the controller refuses with ABORTED (the step's attempt was
// abandoned because a node was lost) becomes an Aborted status on every card
// of the node, at the same collective, so the cards roll back together.
#ifndef FUSIONRL_WORKER_HIER_SYNC_H_
#define FUSIONRL_WORKER_HIER_SYNC_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/collectives/grad_sync.h"
#include "worker/work_client.h"

namespace fusionrl {

// Sends one round's payload to the controller and returns the sum over the
// attempt's nodes: (round, dtype, payload) -> sum.
using CrossNodeReduce = std::function<absl::StatusOr<std::string>(
    int64_t round, ReduceDtype dtype, std::string payload)>;

// StaleSync across super nodes: hands this node's update of (step, round)
// to the controller (WorkService.ExchangeUpdates) and returns the other
// super nodes' updates received, oldest first per node.
using CrossNodeExchange =
    std::function<absl::StatusOr<std::vector<ReceivedUpdate>>(
        int64_t step, int64_t round, int64_t due_step, std::string payload)>;

// The c10d data plane: forms the cross-node group of rendezvous generation
// `generation`, in which this node is rank `node_rank` of `nodes`.
using CrossNodeGroupFactory =
    std::function<absl::StatusOr<std::unique_ptr<GradientSync>>(
        int64_t generation, int node_rank, int nodes)>;

class HierarchicalSync final : public GradientSync {
 public:
  // `local`: the node's c10d group (null for one card), borrowed.
  // `reduce` and `form_group` are called by local rank 0 only.
  HierarchicalSync(GradientSync* local, int local_rank, CrossNodeReduce reduce,
                   CrossNodeExchange exchange = nullptr,
                   CrossNodeGroupFactory form_group = nullptr);

  // Starts an attempt: global rank and world, number of nodes; rounds are
  // numbered from 0 again. With `data_plane` set (run.data_plane = c10d),
  // the cross-node sums go through the c10d group of that rendezvous
  // generation (kept from the previous attempt when the generation is the
  // same, formed at the first sum otherwise) instead of the controller; a
  // failure of the group surfaces as Aborted on every card of the node (the
  // attempt is replanned) and the group is dropped.
  struct DataPlane {
    int64_t generation = 0;
    int node_rank = 0;
  };
  void BeginAttempt(int rank, int world_size, int nodes,
                    std::optional<DataPlane> data_plane = std::nullopt);

  // Starts a step of a StaleSync job (plan.exchange_updates): every sum
  // stays inside the node (rank and world are the node's), except the
  // gradients: ReduceGradients() sums them over the node's cards, card 0
  // exchanges the node's sum with the other super nodes' for `step` and
  // applies (own + every other update received) / nodes, so each super
  // node's update is applied once by every node, at most k steps late.
  //
  // Without `data_plane` the exchange goes through the controller
  // (WorkService.ExchangeUpdates: the others' updates that arrived, up to
  // this step, at least those of `due_step`). With it (run.data_plane =
  // c10d) the node's update of (step, round) is summed over the nodes by
  // an asynchronous all-reduce of the generation's group, started at once
  // and waited for only when a later step's round applies it: round r of
  // step t applies exactly the sums of (due_step, r) and before, i.e. the
  // others' part of each, S - own. What a node applies then depends on
  // no arrival order, so a run is the same bit for bit however its nodes'
  // timing falls.
  void BeginSkewedStep(int64_t step, int64_t due_step, int nodes,
                       std::optional<DataPlane> data_plane = std::nullopt);

  // A StaleSync job's weight sync on the c10d data plane: every card of
  // every node but the lead's (node rank 0) gets `state` of the lead's
  // card `source` (its local rank; 0 unless expert shards differ by card),
  // through a broadcast inside the lead node (source > 0), one over the
  // nodes' group and one inside each node; the lead's cards keep theirs.
  // Call on every card of the attempt with the sums of every round in hand
  // (a sync step waits for all).
  absl::Status BroadcastFromLead(std::string& state, int source = 0);

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  absl::Status AllReduceSum(std::vector<at::Tensor>& tensors) override;
  bool ExchangesGradients() const override { return skewed_ || world_ > 1; }
  bool AddsOtherNodesUpdates() const override { return skewed_ && nodes_ > 1; }
  absl::Status ReduceGradients(std::vector<at::Tensor>& grads) override;

  // Told when a cross-node round starts ("all-reduce" or "update
  // exchange", round) and ends (nullptr, -1): what the card is doing, for
  // heartbeats and the controller's watchdog.
  using ActivityHook = std::function<void(const char* what, int64_t round)>;
  void set_activity_hook(ActivityHook hook) { activity_ = std::move(hook); }

  // Sums small flags over the node's cards only (no controller round); used
  // to share the outcome of the end-of-step call.
  absl::Status LocalSum(std::vector<double>& values);

  // Time this card spent in cross-node rounds (the controller's Reduce, as
  // seen by card 0; the local hand-over for the others) and the payload
  // bytes sent, since BeginAttempt.
  double cross_node_seconds() const { return cross_node_seconds_; }
  int64_t cross_node_bytes() const { return cross_node_bytes_; }
  int64_t rounds() const { return round_; }
  // StaleSync steps, since BeginSkewedStep: updates of other super nodes
  // applied, and how many steps behind this one the oldest of them was.
  int64_t updates_received() const { return updates_received_; }
  int64_t max_update_lag() const { return max_update_lag_; }

 private:
  // After card 0 computed the node's result into `flat` (and `outcome`:
  // ok / aborted / failed, with `error`), hands both to the node's other
  // cards and maps the outcome to a status; `what` names the round.
  absl::Status ShareFromCardZero(at::Tensor& flat, double outcome,
                                 const std::string& error, const char* what);

  // Card 0 with the c10d data plane: the node's sum of `flat` across the
  // nodes, in place, through the generation's group (formed if needed).
  absl::Status CrossNodeAllReduce(at::Tensor& flat);
  // Card 0 with the c10d data plane: the generation's group, formed at
  // the first use.
  absl::Status EnsureCrossGroup();
  // Card 0, StaleSync on the c10d data plane: starts the sum of this
  // node's update `flat` and adds the others' part of every sum due now.
  absl::Status SkewedC10dExchange(at::Tensor& flat, int64_t round);
  // Drops the group and every sum in flight on it.
  void DropCrossGroup();

  GradientSync* local_;
  int local_rank_;
  CrossNodeReduce reduce_;
  CrossNodeExchange exchange_;
  CrossNodeGroupFactory form_group_;
  ActivityHook activity_;
  std::optional<DataPlane> data_plane_;
  // Card 0: the cross-node group and the generation it was formed for.
  std::unique_ptr<GradientSync> cross_;
  int64_t cross_generation_ = -1;
  // StaleSync on the c10d data plane: sums started and not applied yet,
  // in the order started (increasing (step, round)).
  struct InFlight {
    int64_t step = 0;
    int64_t round = 0;
    at::Tensor own;  // this node's update
    at::Tensor sum;  // summed over the nodes, in place
    int64_t ticket = 0;
  };
  std::deque<InFlight> in_flight_;
  bool skewed_ = false;
  int64_t step_ = 0;
  int64_t due_step_ = 0;
  int64_t updates_received_ = 0;
  int64_t max_update_lag_ = 0;
  int rank_ = 0;
  int world_ = 1;
  int nodes_ = 1;
  int64_t round_ = 0;
  double cross_node_seconds_ = 0;
  int64_t cross_node_bytes_ = 0;
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_HIER_SYNC_H_
