#include "controller/scheduler.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/node_registry.h"
#include "fusionrl/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// An alive node with cards 0..num_cards-1.
NodeView Node(const std::string& id, const std::string& super_node,
              int num_cards, NodeState state = NodeState::kAlive) {
  NodeView view;
  view.id = id;
  view.spec.host = absl::StrCat("host-", id);
  view.spec.super_node = super_node;
  for (int i = 0; i < num_cards; ++i) {
    view.spec.cards.push_back({i, absl::StrCat("cuda:", i), 0});
  }
  view.state = state;
  return view;
}

constexpr PlacementMode kColocatedSync = PlacementMode::kColocatedSync;
constexpr PlacementMode kDisaggregated = PlacementMode::kDisaggregated;
constexpr PlacementMode kFused = PlacementMode::kFused;

PlacementConfig Request(PlacementMode mode, int super_nodes,
                        int cards_per_super_node, int rollout_cards = 0) {
  PlacementConfig request;
  request.mode = mode;
  request.super_nodes = super_nodes;
  request.cards_per_super_node = cards_per_super_node;
  request.rollout_cards_per_super_node = rollout_cards;
  return request;
}

// "sn-a: node-1/0 colocated, ..." or the error.
std::string PlaceToString(const PlacementConfig& request,
                          const std::vector<NodeView>& nodes,
                          const BusyCards& busy = {}) {
  absl::StatusOr<Placement> placement = Place(request, nodes, busy);
  if (!placement.ok()) return placement.status().ToString();
  return PlacementDebugString(*placement);
}

TEST(SchedulerTest, CardRoleNames) {
  EXPECT_EQ(CardRoleName(CardRole::kIdle), "idle");
  EXPECT_EQ(CardRoleName(CardRole::kColocated), "colocated");
  EXPECT_EQ(CardRoleName(CardRole::kFused), "fused");
  EXPECT_EQ(CardRoleName(CardRole::kRollout), "rollout");
  EXPECT_EQ(CardRoleName(CardRole::kTrain), "train");
}

TEST(SchedulerTest, ColocatedSyncGivesEveryCardTheColocatedRole) {
  const std::vector<NodeView> nodes = {Node("node-1", "sn-a", 4)};
  absl::StatusOr<Placement> placement =
      Place(Request(kColocatedSync, 1, 3), nodes);
  ASSERT_TRUE(placement.ok()) << placement.status();
  ASSERT_EQ(placement->super_nodes.size(), 1u);
  const SuperNodeAssignment& sn = placement->super_nodes[0];
  EXPECT_EQ(sn.super_node, "sn-a");
  ASSERT_EQ(sn.cards.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(sn.cards[i].node_id, "node-1");
    EXPECT_EQ(sn.cards[i].card_index, i);
    EXPECT_EQ(sn.cards[i].role, CardRole::kColocated);
  }
}

TEST(SchedulerTest, DefaultRequestTakesOneCard) {
  EXPECT_EQ(PlaceToString(PlacementConfig{}, {Node("node-1", "sn-a", 8)}),
            "sn-a: node-1/0 colocated");
}

TEST(SchedulerTest, FusedGivesEveryCardTheFusedRole) {
  EXPECT_EQ(PlaceToString(Request(kFused, 1, 2), {Node("node-1", "sn-a", 2)}),
            "sn-a: node-1/0 fused, node-1/1 fused");
}

TEST(SchedulerTest, DisaggregatedSplitsRolloutAndTrainInEachSuperNode) {
  const std::vector<NodeView> nodes = {Node("node-1", "sn-a", 4),
                                       Node("node-2", "sn-b", 4)};
  EXPECT_EQ(PlaceToString(Request(kDisaggregated, 2, 4, 3), nodes),
            "sn-a: node-1/0 rollout, node-1/1 rollout, node-1/2 rollout, "
            "node-1/3 train; "
            "sn-b: node-2/0 rollout, node-2/1 rollout, node-2/2 rollout, "
            "node-2/3 train");
  EXPECT_EQ(PlaceToString(Request(kDisaggregated, 1, 2, 1), nodes),
            "sn-a: node-1/0 rollout, node-1/1 train");
}

