#include "controller/scheduler.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace fusionrl {
namespace {

constexpr int kMaxCount = 4096;         // super_nodes, cards_per_super_node
constexpr size_t kMaxListedGroups = 8;  // super nodes named in a reason
constexpr size_t kMaxListedNodes = 4;   // nodes named per super node

// The alive cards of one super node.
struct Group {
  std::string name;
  int total = 0;                                  // alive cards
  std::vector<std::pair<std::string, int>> free;  // (node id, card index)
  std::vector<std::string> node_ids;              // alive nodes, id order
};

// Mirrors the placement rules of ValidateJobConfig(), for requests that did
// not come from a validated JobConfig.
absl::Status CheckRequest(const PlacementConfig& r) {
  if (!ParsePlacementMode(PlacementModeName(r.mode)).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement.mode: not a valid value (", static_cast<int>(r.mode), ")"));
  }
  const bool disaggregated = r.mode == PlacementMode::kDisaggregated;
  if (r.super_nodes < 1 || r.super_nodes > kMaxCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement.super_nodes: must be in [1, ", kMaxCount,
                     "], got ", r.super_nodes));
  }
  if (r.cards_per_super_node < 1 || r.cards_per_super_node > kMaxCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement.cards_per_super_node: must be in [1, ",
                     kMaxCount, "], got ", r.cards_per_super_node));
  }
  if (disaggregated &&
      (r.rollout_cards_per_super_node < 1 ||
       r.rollout_cards_per_super_node > r.cards_per_super_node - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement.rollout_cards_per_super_node: disaggregated needs "
        "1..cards_per_super_node-1 rollout cards, got ",
        r.rollout_cards_per_super_node, " (cards_per_super_node is ",
        r.cards_per_super_node, ")"));
  }
  if (!disaggregated && r.rollout_cards_per_super_node != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement.rollout_cards_per_super_node: must be 0 unless "
                     "placement.mode is disaggregated, got ",
                     r.rollout_cards_per_super_node));
  }
  return absl::OkStatus();
}

std::string Cards(int n) {
  return absl::StrCat(n, n == 1 ? " card" : " cards");
}

// "sn-a (3 cards on node-1)", "sn-b (1 free of 4 cards on node-2, node-3)".
std::string DescribeGroup(const Group& g) {
  const int free = static_cast<int>(g.free.size());
  std::string out = absl::StrCat(g.name, " (");
  if (free == g.total) {
    absl::StrAppend(&out, Cards(g.total));
  } else {
    absl::StrAppend(&out, free, " free of ", Cards(g.total));
  }
  absl::StrAppend(&out, " on ");
  const size_t shown = std::min(g.node_ids.size(), kMaxListedNodes);
  absl::StrAppend(&out, absl::StrJoin(g.node_ids.begin(),
                                      g.node_ids.begin() + shown, ", "));
  if (shown < g.node_ids.size()) {
    absl::StrAppend(&out, " and ", g.node_ids.size() - shown, " more");
  }
  absl::StrAppend(&out, ")");
  return out;
}

std::string UnplaceableReason(const PlacementConfig& r,
                              const std::map<std::string, Group>& groups,
                              int lost_nodes) {
  std::string out =
      absl::StrCat("placement needs ", r.super_nodes, " super node(s) with ",
                   r.cards_per_super_node, " card(s) each; ");
  if (groups.empty()) {
    absl::StrAppend(&out, "alive: none");
  } else {
    std::vector<std::string> parts;
    for (const auto& [name, group] : groups) {
      if (parts.size() == kMaxListedGroups) break;
      parts.push_back(DescribeGroup(group));
    }
    absl::StrAppend(&out, "alive: ", absl::StrJoin(parts, ", "));
    if (groups.size() > parts.size()) {
      absl::StrAppend(&out, " and ", groups.size() - parts.size(),
                      " more super node(s)");
    }
  }
  if (lost_nodes > 0) {
    absl::StrAppend(&out, "; ", lost_nodes, " lost node(s) ignored");
  }
  return out;
}

CardRole RoleOf(const PlacementConfig& r, int position) {
  switch (r.mode) {
    case PlacementMode::kFused:
      return CardRole::kFused;
    case PlacementMode::kDisaggregated:
      return position < r.rollout_cards_per_super_node ? CardRole::kRollout
                                                       : CardRole::kTrain;
    case PlacementMode::kColocatedSync:
      break;
  }
  return CardRole::kColocated;
}

}  // namespace

absl::StatusOr<Placement> Place(const PlacementConfig& request,
                                const std::vector<NodeView>& nodes,
                                const BusyCards& busy) {
  if (absl::Status status = CheckRequest(request); !status.ok()) {
    return status;
  }

  // Alive nodes in id order, so every list built below is in that order.
  std::vector<const NodeView*> alive;
  int lost_nodes = 0;
  for (const NodeView& node : nodes) {
    if (node.state == NodeState::kAlive) {
      alive.push_back(&node);
    } else {
      ++lost_nodes;
    }
  }
  std::sort(alive.begin(), alive.end(),
            [](const NodeView* a, const NodeView* b) {
              return NodeIdLess(a->id, b->id);
            });

  std::map<std::string, Group> groups;  // by name
  for (const NodeView* node : alive) {
    Group& group = groups[node->spec.super_node];
    group.name = node->spec.super_node;
    group.node_ids.push_back(node->id);
    std::vector<int> indices;
    indices.reserve(node->spec.cards.size());
    for (const CardSpec& card : node->spec.cards) indices.push_back(card.index);
    std::sort(indices.begin(), indices.end());
    for (int index : indices) {
      ++group.total;
      if (!busy.contains(CardKey(node->id, index))) {
        group.free.emplace_back(node->id, index);
      }
    }
  }

  std::vector<const Group*> fit;
  for (const auto& [name, group] : groups) {
    if (static_cast<int>(group.free.size()) >= request.cards_per_super_node) {
      fit.push_back(&group);
    }
  }
  if (static_cast<int>(fit.size()) < request.super_nodes) {
    return absl::FailedPreconditionError(
        UnplaceableReason(request, groups, lost_nodes));
  }
  // `fit` is in name order; a stable sort by free cards keeps name order
  // among ties.
  std::stable_sort(fit.begin(), fit.end(), [](const Group* a, const Group* b) {
    return a->free.size() > b->free.size();
  });

  Placement placement;
  placement.super_nodes.reserve(request.super_nodes);
  for (int i = 0; i < request.super_nodes; ++i) {
    const Group& group = *fit[i];
    SuperNodeAssignment& assignment = placement.super_nodes.emplace_back();
    assignment.super_node = group.name;
    assignment.cards.reserve(request.cards_per_super_node);
    for (int c = 0; c < request.cards_per_super_node; ++c) {
      assignment.cards.push_back(
          {group.free[c].first, group.free[c].second, RoleOf(request, c)});
    }
  }
  return placement;
}

absl::StatusOr<Placement> Place(const PlacementConfig& request,
                                const std::vector<NodeView>& nodes) {
  return Place(request, nodes, BusyCards());
}

std::string PlacementDebugString(const Placement& placement) {
  std::vector<std::string> parts;
  for (const SuperNodeAssignment& sn : placement.super_nodes) {
    std::vector<std::string> cards;
    for (const CardAssignment& card : sn.cards) {
      cards.push_back(absl::StrCat(card.node_id, "/", card.card_index, " ",
                                   CardRoleName(card.role)));
    }
    parts.push_back(
        absl::StrCat(sn.super_node, ": ", absl::StrJoin(cards, ", ")));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace fusionrl
