#include "controller/group_ledger.h"

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace fusionrl {
namespace {

TEST(GroupLedgerTest, AssignsInOrderUntilExhausted) {
  GroupLedger ledger(5);
  EXPECT_EQ(ledger.Assign("node-1", 2), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(ledger.Assign("node-2", 2), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(ledger.Assign("node-1", 2), (std::vector<uint64_t>{4}));
  EXPECT_TRUE(ledger.Assign("node-1", 2).empty());
  EXPECT_EQ(ledger.pending(), 0u);
  EXPECT_EQ(ledger.assigned(), 5u);
}

TEST(GroupLedgerTest, RequeuedGroupsGoFirstAndOldReportsAreRefused) {
  GroupLedger ledger(6);
  ledger.Assign("node-1", 3);  // 0 1 2
  ledger.Assign("node-2", 2);  // 3 4
  EXPECT_EQ(ledger.Requeue("node-1"), 3);
  EXPECT_EQ(ledger.requeued_total(), 3u);
  EXPECT_EQ(ledger.Assign("node-2", 4), (std::vector<uint64_t>{0, 1, 2, 5}));
  // node-1 comes back with a late report: refused, nothing counted.
  absl::Status late = ledger.MarkTrained("node-1", {0});
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(late.message().find("assigned to node-2"), std::string::npos);
  EXPECT_EQ(ledger.trained(), 0u);
  ASSERT_TRUE(ledger.MarkTrained("node-2", {0, 1, 2, 3, 4, 5}).ok());
  EXPECT_TRUE(ledger.done());
}

TEST(GroupLedgerTest, ReclaimedGroupsGoFirstInOrderTrainedOrAssigned) {
  GroupLedger ledger(8);
  ledger.Assign("a", 2);  // 0 1
  ledger.Assign("b", 2);  // 2 3
  ASSERT_TRUE(ledger.MarkTrained("a", {0, 1}).ok());
  ledger.Assign("b", 2);              // 4 5
  EXPECT_EQ(ledger.Requeue("b"), 4);  // 2 3 4 5 pending again
  ledger.Assign("a", 1);              // 2
  // Roll back: trained 0 1 and assigned 2 go back, in this order, ahead of
  // the groups re-queued before.
  ASSERT_TRUE(ledger.Reclaim({0, 1, 2}).ok());
  EXPECT_EQ(ledger.trained(), 0u);
  EXPECT_EQ(ledger.assigned(), 0u);
  EXPECT_EQ(ledger.pending(), 8u);
  EXPECT_EQ(ledger.Assign("c", 8),
            (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  ASSERT_TRUE(ledger.MarkTrained("c", {0, 1, 2, 3, 4, 5, 6, 7}).ok());
  EXPECT_TRUE(ledger.done());
}

TEST(GroupLedgerTest, ReclaimRefusesPendingUnknownOrRepeatedGroups) {
  GroupLedger ledger(4);
  ledger.Assign("a", 2);  // 0 1; 2 3 never handed out
  for (const std::vector<uint64_t>& bad :
       {std::vector<uint64_t>{0, 2}, std::vector<uint64_t>{1, 1},
        std::vector<uint64_t>{9}}) {
    absl::Status s = ledger.Reclaim(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  }
  EXPECT_EQ(ledger.assigned(), 2u);  // nothing changed
  EXPECT_EQ(ledger.pending(), 2u);
  EXPECT_EQ(ledger.requeued_total(), 0u);
}

TEST(GroupLedgerTest, SaveAndLoadKeepEveryGroupWhereItWas) {
  GroupLedger ledger(10);
  ledger.Assign("a", 4);  // 0..3
  ASSERT_TRUE(ledger.MarkTrained("a", {0, 1, 3}).ok());
  ledger.Assign("b", 3);  // 2 is still a's: 4 5 6
  EXPECT_EQ(ledger.Requeue("b"), 3);
  ledger.Assign("c", 1);  // 4
  const GroupLedger::Saved saved = ledger.Save();
  EXPECT_EQ(saved.trained,
            (std::vector<std::pair<uint64_t, uint64_t>>{{0, 2}, {3, 4}}));
  auto loaded = GroupLedger::Load(saved);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  GroupLedger& l = **loaded;
  EXPECT_EQ(l.trained(), 3u);
  EXPECT_EQ(l.assigned(), 2u);
  EXPECT_EQ(l.pending(), 5u);
  EXPECT_EQ(l.requeued_total(), 3u);
  EXPECT_EQ(l.Assign("d", 3), (std::vector<uint64_t>{5, 6, 7}));
  ASSERT_TRUE(l.MarkTrained("a", {2}).ok());
  EXPECT_FALSE(l.MarkTrained("a", {0}).ok());  // trained already
  // Damaged state is refused, naming the group.
  GroupLedger::Saved twice = saved;
  twice.requeued.push_back(0);
  auto bad = GroupLedger::Load(twice);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("group 0"), std::string::npos);
  GroupLedger::Saved missing = saved;
  missing.assigned.clear();
  EXPECT_FALSE(GroupLedger::Load(missing).ok());
}

TEST(GroupLedgerTest, MarkTrainedIsAllOrNothing) {
  GroupLedger ledger(4);
  ledger.Assign("node-1", 2);                               // 0 1
  EXPECT_FALSE(ledger.MarkTrained("node-1", {0, 3}).ok());  // 3 not assigned
  EXPECT_EQ(ledger.trained(), 0u);
  EXPECT_EQ(ledger.assigned(), 2u);
  EXPECT_FALSE(ledger.MarkTrained("node-1", {1, 1}).ok());  // duplicate
  EXPECT_EQ(ledger.trained(), 0u);
  ASSERT_TRUE(ledger.MarkTrained("node-1", {1, 0}).ok());
  EXPECT_FALSE(ledger.MarkTrained("node-1", {0}).ok());  // twice
  EXPECT_EQ(ledger.trained(), 2u);
}

// Random interleavings of assign / train / lose: every group is trained
// exactly once and the counts always add up.
TEST(GroupLedgerTest, EveryGroupTrainedExactlyOnceUnderRandomNodeLoss) {
  int seeds_with_requeues = 0;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::mt19937_64 rng(seed);
    GroupLedger ledger(200);
    std::map<std::string, std::vector<uint64_t>> held;
    std::multiset<uint64_t> trained;
    std::vector<std::string> nodes = {"node-1", "node-2", "node-3"};
    int next_node = 4;
    for (int op = 0; op < 5000 && !ledger.done(); ++op) {
      const std::string node = nodes[rng() % nodes.size()];
      switch (rng() % 4) {
        case 0:
        case 1: {
          for (uint64_t g : ledger.Assign(node, 1 + rng() % 8)) {
            held[node].push_back(g);
          }
          break;
        }
        case 2: {
          auto& mine = held[node];
          if (mine.empty()) break;
          const size_t n = 1 + rng() % mine.size();
          std::vector<uint64_t> report(mine.begin(), mine.begin() + n);
          ASSERT_TRUE(ledger.MarkTrained(node, report).ok());
          trained.insert(report.begin(), report.end());
          mine.erase(mine.begin(), mine.begin() + n);
          break;
        }
        case 3: {
          if (rng() % 10 != 0) break;  // lose a node now and then
          const int64_t back = ledger.Requeue(node);
          EXPECT_EQ(back, static_cast<int64_t>(held[node].size()));
          // Its stale reports must be refused.
          if (!held[node].empty()) {
            EXPECT_FALSE(ledger.MarkTrained(node, {held[node][0]}).ok());
          }
          held.erase(node);
          for (auto& n : nodes) {
            if (n == node) n = "node-" + std::to_string(next_node++);
          }
          break;
        }
      }
      ASSERT_EQ(ledger.pending() + ledger.assigned() + ledger.trained(), 200u);
    }
    // Drain: surviving nodes report what they hold, a fresh node does the rest.
    for (auto& [node, mine] : held) {
      ASSERT_TRUE(ledger.MarkTrained(node, mine).ok());
      trained.insert(mine.begin(), mine.end());
    }
    std::vector<uint64_t> rest = ledger.Assign("node-final", 1000);
    ASSERT_TRUE(ledger.MarkTrained("node-final", rest).ok());
    trained.insert(rest.begin(), rest.end());
    ASSERT_TRUE(ledger.done())
        << "seed " << seed << ": " << ledger.DebugString();
    ASSERT_EQ(trained.size(), 200u);
    seeds_with_requeues += ledger.requeued_total() > 0;
    for (uint64_t g = 0; g < 200; ++g) ASSERT_EQ(trained.count(g), 1u) << g;
  }
  EXPECT_GT(seeds_with_requeues, 25);  // the interesting path really ran
}

}  // namespace
}  // namespace fusionrl