TEST(SchedulerTest, CardsAreTakenInNodeIdThenCardIndexOrder) {
  // Nodes given out of order; node-10 sorts after node-9; card indices
  // listed out of order and with gaps.
  NodeView odd = Node("node-9", "sn-a", 0);
  odd.spec.cards = {{5, "cuda:5", 0}, {2, "cuda:2", 0}};
  const std::vector<NodeView> nodes = {Node("node-10", "sn-a", 2), odd};
  EXPECT_EQ(PlaceToString(Request(kDisaggregated, 1, 3, 1), nodes),
            "sn-a: node-9/2 rollout, node-9/5 train, node-10/0 train");
}

TEST(SchedulerTest, PrefersSuperNodesWithMoreFreeCardsThenName) {
  const std::vector<NodeView> nodes = {
      Node("node-1", "sn-d", 2), Node("node-2", "sn-c", 4),
      Node("node-3", "sn-b", 2), Node("node-4", "sn-a", 2),
      Node("node-5", "sn-b", 2),  // sn-b: 4 cards over two nodes
      Node("node-6", "sn-e", 1),  // too small
  };
  absl::StatusOr<Placement> placement = Place(Request(kFused, 3, 2), nodes);
  ASSERT_TRUE(placement.ok()) << placement.status();
  std::vector<std::string> names;
  for (const auto& sn : placement->super_nodes) names.push_back(sn.super_node);
  // 4-card super nodes first (sn-b before sn-c by name), then the 2-card
  // ones by name.
  EXPECT_EQ(names, (std::vector<std::string>{"sn-b", "sn-c", "sn-a"}));
  EXPECT_EQ(PlacementDebugString(*placement),
            "sn-b: node-3/0 fused, node-3/1 fused; "
            "sn-c: node-2/0 fused, node-2/1 fused; "
            "sn-a: node-4/0 fused, node-4/1 fused");
}

TEST(SchedulerTest, PlacementIsDeterministicInAnyInputOrder) {
  std::vector<NodeView> nodes;
  for (int i = 1; i <= 12; ++i) {
    nodes.push_back(
        Node(absl::StrCat("node-", i), absl::StrCat("sn-", i % 4), 1 + i % 3));
  }
  const PlacementConfig request = Request(kDisaggregated, 3, 3, 1);
  const std::string expected = PlaceToString(request, nodes);
  EXPECT_THAT(expected, Not(HasSubstr("FAILED_PRECONDITION")));
  for (int round = 0; round < 20; ++round) {
    std::rotate(nodes.begin(), nodes.begin() + 5, nodes.end());
    if (round % 2 == 1) std::reverse(nodes.begin(), nodes.end());
    ASSERT_EQ(PlaceToString(request, nodes), expected) << "round " << round;
  }
}

TEST(SchedulerTest, LostNodesAreIgnored) {
  const std::vector<NodeView> nodes = {
      Node("node-1", "sn-a", 8, NodeState::kLost),
      Node("node-2", "sn-a", 1),
      Node("node-3", "sn-b", 2),
  };
  EXPECT_EQ(PlaceToString(Request(kFused, 1, 2), nodes),
            "sn-b: node-3/0 fused, node-3/1 fused");
  absl::StatusOr<Placement> placement = Place(Request(kFused, 2, 2), nodes);
  ASSERT_FALSE(placement.ok());
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(placement.status().message()),
            "placement needs 2 super node(s) with 2 card(s) each; alive: "
            "sn-a (1 card on node-2), sn-b (2 cards on node-3); 1 lost "
            "node(s) ignored");
}

TEST(SchedulerTest, BusyCardsAreExcluded) {
  const std::vector<NodeView> nodes = {Node("node-1", "sn-a", 4),
                                       Node("node-2", "sn-b", 3)};
  const BusyCards busy = {{"node-1", 0}, {"node-1", 2}, {"node-9", 0}};
  // sn-a has 2 free cards left, so sn-b (3 free) is preferred now.
  EXPECT_EQ(PlaceToString(Request(kFused, 1, 2), nodes, busy),
            "sn-b: node-2/0 fused, node-2/1 fused");
  EXPECT_EQ(PlaceToString(Request(kFused, 2, 2), nodes, busy),
            "sn-b: node-2/0 fused, node-2/1 fused; "
            "sn-a: node-1/1 fused, node-1/3 fused");
  absl::StatusOr<Placement> placement =
      Place(Request(kFused, 2, 3), nodes, busy);
  ASSERT_FALSE(placement.ok());
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(placement.status().message()),
              HasSubstr("sn-a (2 free of 4 cards on node-1)"));
}

