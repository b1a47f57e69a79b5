// Placement policy: which cards a job gets and what each card does.
#ifndef FUSIONRL_CONTROLLER_SCHEDULER_H_
#define FUSIONRL_CONTROLLER_SCHEDULER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/card_role.h"
#include "core/node_registry.h"
#include "fusionrl/config.h"

namespace fusionrl {

struct CardAssignment {
  std::string node_id;  // NodeView::id
  int card_index = 0;   // CardSpec::index within that node
  CardRole role = CardRole::kColocated;
};

struct SuperNodeAssignment {
  std::string super_node;
  std::vector<CardAssignment> cards;  // (node id, card index) order
};

struct Placement {
  // In order of preference: most free cards first, ties by name.
  std::vector<SuperNodeAssignment> super_nodes;
};

// A card already given to another job: (node id, card index).
using CardKey = std::pair<std::string, int>;
using BusyCards = absl::flat_hash_set<CardKey>;

// Place: the placement policy. A pure function of its arguments (no state,
// no clock), so it is safe from any thread and deterministic: the same inputs
// (in any order of `nodes`) give the same Placement.
//
// The free cards are those of alive nodes (kLost is ignored) that are not in
// `busy`; they are grouped by NodeSpec::super_node. The policy picks
// `request.super_nodes` super nodes that each have at least
// `request.cards_per_super_node` free cards, preferring those with more free
// cards, ties by name, and takes the first cards_per_super_node free cards of
// each in (node id, card index) order; it does not try to pack cards onto
// few nodes. Roles: colocated-sync -> kColocated on every card; fused ->
// kFused; disaggregated -> the first rollout_cards_per_super_node cards of
// each super node kRollout, the rest kTrain.
//
// Errors:
//   InvalidArgument: `request` breaks the rules ValidateJobConfig() applies
//     to the placement section (a mode outside PlacementMode, counts out
//     of range).
//   FailedPrecondition: not enough capacity now; the message says what is
//     needed and what exists, e.g. "placement needs 2 super node(s) with 2
//     card(s) each; alive: sn-a (3 cards on node-1), sn-b (1 free of 2
//     cards on node-2, node-5); 1 lost node(s) ignored". The caller shows it
//     in status while the job waits, or fails the job if
//     request.fail_if_unplaceable.
absl::StatusOr<Placement> Place(const PlacementConfig& request,
                                const std::vector<NodeView>& nodes,
                                const BusyCards& busy);

// Same, with no card busy.
absl::StatusOr<Placement> Place(const PlacementConfig& request,
                                const std::vector<NodeView>& nodes);

// "sn-a: node-1/0 rollout, node-1/1 train; sn-b: ...", for logs and status.
std::string PlacementDebugString(const Placement& placement);

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_SCHEDULER_H_
