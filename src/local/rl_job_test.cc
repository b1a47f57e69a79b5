// The RL job end to end in-process: resume and graceful stop continue a run
// exactly as if it had never stopped, data-parallel over cards and super
// nodes (both data planes), and jobs that cannot run are refused clearly.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fusionrl/job.h"
#include "gtest/gtest.h"
#include "local/rl_job_test_util.h"

namespace fusionrl {
namespace {

TEST(RlJobTest, ResumeContinuesExactly) {
  ExpectExactResume(TinyRlJob("resume", 6), 6, 3);
  // The run compared is not a trivial one: rewards vary and are not zero.
  const std::vector<double> rewards =
      Rewards(::testing::TempDir() + "/resume-straight");
  ASSERT_EQ(rewards.size(), 6u);
  EXPECT_GT(*std::max_element(rewards.begin(), rewards.end()), 0.0);
  EXPECT_NE(rewards.front(), rewards.back());
}

TEST(RlJobTest, StopRequestCheckpointsAndResumeFinishesTheRun) {
  const JobConfig straight = TinyRlJob("straight3", 3);
  std::filesystem::remove_all(straight.output_dir);
  auto full = RunRlJob(straight);
  ASSERT_TRUE(full.ok()) << full.status();

  const JobConfig stopped = TinyRlJob("stopped", 3);
  std::filesystem::remove_all(stopped.output_dir);
  std::atomic<bool> stop{true};  // requested before the first step ends
  RunOptions options;
  options.stop_requested = &stop;
  auto partial = RunRlJob(stopped, options);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_TRUE(partial->interrupted);
  EXPECT_EQ(partial->steps, 1);
  EXPECT_TRUE(
      std::filesystem::exists(stopped.output_dir + "/checkpoints/step_1"));
  EXPECT_FALSE(
      std::filesystem::exists(stopped.output_dir + "/checkpoints/final"));

  RunOptions resume;
  resume.resume = true;
  auto rest = RunRlJob(stopped, resume);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_FALSE(rest->interrupted);
  EXPECT_EQ(rest->steps, 3);
  EXPECT_EQ(Rewards(stopped.output_dir), Rewards(straight.output_dir));
  ExpectSameWeights(full->checkpoint_dir, rest->checkpoint_dir);
}

// Two cards (threads) train data-parallel through c10d Gloo; the run is as
// reproducible as a single card's: stopping and resuming gives the same
// metrics and weights as running straight through.
TEST(RlJobTest, TwoCardsRunDataParallelAndResumeExactly) {
  JobConfig c = TinyRlJob("two-cards", 4);
  c.placement.cards_per_super_node = 2;
  JobSummary full;
  ExpectExactResume(c, 4, 2, &full);
  EXPECT_EQ(full.steps, 4);
  EXPECT_EQ(full.policy_version, 4);
}

// Two super nodes of one card each (in-process workers, gradients summed
// across nodes through the controller's Reduce rounds) take exactly the
// steps of one super node with two cards (summed by c10d): same ranks, same
// prompt groups, same seeds, and a two-term float sum is order-free.
TEST(RlJobTest, TwoSuperNodesMatchTwoCardsOfOneNode) {
  JobConfig cards = TinyRlJob("one-node-two-cards", 3);
  cards.placement.cards_per_super_node = 2;
  std::filesystem::remove_all(cards.output_dir);
  auto a = RunRlJob(cards);
  ASSERT_TRUE(a.ok()) << a.status();

  JobConfig nodes = TinyRlJob("two-nodes-one-card", 3);
  nodes.placement.super_nodes = 2;
  std::filesystem::remove_all(nodes.output_dir);
  auto b = RunRlJob(nodes);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->steps, 3);
  EXPECT_EQ(b->rollout_tokens, a->rollout_tokens);
  EXPECT_EQ(Rewards(nodes.output_dir), Rewards(cards.output_dir));
  ExpectSameWeights(a->checkpoint_dir, b->checkpoint_dir);
}

// The c10d data plane: the nodes' first cards sum the gradients in a Gloo
// group formed through the controller's rendezvous store, and the
// controller carries no tensor bytes. A two-term float sum is order-free,
// so the run equals the one summed by the controller bit for bit, with one
// card per node and with two (local c10d sum first).
TEST(RlJobTest, C10dDataPlaneMatchesTheControllerSumWithoutItsBytes) {
  for (int cards : {1, 2}) {
    JobConfig relay = TinyRlJob(absl::StrCat("plane-controller-", cards), 3);
    relay.placement.super_nodes = 2;
    relay.placement.cards_per_super_node = cards;
    std::filesystem::remove_all(relay.output_dir);
    auto a = RunRlJob(relay);
    ASSERT_TRUE(a.ok()) << a.status();

    JobConfig c10d = TinyRlJob(absl::StrCat("plane-c10d-", cards), 3);
    c10d.placement.super_nodes = 2;
    c10d.placement.cards_per_super_node = cards;
    c10d.run.data_plane = DataPlane::kC10d;
    std::filesystem::remove_all(c10d.output_dir);
    auto b = RunRlJob(c10d);
    ASSERT_TRUE(b.ok()) << b.status();

    EXPECT_EQ(b->steps, 3);
    EXPECT_EQ(b->rollout_tokens, a->rollout_tokens);
    EXPECT_EQ(Rewards(c10d.output_dir), Rewards(relay.output_dir));
    ExpectSameWeights(a->checkpoint_dir, b->checkpoint_dir);
    for (double bytes : Column(c10d.output_dir, "controller_tensor_bytes")) {
      EXPECT_EQ(bytes, 0) << "cards " << cards;
    }
    for (double bytes : Column(relay.output_dir, "controller_tensor_bytes")) {
      EXPECT_GT(bytes, 0) << "cards " << cards;
    }
    ExpectEveryGroupTrainedOnce(c10d.output_dir, 3 * 4);
  }
}

// Exact resume beyond one colocated card: RL Fusion and disaggregated
// placement without lag (their rollout thread restarts from the
// checkpoint's weights, which are the weights it would have sampled from),
// two super nodes (gradients summed through the controller), and a MoE
// policy (router state is in the weights).
TEST(RlJobTest, ResumeIsExactInEverySynchronousPlacement) {
  JobConfig fused = TinyRlJob("resume-fused-lag0", 4);
  fused.placement.mode = PlacementMode::kFused;
  ExpectExactResume(fused, 4, 2);

  JobConfig disagg = TinyRlJob("resume-disaggregated-lag0", 4);
  disagg.placement.mode = PlacementMode::kDisaggregated;
  disagg.placement.cards_per_super_node = 2;
  disagg.placement.rollout_cards_per_super_node = 1;
  ExpectExactResume(disagg, 4, 2);

  JobConfig nodes = TinyRlJob("resume-two-super-nodes", 4);
  nodes.placement.super_nodes = 2;
  ExpectExactResume(nodes, 4, 2);

  JobConfig moe = TinyRlJob("resume-moe", 4);
  moe.model.moe_experts = 4;
  moe.model.moe_top_k = 2;
  ExpectExactResume(moe, 4, 2);
}

// A card whose memory budget cannot hold the rollout's KV cache fails the
// job with the card's books in the message, not with an allocator crash.
TEST(RlJobTest, KvCacheOverTheCardBudgetFailsClearly) {
  JobConfig c = TinyRlJob("tiny-budget", 2);
  c.memory.card_budget_mib = 0.3;  // the weights alone take ~0.1 MiB
  c.memory.offload_optimizer = OffloadPolicy::kNever;
  std::filesystem::remove_all(c.output_dir);
  auto st = RunRlJob(c).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("KV cache needs"), std::string::npos) << st;
  EXPECT_NE(st.message().find("budget"), std::string::npos) << st;
}

TEST(RlJobTest, UnevenPlacementsAreRefusedClearly) {
  JobConfig c = TinyRlJob("uneven-cards", 2);
  c.placement.cards_per_super_node = 3;  // 4 prompt groups over 3 cards
  auto st = RunRlJob(c).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("rollout.prompts_per_step"), std::string::npos);
  c = TinyRlJob("uneven-train-cards", 2);
  c.placement.mode = PlacementMode::kDisaggregated;
  c.placement.cards_per_super_node = 4;  // 3 training cards
  c.placement.rollout_cards_per_super_node = 1;
  st = RunRlJob(c).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("training cards"), std::string::npos);
}

TEST(RlJobTest, ResumeWithoutCheckpointIsNotFound) {
  const JobConfig c = TinyRlJob("nothing-to-resume", 2);
  std::filesystem::remove_all(c.output_dir);
  RunOptions resume;
  resume.resume = true;
  EXPECT_EQ(RunRlJob(c, resume).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace fusionrl