TEST(SchedulerTest, UnplaceableReasonSaysWhatIsNeededAndWhatExists) {
  const std::vector<NodeView> nodes = {Node("node-1", "sn-a", 3),
                                       Node("node-2", "sn-b", 1)};
  absl::StatusOr<Placement> placement =
      Place(Request(kColocatedSync, 2, 2), nodes);
  ASSERT_FALSE(placement.ok());
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(placement.status().message());
  EXPECT_EQ(message,
            "placement needs 2 super node(s) with 2 card(s) each; alive: "
            "sn-a (3 cards on node-1), sn-b (1 card on node-2)");
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

TEST(SchedulerTest, UnplaceableWithNoNodes) {
  absl::StatusOr<Placement> placement = Place(PlacementConfig{}, {});
  ASSERT_FALSE(placement.ok());
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(placement.status().message()),
            "placement needs 1 super node(s) with 1 card(s) each; alive: none");
}

TEST(SchedulerTest, UnplaceableReasonStaysShortOnBigClusters) {
  std::vector<NodeView> nodes;
  for (int i = 1; i <= 100; ++i) {
    nodes.push_back(
        Node(absl::StrCat("node-", i), absl::StrCat("sn-", 100 + i % 20), 1));
  }
  absl::StatusOr<Placement> placement = Place(Request(kFused, 30, 8), nodes);
  ASSERT_FALSE(placement.ok());
  const std::string message(placement.status().message());
  EXPECT_THAT(message, HasSubstr("placement needs 30 super node(s) with 8 "
                                 "card(s) each; alive: sn-100 (5 cards on "
                                 "node-20, node-40, node-60, node-80 and 1 "
                                 "more)"));
  EXPECT_THAT(message,
              HasSubstr("), sn-107 (5 cards on node-7, node-27, node-47, "
                        "node-67 and 1 more) and 12 more super node(s)"));
  EXPECT_LT(message.size(), 1000u);
}

TEST(SchedulerTest, CardsNeededInEachSuperNodeNotInTotal) {
  // 4 free cards in total, but no super node has 3.
  const std::vector<NodeView> nodes = {Node("node-1", "sn-a", 2),
                                       Node("node-2", "sn-b", 2)};
  EXPECT_FALSE(Place(Request(kFused, 1, 3), nodes).ok());
  EXPECT_TRUE(Place(Request(kFused, 2, 2), nodes).ok());
  EXPECT_FALSE(Place(Request(kFused, 3, 1), nodes).ok());
}

TEST(SchedulerTest, RejectsInvalidRequests) {
  const std::vector<NodeView> nodes = {Node("node-1", "sn-a", 8)};
  struct Case {
    PlacementConfig request;
    std::string message;
  };
  const std::vector<Case> cases = {
      {Request(static_cast<PlacementMode>(7), 1, 1),
       "placement.mode: not a valid value (7)"},
      {Request(kFused, 0, 1),
       "placement.super_nodes: must be in [1, 4096], got 0"},
      {Request(kFused, 1, 4097),
       "placement.cards_per_super_node: must be in [1, 4096], got 4097"},
      {Request(kDisaggregated, 1, 4, 0),
       "placement.rollout_cards_per_super_node: disaggregated needs "
       "1..cards_per_super_node-1 rollout cards, got 0"},
      {Request(kDisaggregated, 1, 4, 4),
       "placement.rollout_cards_per_super_node: disaggregated needs "
       "1..cards_per_super_node-1 rollout cards, got 4"},
      {Request(kFused, 1, 4, 1),
       "placement.rollout_cards_per_super_node: must be 0 unless "
       "placement.mode is disaggregated, got 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    absl::StatusOr<Placement> placement = Place(c.request, nodes);
    ASSERT_FALSE(placement.ok());
    EXPECT_EQ(placement.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(placement.status().message()),
                HasSubstr(c.message));
  }
}

TEST(SchedulerTest, PlacesFromRegistryList) {
  // The registry's List() feeds Place() directly.
  class FixedClock : public Clock {
   public:
    absl::Time Now() const override { return absl::UnixEpoch(); }
  } clock;
  NodeRegistry registry(clock, absl::Seconds(10));
  NodeSpec spec;
  spec.host = "h";
  spec.super_node = "sn-a";
  spec.cards = {{0, "cpu", 0}, {1, "cpu", 0}};
  ASSERT_TRUE(registry.Register(spec).ok());
  EXPECT_EQ(PlaceToString(Request(kDisaggregated, 1, 2, 1), registry.List()),
            "sn-a: node-1/0 rollout, node-1/1 train");
}

}  // namespace
}  // namespace fusionrl
