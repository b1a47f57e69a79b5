// The RL job end to end in-process: resume and graceful stop continue a run
// exactly as if it had never stopped.
#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "engine/train/checkpoint.h"
#include "engine/model/test_util.h"
#include "fusionrl/environment.h"
#include "fusionrl/job.h"
#include "fusionrl/task.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/step/rollout_prefetch.h"

namespace fusionrl {
namespace {

// Reward = response length / 5: varies between samples of a random policy, so
// every step has non-zero advantages and really changes the weights.
class LengthReward : public RewardFn {
 public:
  Verdict Score(const Problem&, std::string_view response) const override {
    return {static_cast<double>(response.size()) / 5.0, false};
  }
};

JobConfig TinyRlJob(const std::string& out, int steps) {
  static const bool registered = [] {
    return RewardRegistry::Global()
        .Register("test_length",
                  [] { return std::make_unique<LengthReward>(); })
        .ok();
  }();
  EXPECT_TRUE(registered);
  JobConfig c;
  c.name = "resume-test";
  c.num_threads = 1;  // bitwise-reproducible reductions
  c.output_dir = ::testing::TempDir() + "/" + out;
  c.model = testing_util::TinyModelConfig();
  c.model.init_std = 0.02;
  c.task.name = "reverse";
  c.task.min_digits = 1;
  c.task.max_digits = 3;
  c.task.eval_size = 20;
  c.task.reward = "test_length";
  c.rollout.prompts_per_step = 4;
  c.rollout.group_size = 4;
  c.rollout.max_new_tokens = 5;
  c.algorithm.kl_coef = 0.05;  // exercises the reference policy on resume
  c.optim.lr = 1e-3;
  c.optim.warmup_steps = 4;  // exercises the lr schedule on resume
  c.run.total_steps = steps;
  c.run.eval_every = 2;
  return c;
}

std::vector<double> Rewards(const std::string& output_dir) {
  std::ifstream in(output_dir + "/metrics.jsonl");
  std::vector<double> rewards;
  std::string line;
  int expected_step = 1;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"].get<int>(), expected_step++);
    rewards.push_back(j["reward_mean"].get<double>());
  }
  return rewards;
}

// One value of every record of the run's metrics.jsonl (-1 where absent).
std::vector<double> Column(const std::string& output_dir,
                           const std::string& key) {
  std::ifstream in(output_dir + "/metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    out.push_back(j.contains(key) ? j[key].get<double>() : -1.0);
  }
  return out;
}

// Every prompt group of a fresh run of `groups` groups (ids 0..groups-1)
// was trained exactly once, as the cards report it (count, sum and sum of
// squares of the trained ids, summed over the run's records).
void ExpectEveryGroupTrainedOnce(const std::string& output_dir,
                                 int64_t groups) {
  double count = 0, sum = 0, sq = 0;
  for (double v : Column(output_dir, "trained_groups")) count += v;
  for (double v : Column(output_dir, "trained_group_id_sum")) sum += v;
  for (double v : Column(output_dir, "trained_group_id_sq_sum")) sq += v;
  const double n = static_cast<double>(groups);
  EXPECT_EQ(count, n) << output_dir;
  EXPECT_EQ(sum, n * (n - 1) / 2) << output_dir;
  EXPECT_EQ(sq, (n - 1) * n * (2 * n - 1) / 6) << output_dir;
}

// Bit for bit, or (tolerance > 0) within `tolerance` of each other.
void ExpectSameWeights(
    const std::string& dir_a, const std::string& dir_b,
    const ModelConfig& model = testing_util::TinyModelConfig(),
    double tolerance = 0) {
  auto a = PolicyModel::Create(model, 98, c10::Device("cpu"), 1).value();
  auto b = PolicyModel::Create(model, 98, c10::Device("cpu"), 2).value();
  ASSERT_TRUE(ReadCheckpoint(dir_a, *a, nullptr).ok());
  ASSERT_TRUE(ReadCheckpoint(dir_b, *b, nullptr).ok());
  // What training changes: every parameter, or a LoRA run's adapters (its
  // base is the job's, never written).
  auto pa = a->trainable_parameters(), pb = b->trainable_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    if (tolerance > 0) {
      EXPECT_LT((pa[i] - pb[i]).abs().max().item<double>(), tolerance)
          << "parameter " << i;
    } else {
      EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
    }
  }
}

// Runs `c` straight through `steps` steps, and again stopped after
// `stop_at` and resumed: the two agree step for step (rewards), in their
// totals and in their final weights.
// `straight`, when set, receives the straight run's summary.
void ExpectExactResume(JobConfig c, int steps, int stop_at,
                       JobSummary* straight = nullptr) {
  const std::string base = c.output_dir;
  c.run.total_steps = steps;
  c.output_dir = base + "-straight";
  std::filesystem::remove_all(c.output_dir);
  auto full = RunRlJob(c);
  ASSERT_TRUE(full.ok()) << full.status();
  if (straight != nullptr) *straight = *full;

  JobConfig split = c;
  split.output_dir = base + "-split";
  split.run.total_steps = stop_at;
  std::filesystem::remove_all(split.output_dir);
  ASSERT_TRUE(RunRlJob(split).ok());
  split.run.total_steps = steps;
  RunOptions resume;
  resume.resume = true;
  auto rest = RunRlJob(split, resume);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(rest->resumed_from_step, stop_at);
  EXPECT_EQ(rest->steps, steps);
  EXPECT_EQ(rest->policy_version, full->policy_version);
  EXPECT_EQ(rest->rollout_tokens, full->rollout_tokens);
  EXPECT_DOUBLE_EQ(rest->initial_eval_accuracy, full->initial_eval_accuracy);
  EXPECT_DOUBLE_EQ(rest->final_eval_accuracy, full->final_eval_accuracy);
  EXPECT_EQ(Rewards(split.output_dir), Rewards(c.output_dir));
  ExpectSameWeights(full->checkpoint_dir, rest->checkpoint_dir, c.model);
  // From the cards' own records (a skewed step's, every super node's).
  ExpectEveryGroupTrainedOnce(c.output_dir,
                              int64_t{steps} * c.rollout.prompts_per_step);
  ExpectEveryGroupTrainedOnce(split.output_dir,
                              int64_t{steps} * c.rollout.prompts_per_step);
}

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

// RL Fusion with s = 0 samples every step from exactly the weights the
// colocated-sync run samples from (the rollout of step u waits for version
// u - 1), with the same seeds: the same run, bit for bit.
TEST(RlJobTest, FusedWithoutLagIsTheSynchronousRun) {
  // One thread, and the defaults a user gets: two threads on the card
  // (split between the roles) and a model whose products are split across
  // them.
  for (int threads : {1, 2}) {
    SCOPED_TRACE(testing::Message() << threads << " thread(s)");
    const std::string t = std::to_string(threads);
    JobConfig sync = TinyRlJob("sync-reference-" + t, 6);
    sync.num_threads = threads;
    if (threads > 1) {
      sync.model.d_model = 96;
      sync.model.d_ff = 256;
    }
    std::filesystem::remove_all(sync.output_dir);
    auto a = RunRlJob(sync);
    ASSERT_TRUE(a.ok()) << a.status();
    JobConfig fused = sync;
    fused.output_dir = ::testing::TempDir() + "/fused-lag0-" + t;
    fused.placement.mode = PlacementMode::kFused;
    std::filesystem::remove_all(fused.output_dir);
    auto b = RunRlJob(fused);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(Rewards(fused.output_dir), Rewards(sync.output_dir));
    ExpectSameWeights(a->checkpoint_dir, b->checkpoint_dir, sync.model);
    // And it was the fused machinery that ran: every sample came from the
    // fused rollout, which took each new policy version into its snapshot
    // (one per step after the first), where the synchronous run has
    // neither. (At s = 0 the card samples between its steps, on its own
    // thread: FusedRollout::Options::synchronous_on_caller.)
    const std::vector<double> thread_samples =
        Column(fused.output_dir, "rollout_thread_samples");
    const std::vector<double> snapshots =
        Column(fused.output_dir, "rollout_snapshot_updates");
    ASSERT_EQ(thread_samples.size(), 6u);
    for (size_t i = 0; i < thread_samples.size(); ++i) {
      EXPECT_EQ(thread_samples[i], 16) << "step " << i + 1;
      EXPECT_EQ(snapshots[i], static_cast<double>(i)) << "step " << i + 1;
    }
    for (double v : Column(sync.output_dir, "rollout_thread_samples")) {
      EXPECT_EQ(v, 0);
    }
    ExpectEveryGroupTrainedOnce(fused.output_dir, 6 * 4);
  }
}

// With s = 2 the rollout runs up to two versions ahead: samples of
// staleness 2 occur and none above (on one card and across two super nodes).
TEST(RlJobTest, FusedStaleSyncNeverTrainsAboveTheLag) {
  for (int super_nodes : {1, 2}) {
    JobConfig c = TinyRlJob(absl::StrCat("fused-lag2-", super_nodes), 24);
    c.placement.mode = PlacementMode::kFused;
    c.placement.super_nodes = super_nodes;
    c.stalesync.max_policy_lag = 2;
    c.algorithm.decoupled_loss = true;
    std::filesystem::remove_all(c.output_dir);
    auto r = RunRlJob(c);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->steps, 24);
    std::ifstream in(c.output_dir + "/metrics.jsonl");
    std::string line;
    int rows = 0;
    int64_t max_seen = 0;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      const int64_t st = j["max_staleness"].get<int64_t>();
      EXPECT_LE(st, 2) << "step " << j["step"];
      // Admission alone keeps the bound: nothing sampled over the lag had
      // to be regenerated by the trainer's filter.
      EXPECT_EQ(j["over_stale_samples"].get<double>(), 0)
          << "step " << j["step"];
      EXPECT_EQ(j["rollout_thread_samples"].get<double>(), 16)
          << "step " << j["step"];
      max_seen = std::max(max_seen, st);
      // The staleness histogram covers every sample of the step.
      double in_hist = 0;
      for (int i = 0; i <= 2; ++i) {
        in_hist += j[absl::StrCat("staleness_", i)].get<double>();
      }
      EXPECT_EQ(in_hist, 16) << "step " << j["step"];
      EXPECT_GT(j[absl::StrCat("staleness_", st)].get<double>(), 0);
      ++rows;
    }
    EXPECT_EQ(rows, 24);
    ExpectEveryGroupTrainedOnce(c.output_dir, 24 * 4);
    // The rollout thread is free to run ahead; on a loaded machine it may
    // not, so only the bound is asserted, and that it is reachable once.
    EXPECT_GE(max_seen, 1) << "super_nodes " << super_nodes;
  }
}

// StaleSync across two super nodes with max_clock_skew k = 1: the clocks
// never drift more than k + 1 apart, every update of the other super node
// reaches the lead exactly once, and after the final sync both super nodes
// hold the same weights, which are the checkpoint's.
TEST(RlJobTest, ClockSkewAcrossSuperNodesIsBoundedAndEndsInOneWeightSet) {
  JobConfig c = TinyRlJob("skew-k1", 12);
  c.placement.super_nodes = 2;
  c.stalesync.max_clock_skew = 1;
  c.run.checkpoint_every = 4;
  std::filesystem::remove_all(c.output_dir);
  auto r = RunRlJob(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->steps, 12);
  EXPECT_LE(r->max_clock_skew_seen, 2);
  ASSERT_EQ(r->final_weights_crc32c.size(), 2u);
  const uint32_t crc = r->final_weights_crc32c.begin()->second;
  for (const auto& [super_node, node_crc] : r->final_weights_crc32c) {
    EXPECT_EQ(node_crc, crc) << super_node;
  }
  auto model = testing_util::TinyModel(3);
  ASSERT_TRUE(ReadCheckpoint(r->checkpoint_dir, *model, nullptr).ok());
  std::string bytes;
  for (const at::Tensor& p : model->parameters()) {
    const at::Tensor t = p.contiguous();
    bytes.append(static_cast<const char*>(t.data_ptr()),
                 t.numel() * t.element_size());
  }
  EXPECT_EQ(Crc32c(bytes), crc);
  EXPECT_TRUE(std::filesystem::exists(c.output_dir + "/checkpoints/step_4"));

  std::ifstream in(c.output_dir + "/metrics.jsonl");
  std::string line;
  int rows = 0;
  double received = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"].get<int>(), ++rows);
    EXPECT_LE(j["clock_skew"].get<int64_t>(), 2) << "step " << rows;
    EXPECT_LE(j["max_update_lag"].get<double>(), 1) << "step " << rows;
    received += j["updates_received"].get<double>();
  }
  EXPECT_EQ(rows, 12);
  // One optimizer round per step: the other node's 12 updates, each once.
  EXPECT_EQ(received, 12);
  // Every prompt group trained once, counted by both super nodes' cards.
  ExpectEveryGroupTrainedOnce(c.output_dir, 12 * 4);
}

// StaleSync across super nodes on the c10d data plane: each node's update
// goes into an asynchronous all-reduce that a later step waits for (k
// steps later, everything at a sync step), the weights are synced by a
// broadcast over the nodes' group, and nothing goes through the
// controller. What a node applies does not depend on arrival order: two
// runs agree bit for bit, with one card per node and with two.
TEST(RlJobTest,
     ClockSkewOnTheC10dDataPlaneIsReproducibleWithoutControllerBytes) {
  for (int cards : {1, 2}) {
    std::vector<std::string> finals;
    for (int run = 0; run < 2; ++run) {
      JobConfig c = TinyRlJob(absl::StrCat("skew-c10d-", cards, "-", run), 9);
      c.placement.super_nodes = 2;
      c.placement.cards_per_super_node = cards;
      c.stalesync.max_clock_skew = 2;
      c.run.checkpoint_every = 4;
      c.run.data_plane = DataPlane::kC10d;
      std::filesystem::remove_all(c.output_dir);
      auto r = RunRlJob(c);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->steps, 9);
      EXPECT_LE(r->max_clock_skew_seen, 3);
      ASSERT_EQ(r->final_weights_crc32c.size(), 2u);
      EXPECT_EQ(r->final_weights_crc32c.begin()->second,
                r->final_weights_crc32c.rbegin()->second);
      finals.push_back(r->checkpoint_dir);
      for (double bytes : Column(c.output_dir, "controller_tensor_bytes")) {
        EXPECT_EQ(bytes, 0) << "cards " << cards;
      }
      // One optimizer round per step: the lead applies the other node's
      // update of every step once, at most k = 2 steps late; the sync steps
      // (4, 8, 9) take all that is outstanding (step 4: those of 2, 3, 4).
      const std::vector<double> lag = Column(c.output_dir, "max_update_lag");
      const std::vector<double> got = Column(c.output_dir, "updates_received");
      ASSERT_EQ(got.size(), 9u);
      EXPECT_EQ(got, (std::vector<double>{0, 0, 1, 3, 0, 0, 1, 3, 1}));
      EXPECT_EQ(lag, (std::vector<double>{0, 0, 2, 2, 0, 0, 2, 2, 0}));
      // Every step's 4 prompt groups, each once, from both super nodes'
      // cards (a skewed record's other metrics are the lead's own).
      ExpectEveryGroupTrainedOnce(c.output_dir, 9 * 4);
    }
    ExpectSameWeights(finals[0], finals[1]);
  }
}

// Disaggregated: one card samples, the other trains. With s = 0 the rollout
// card samples each step from the weights colocated-sync would, with
// the same seeds: the colocated run bit for bit. With s = 1 it runs ahead,
// never more than one version.
TEST(RlJobTest, DisaggregatedCardsSampleForTheTrainingCard) {
  JobConfig sync = TinyRlJob("disagg-sync-reference", 6);
  std::filesystem::remove_all(sync.output_dir);
  auto a = RunRlJob(sync);
  ASSERT_TRUE(a.ok()) << a.status();
  JobConfig d = TinyRlJob("disaggregated-lag0", 6);
  d.placement.mode = PlacementMode::kDisaggregated;
  d.placement.cards_per_super_node = 2;
  d.placement.rollout_cards_per_super_node = 1;
  std::filesystem::remove_all(d.output_dir);
  auto b = RunRlJob(d);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Rewards(d.output_dir), Rewards(sync.output_dir));
  ExpectSameWeights(a->checkpoint_dir, b->checkpoint_dir);

  d = TinyRlJob("disaggregated-lag1", 12);
  d.placement.mode = PlacementMode::kDisaggregated;
  d.placement.cards_per_super_node = 3;  // 1 rollout card for 2 trainers
  d.placement.rollout_cards_per_super_node = 1;
  d.stalesync.max_policy_lag = 1;
  d.algorithm.decoupled_loss = true;
  std::filesystem::remove_all(d.output_dir);
  auto c = RunRlJob(d);
  ASSERT_TRUE(c.ok()) << c.status();
  std::ifstream in(d.output_dir + "/metrics.jsonl");
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_LE(j["max_staleness"].get<int64_t>(), 1) << "step " << j["step"];
    EXPECT_EQ(j["over_stale_samples"].get<double>(), 0) << "step " << j["step"];
    // Every sample came from the rollout card's thread.
    EXPECT_EQ(j["rollout_thread_samples"].get<double>(), 16)
        << "step " << j["step"];
    EXPECT_EQ(j["cards"].get<int>(), 2);  // the training cards
    ++rows;
  }
  EXPECT_EQ(rows, 12);
  ExpectEveryGroupTrainedOnce(d.output_dir, 12 * 4);
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

// RL Fusion and disaggregated placement with lag, with the default
// rollout_version lagged: the i-th step samples from version i - s, so the
// run follows from its config alone, and a checkpoint carries the batches
// the rollout had sampled ahead from versions older than its own. Ctrl-C +
// resume equals the uninterrupted run step for step: rewards, behaviour
// versions (staleness per step), weights; on one card, two cards, a
// rollout card serving two trainers, and two super nodes with clock skew
// on the c10d data plane.
void ExpectExactLaggedResume(JobConfig c, int steps, int stop_at) {
  ExpectExactResume(c, steps, stop_at);
  if (c.placement.super_nodes > 1) {
    // Every card kept its part, the other super node's too.
    EXPECT_TRUE(std::filesystem::exists(
        absl::StrCat(c.output_dir, "-split/checkpoints/rollout/step_", stop_at,
                     "/card_1.pb")));
  }
  const std::string straight = c.output_dir + "-straight";
  const std::string split = c.output_dir + "-split";
  for (const char* key : {"max_staleness", "staleness_0", "reward_mean", "loss",
                          "behaviour_weight_mean"}) {
    EXPECT_EQ(Column(split, key), Column(straight, key)) << key;
  }
  // The pipeline was full: samples s versions old were trained after the
  // resume too.
  const std::vector<double> staleness = Column(split, "max_staleness");
  ASSERT_EQ(staleness.size(), static_cast<size_t>(steps));
  EXPECT_EQ(staleness.back(), c.stalesync.max_policy_lag);
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(
      split, "/checkpoints/rollout/step_", stop_at, "/card_0.pb")));
}

// MoE as Pangu trains it: MoGE grouped routing (2 groups of 2 experts,
// top-2) and router replay, in RL Fusion with StaleSync lag 2 and a
// capacity factor that drops assignments in training. Resume is exact (the
// checkpoint's prefetched samples carry their routes), each step's groups
// get equal shares, and replay keeps the trainer on the rollout's experts;
// without replay the trainer routes some recorded tokens elsewhere (the
// lag and the drops).
TEST(RlJobTest, MoeGroupedRoutingAndRouterReplayResumeExactly) {
  JobConfig c = TinyRlJob("moe-moge-replay-fused-lag2", 6);
  c.model.moe_experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_groups = 2;
  c.model.moe_capacity_factor = 0.75;
  c.placement.mode = PlacementMode::kFused;
  c.stalesync.max_policy_lag = 2;
  c.algorithm.decoupled_loss = true;
  c.algorithm.router_replay = true;
  ExpectExactLaggedResume(c, 6, 3);
  const std::string straight = c.output_dir + "-straight";
  const std::vector<double> disagreement =
      Column(straight, "moe_route_disagreement");
  ASSERT_EQ(disagreement.size(), 6u);
  for (double d : disagreement) EXPECT_EQ(d, 0.0);
  for (const char* key : {"moe_group_load_0", "moe_group_load_1"}) {
    const std::vector<double> load = Column(straight, key);
    ASSERT_EQ(load.size(), 6u) << key;
    for (double l : load) EXPECT_NEAR(l, 0.5, 1e-6) << key;
  }
  EXPECT_EQ(Column(c.output_dir + "-split", "moe_route_disagreement"),
            disagreement);

  JobConfig off = c;
  off.algorithm.router_replay = false;
  off.output_dir = c.output_dir + "-no-replay";
  std::filesystem::remove_all(off.output_dir);
  ASSERT_TRUE(RunRlJob(off).ok());
  const std::vector<double> free =
      Column(off.output_dir, "moe_route_disagreement");
  ASSERT_EQ(free.size(), 6u);
  EXPECT_GT(*std::max_element(free.begin(), free.end()), 0.0);
}

// Expert parallelism: two cards holding 2 of the 4 experts each (tokens
// exchanged by all-to-all, expert gradients summed by the exchange and
// left out of the data-parallel sum) train the policy two cards holding
// every expert do, step for step, up to float rounding; the gathered model
// samples and is checkpointed whole, each shard keeps its optimizer state,
// and resume is exact, colocated and fused with a lag.
JobConfig TinyExpertParallelJob(const std::string& out, int steps, int ep) {
  JobConfig c = TinyRlJob(out, steps);
  c.model.moe_experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_capacity_factor = 1.0;
  c.placement.cards_per_super_node = 2;
  c.placement.expert_parallel = ep;
  return c;
}

// Runs `whole` (expert_parallel 1) and the same job with E = 2 (or takes
// the E = 2 run already in `sharded_dir`, with its final checkpoint): the
// same samples and, up to float rounding, the same `keys` step by step and
// the same final weights.
void ExpectShardedEqualsWhole(JobConfig whole, const std::string& name,
                              const std::vector<const char*>& keys,
                              std::string sharded_dir = "",
                              std::string sharded_checkpoint = "") {
  std::filesystem::remove_all(whole.output_dir);
  auto replicated = RunRlJob(whole);
  ASSERT_TRUE(replicated.ok()) << replicated.status();
  if (sharded_dir.empty()) {
    JobConfig sharded = whole;
    sharded.placement.expert_parallel = 2;
    sharded.output_dir = whole.output_dir + "-ep2";
    std::filesystem::remove_all(sharded.output_dir);
    auto run = RunRlJob(sharded);
    ASSERT_TRUE(run.ok()) << run.status();
    sharded_dir = sharded.output_dir;
    sharded_checkpoint = run->checkpoint_dir;
  }
  EXPECT_EQ(Rewards(sharded_dir), Rewards(whole.output_dir)) << name;
  for (const char* key : keys) {
    const std::vector<double> a = Column(whole.output_dir, key);
    const std::vector<double> b = Column(sharded_dir, key);
    ASSERT_EQ(a.size(), static_cast<size_t>(whole.run.total_steps)) << key;
    ASSERT_EQ(b.size(), a.size()) << key;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(b[i], a[i], 1e-5 * std::max(1.0, std::abs(a[i])))
          << name << ": " << key << " at step " << i + 1;
    }
  }
  ExpectSameWeights(replicated->checkpoint_dir, sharded_checkpoint, whole.model,
                    1e-6);
}

TEST(RlJobTest, ExpertParallelTrainsAsOnePolicyAndResumesExactly) {
  constexpr int kSteps = 4;
  JobConfig sharded = TinyExpertParallelJob("moe-ep2", kSteps, 2);
  JobSummary straight;
  ExpectExactResume(sharded, kSteps, 2, &straight);
  const std::string ep = sharded.output_dir + "-straight";
  ExpectShardedEqualsWhole(TinyExpertParallelJob("moe-ep1", kSteps, 1),
                           "2 cards", {"loss", "grad_norm", "kl", "entropy"},
                           ep, straight.checkpoint_dir);
  // Each step exchanged tokens; the whole model is in model.pt and shard
  // 1's optimizer state next to it.
  for (double bytes : Column(ep, "expert_alltoall_bytes")) {
    EXPECT_GT(bytes, 0);
  }
  EXPECT_EQ(Column(::testing::TempDir() + "/moe-ep1", "expert_alltoall_bytes"),
            std::vector<double>(kSteps, -1.0));
  EXPECT_TRUE(std::filesystem::exists(straight.checkpoint_dir +
                                      "/optim.expert-shard-1.pt"));

  // A resume needs the shards the optimizer state was split into.
  JobConfig other = sharded;
  other.output_dir = sharded.output_dir + "-split";
  other.placement.expert_parallel = 1;
  other.run.total_steps = kSteps + 1;
  RunOptions resume;
  resume.resume = true;
  auto refused = RunRlJob(other, resume);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("placement.expert_parallel 2"));

  // Four cards, two expert groups: each expert's gradient is also summed
  // over the two cards that hold it (the data-parallel sum, zeros for the
  // experts a card does not hold).
  JobConfig four = TinyExpertParallelJob("moe-ep1-4cards", 3, 1);
  four.placement.cards_per_super_node = 4;
  ExpectShardedEqualsWhole(four, "4 cards", {"loss", "grad_norm"});
  // Two super nodes (two workers) of 2 cards, synchronous: the expert
  // groups stay inside each worker, the data-parallel sum crosses them.
  JobConfig nodes = TinyExpertParallelJob("moe-ep1-2nodes", 3, 1);
  nodes.placement.super_nodes = 2;
  ExpectShardedEqualsWhole(nodes, "2 super nodes", {"loss", "grad_norm"});

  // StaleSync across two super nodes (clock skew 1): each super node's
  // update carries every expert's slot, and each weight sync moves every
  // shard's state (the lead's card r to card r elsewhere). On the c10d data
  // plane the sums do not depend on timing, so E = 2 trains the E = 1
  // policy; on either plane both super nodes end with one whole model.
  for (const DataPlane plane : {DataPlane::kC10d, DataPlane::kController}) {
    const bool c10d = plane == DataPlane::kC10d;
    JobConfig skew = TinyExpertParallelJob(
        c10d ? "moe-ep2-skew-c10d" : "moe-ep2-skew-controller", 6, 2);
    skew.placement.super_nodes = 2;
    skew.stalesync.max_clock_skew = 1;
    skew.run.checkpoint_every = 3;
    skew.run.data_plane = plane;
    skew.run.collective_timeout_seconds = 30;  // a failure shows in seconds
    std::filesystem::remove_all(skew.output_dir);
    auto skewed = RunRlJob(skew);
    ASSERT_TRUE(skewed.ok()) << skewed.status();
    ASSERT_EQ(skewed->final_weights_crc32c.size(), 2u);
    EXPECT_EQ(skewed->final_weights_crc32c.begin()->second,
              skewed->final_weights_crc32c.rbegin()->second)
        << "the two super nodes end with different experts";
    if (!c10d) continue;
    JobConfig whole = skew;
    whole.placement.expert_parallel = 1;
    whole.output_dir = skew.output_dir + "-ep1";
    ExpectShardedEqualsWhole(whole, "2 super nodes, clock skew 1",
                             {"loss", "grad_norm"}, skew.output_dir,
                             skewed->checkpoint_dir);
    // A resume from the sync at step 3 (each shard's synced optimizer
    // state in the checkpoint) continues exactly.
    ExpectExactResume(skew, 6, 3);
  }

  // policy auto plans from each card's timings; the cards of a group must
  // recompute alike (a recomputed MoE block exchanges again in backward),
  // so they take their group's rank 0's plan. Plans that differ would
  // leave a card waiting in an exchange its partner never joins: the
  // collective timeout fails the job within seconds.
  JobConfig planned = TinyExpertParallelJob("moe-ep2-auto-plan", 2, 2);
  planned.placement.mode = PlacementMode::kFused;
  planned.model.activations.policy = ActivationPolicy::kAuto;
  planned.model.activations.budget_mib = 8;
  planned.run.collective_timeout_seconds = 20;
  std::filesystem::remove_all(planned.output_dir);
  auto auto_run = RunRlJob(planned);
  EXPECT_TRUE(auto_run.ok()) << auto_run.status();

  JobConfig fused = TinyExpertParallelJob("moe-ep2-fused-lag1", 4, 2);
  fused.placement.mode = PlacementMode::kFused;
  fused.stalesync.max_policy_lag = 1;
  fused.algorithm.decoupled_loss = true;
  ExpectExactLaggedResume(fused, 4, 2);
}

// LoRA: the trainer steps the adapters, rollout samples from merged
// weights (the colocated card's merged view, the fused snapshot, the
// rollout card's copy), weight syncs and checkpoints carry the adapters
// only; resume is exact in each placement.
JobConfig TinyLoraJob(const std::string& out, int steps) {
  JobConfig c = TinyRlJob(out, steps);
  c.model.lora.rank = 4;
  c.model.lora.alpha = 8;
  c.model.lora.dropout = 0.1;
  c.optim.lr = 1e-2;
  return c;
}

TEST(RlJobTest, LoraResumesExactlyInEveryPlacement) {
  JobConfig colocated = TinyLoraJob("lora-colocated", 4);
  colocated.model.lora.dropout = 0;  // the trainer's forward is the rollout's
  ExpectExactResume(colocated, 4, 2);
  // The trainer's log-probs (unmerged LoRA forward) are those the rollout
  // sampled with (merged weights), step after step, while the adapters
  // move the policy away from the base.
  const std::string straight = colocated.output_dir + "-straight";
  for (double d : Column(straight, "logp_diff_max")) EXPECT_LT(d, 1e-4);
  JobConfig fused = TinyLoraJob("lora-fused-lag2", 6);
  fused.placement.mode = PlacementMode::kFused;
  fused.stalesync.max_policy_lag = 2;
  fused.algorithm.decoupled_loss = true;
  ExpectExactLaggedResume(fused, 6, 3);

  JobConfig disagg = TinyLoraJob("lora-disaggregated-lag1", 4);
  disagg.placement.mode = PlacementMode::kDisaggregated;
  disagg.placement.cards_per_super_node = 2;
  disagg.placement.rollout_cards_per_super_node = 1;
  disagg.stalesync.max_policy_lag = 1;
  disagg.algorithm.decoupled_loss = true;
  ExpectExactLaggedResume(disagg, 4, 2);
}

// StaleSync across super nodes: a weight sync moves the adapters and their
// AdamW moments, not the model.
TEST(RlJobTest, LoraWeightSyncsMoveTheAdaptersOnly) {
  auto sync_bytes = [](JobConfig c) {
    c.placement.super_nodes = 2;
    c.stalesync.max_clock_skew = 1;
    c.run.total_steps = 4;
    std::filesystem::remove_all(c.output_dir);
    auto run = RunRlJob(c);
    EXPECT_TRUE(run.ok()) << run.status();
    double most = 0;
    for (double b : Column(c.output_dir, "weight_sync_bytes")) {
      most = std::max(most, b);
    }
    return most;
  };
  const double full = sync_bytes(TinyRlJob("sync-bytes-full", 4));
  const double lora = sync_bytes(TinyLoraJob("sync-bytes-lora", 4));
  // The tiny model: 2 layers x 7 projections of [32|64] x [32|64]; rank-4
  // adapters are (in + out) x 4 each: 3.1k of its ~35k parameters.
  auto model =
      PolicyModel::Create(TinyLoraJob("x", 1).model, 98, c10::Device("cpu"), 1)
          .value();
  const double adapters =
      static_cast<double>(model->num_trainable_parameters()) * 4;
  ASSERT_GT(full, 0);
  ASSERT_GT(lora, 0);
  // Weights + AdamW's two moments in torch's archive format (exactly the
  // adapters' bytes for the weights: StepSnapshotTest.
  // LoraStateCarriesTheAdaptersOnly).
  EXPECT_GE(lora, 3 * adapters);
  EXPECT_LT(lora, full / 3);
}

TEST(RlJobTest, FusedWithLagResumesExactly) {
  JobConfig c = TinyRlJob("resume-fused-lag2", 6);
  c.placement.mode = PlacementMode::kFused;
  c.stalesync.max_policy_lag = 2;
  c.algorithm.decoupled_loss = true;
  ExpectExactLaggedResume(c, 6, 3);

  c = TinyRlJob("resume-fused-lag1-two-cards", 6);
  c.placement.mode = PlacementMode::kFused;
  c.placement.cards_per_super_node = 2;
  c.stalesync.max_policy_lag = 1;
  c.algorithm.decoupled_loss = true;
  ExpectExactLaggedResume(c, 6, 3);
}

// stalesync.steps_per_version 2 at s = 2: steps 1-2 sample from version 0,
// then each pair from the version its second step is admitted at (1, 3,
// 5), so the steps are 0, 1, then 1, 2 versions old in every pair. A
// checkpoint after step 3 (version 3) carries step 4's batch, one after
// step 4 those of steps 5 and 6; the resumed run continues the pairs.
TEST(RlJobTest, FusedStepsSharingAVersionResumeExactly) {
  for (int stop_at : {3, 4}) {
    SCOPED_TRACE(stop_at);
    JobConfig c = TinyRlJob(absl::StrCat("resume-fused-shared-", stop_at), 8);
    c.placement.mode = PlacementMode::kFused;
    c.stalesync.max_policy_lag = 2;
    c.stalesync.steps_per_version = 2;
    c.algorithm.decoupled_loss = true;
    ExpectExactLaggedResume(c, 8, stop_at);
    EXPECT_EQ(Column(c.output_dir + "-straight", "max_staleness"),
              (std::vector<double>{0, 1, 1, 2, 1, 2, 1, 2}));
    auto saved = ReadRolloutPrefetch(
        RolloutPrefetchPath(c.output_dir + "-split/checkpoints", stop_at, 0));
    ASSERT_TRUE(saved.ok()) << saved.status();
    EXPECT_EQ(saved->steps_per_version, 2);
    EXPECT_EQ(saved->batches.size(), stop_at == 3 ? 1u : 2u);
  }
}

// Partial rollout: a response's tokens past each multiple of
// partial_rollout_tokens (up to s - 1 of them) are sampled by the next
// step's version, in the next round. The run resumes exactly (with s = 3,
// the checkpoint's file holds steps whose responses are still unfinished
// and continue from versions the checkpoint has or will publish), every
// group is trained once, no sample exceeds the lag before the trainer's
// filter, and responses did span versions.
TEST(RlJobTest, FusedPartialRolloutResumesExactlyAndStaysWithinTheLag) {
  for (int lag : {2, 3}) {
    SCOPED_TRACE(lag);
    JobConfig c = TinyRlJob(absl::StrCat("resume-fused-partial-", lag), 8);
    c.placement.mode = PlacementMode::kFused;
    c.rollout.max_new_tokens = 12;
    c.stalesync.max_policy_lag = lag;
    c.stalesync.partial_rollout_tokens = 3;
    c.algorithm.decoupled_loss = true;
    ExpectExactLaggedResume(c, 8, 4);
    for (const char* key :
         {"partial_rollout_samples", "partial_rollout_newer_tokens"}) {
      EXPECT_EQ(Column(c.output_dir + "-split", key),
                Column(c.output_dir + "-straight", key))
          << key;
    }
    double spanning = 0, newer = 0;
    for (double v :
         Column(c.output_dir + "-straight", "partial_rollout_samples")) {
      spanning += v;
    }
    for (double v :
         Column(c.output_dir + "-straight", "partial_rollout_newer_tokens")) {
      newer += v;
    }
    EXPECT_GT(spanning, 0);
    EXPECT_GT(newer, 0);
    for (double v : Column(c.output_dir + "-straight", "over_stale_samples")) {
      EXPECT_EQ(v, 0);
    }
    for (double v : Column(c.output_dir + "-straight", "max_staleness")) {
      EXPECT_LE(v, lag);
    }
    // The file the resume read: each sample's token versions follow the
    // rule (non-decreasing, changing only at multiples of 3, the oldest
    // the sample's behaviour version, at most s - 1 newer).
    auto saved = ReadRolloutPrefetch(
        RolloutPrefetchPath(c.output_dir + "-split/checkpoints", 4, 0));
    ASSERT_TRUE(saved.ok()) << saved.status();
    int checked = 0, unfinished = 0;
    for (const auto& [step, batch] : saved->batches) {
      unfinished += static_cast<int>(batch.unfinished.size());
      for (const Sample& smp : batch.samples) {
        if (smp.token_versions.empty()) continue;
        ++checked;
        ASSERT_EQ(smp.token_versions.size(), smp.response_ids.size());
        EXPECT_EQ(smp.token_versions.front(), smp.behaviour_version);
        EXPECT_LE(smp.token_versions.back() - smp.behaviour_version, lag - 1);
        for (size_t k = 1; k < smp.token_versions.size(); ++k) {
          EXPECT_GE(smp.token_versions[k], smp.token_versions[k - 1]);
          if (smp.token_versions[k] != smp.token_versions[k - 1]) {
            EXPECT_EQ(k % 3, 0u) << "step " << step;
          }
        }
      }
    }
    EXPECT_GT(checked, 0);
    if (lag == 3) {
      EXPECT_GT(unfinished, 0);
    }
  }
}

// The same with the defaults a user gets: two threads on the card, which
// RL Fusion moves between the trainer and the rollout as each goes idle,
// and a model large enough that its products and sums are split across
// threads. Thread sharing follows timing, so without thread-count-invariant
// training and row blocks fixed by the card (engine/kernels/invariant_ops.h,
// CpuDecoder::set_row_blocks) the uninterrupted run and the resumed one
// would drift apart.
//
// With placement.fused_turns probe (auto takes turns on a CPU card) the card
// also switches between computing both roles at once and taking turns
// (worker/step/card_turns.h: after the first step a probe runs 6 steps at once,
// then 6 in turns, at s = 2), so the uninterrupted run and the resumed one
// (whose probe starts again after step 7) run steps 8-12 in different
// modes: the numbers must not notice.
TEST(RlJobTest, FusedWithLagResumesExactlyWithTheCardsThreadsShared) {
  JobConfig c = TinyRlJob("resume-fused-lag2-shared-threads", 12);
  c.num_threads = 2;
  c.model.d_model = 96;
  c.model.d_ff = 256;
  c.rollout.prompts_per_step = 8;
  c.rollout.max_new_tokens = 12;
  c.placement.mode = PlacementMode::kFused;
  ASSERT_TRUE(c.placement.fused_share_idle_threads);  // the default
  c.placement.fused_turns = FusedTurns::kProbe;
  c.stalesync.max_policy_lag = 2;
  c.algorithm.decoupled_loss = true;
  ExpectExactLaggedResume(c, 12, 6);
  const std::vector<double> straight =
      Column(c.output_dir + "-straight", "card_turns_interleaved");
  const std::vector<double> split =
      Column(c.output_dir + "-split", "card_turns_interleaved");
  ASSERT_EQ(straight.size(), 12u);
  ASSERT_EQ(split.size(), 12u);
  for (int step = 8; step <= 12; ++step) {  // 1-based
    EXPECT_EQ(straight[step - 1], 1.0) << "step " << step;
    EXPECT_EQ(split[step - 1], 0.0) << "step " << step;
  }
}

// placement.fused_turns pins the card's choice: every step runs in the
// pinned mode, and the two modes give the same run. auto, the default, on a
// CPU card takes turns every step.
TEST(RlJobTest, PinnedTurnsRunEveryStepInTheirModeAndGiveTheSameRun) {
  std::map<FusedTurns, std::string> dirs;
  for (FusedTurns turns :
       {FusedTurns::kConcurrent, FusedTurns::kInterleaved, FusedTurns::kAuto}) {
    JobConfig c =
        TinyRlJob(absl::StrCat("fused-lag2-turns-", FusedTurnsName(turns)), 8);
    c.num_threads = 2;
    c.model.d_model = 96;
    c.model.d_ff = 256;
    c.placement.mode = PlacementMode::kFused;
    c.placement.fused_turns = turns;
    c.stalesync.max_policy_lag = 2;
    c.algorithm.decoupled_loss = true;
    ASSERT_TRUE(RunRlJob(c).ok());
    const double want = turns == FusedTurns::kConcurrent ? 0.0 : 1.0;
    EXPECT_THAT(Column(c.output_dir, "card_turns_interleaved"),
                ::testing::Each(want))
        << FusedTurnsName(turns);
    dirs[turns] = c.output_dir;
  }
  for (const char* key : {"loss", "reward_mean", "grad_norm", "entropy",
                          "rollout_tokens", "staleness_2"}) {
    EXPECT_EQ(Column(dirs[FusedTurns::kConcurrent], key),
              Column(dirs[FusedTurns::kInterleaved], key))
        << key;
    EXPECT_EQ(Column(dirs[FusedTurns::kConcurrent], key),
              Column(dirs[FusedTurns::kAuto], key))
        << key;
  }
}

TEST(RlJobTest, DisaggregatedWithLagResumesExactly) {
  JobConfig c = TinyRlJob("resume-disaggregated-lag1", 6);
  c.placement.mode = PlacementMode::kDisaggregated;
  c.placement.cards_per_super_node = 3;  // 1 rollout card for 2 trainers
  c.placement.rollout_cards_per_super_node = 1;
  c.stalesync.max_policy_lag = 1;
  c.algorithm.decoupled_loss = true;
  ExpectExactLaggedResume(c, 6, 3);
}

TEST(RlJobTest, FusedWithLagAndClockSkewResumesExactly) {
  JobConfig c = TinyRlJob("resume-fused-lag1-skew1", 8);
  c.placement.mode = PlacementMode::kFused;
  c.placement.super_nodes = 2;
  c.stalesync.max_policy_lag = 1;
  c.stalesync.max_clock_skew = 1;
  c.algorithm.decoupled_loss = true;
  c.run.data_plane = DataPlane::kC10d;
  c.run.checkpoint_every = 4;  // the split run's end syncs where this does
  ExpectExactLaggedResume(c, 8, 4);
}

// The placements the tests above leave out, each continued exactly: the
// synchronous run on the c10d data plane (two super nodes), the colocated
// run with clock skew across two super nodes (c10d, where what a node
// applies does not depend on arrival order), and disaggregated placement
// with a lag on two super nodes.
TEST(RlJobTest, ResumeIsExactOnTheC10dPlaneWithSkewAndDisaggregatedNodes) {
  JobConfig sync = TinyRlJob("resume-c10d-sync", 6);
  sync.placement.super_nodes = 2;
  sync.run.data_plane = DataPlane::kC10d;
  ExpectExactResume(sync, 6, 3);

  JobConfig skew = TinyRlJob("resume-colocated-skew1", 8);
  skew.placement.super_nodes = 2;
  skew.stalesync.max_clock_skew = 1;
  skew.run.data_plane = DataPlane::kC10d;
  skew.run.checkpoint_every = 4;  // the split run's end syncs where this does
  ExpectExactResume(skew, 8, 4);

  JobConfig disagg = TinyRlJob("resume-disaggregated-lag1-two-nodes", 6);
  disagg.placement.mode = PlacementMode::kDisaggregated;
  disagg.placement.super_nodes = 2;
  disagg.placement.cards_per_super_node = 2;
  disagg.placement.rollout_cards_per_super_node = 1;
  disagg.stalesync.max_policy_lag = 1;
  disagg.algorithm.decoupled_loss = true;
  ExpectExactLaggedResume(disagg, 6, 3);
}

// Where a resume cannot be exact it still loses no prompt group and trains
// none twice: the prefetched batches gone (the rollout samples the coming
// steps again from the checkpoint's weights), and rollout_version newest
// (timing decides the versions, so nothing is kept).
TEST(RlJobTest, FusedWithLagResumeWithoutPrefetchTrainsEveryGroupOnce) {
  for (RolloutVersion rule :
       {RolloutVersion::kLagged, RolloutVersion::kNewest}) {
    JobConfig c = TinyRlJob(
        absl::StrCat("resume-fused-lag2-", RolloutVersionName(rule)), 3);
    c.placement.mode = PlacementMode::kFused;
    c.stalesync.max_policy_lag = 2;
    c.stalesync.rollout_version = rule;
    c.algorithm.decoupled_loss = true;
    std::filesystem::remove_all(c.output_dir);
    ASSERT_TRUE(RunRlJob(c).ok());
    const std::string kept = c.output_dir + "/checkpoints/rollout";
    EXPECT_EQ(std::filesystem::exists(kept), rule == RolloutVersion::kLagged);
    std::filesystem::remove_all(kept);
    c.run.total_steps = 6;
    RunOptions resume;
    resume.resume = true;
    auto rest = RunRlJob(c, resume);
    ASSERT_TRUE(rest.ok()) << rest.status();
    EXPECT_EQ(rest->steps, 6);
    ExpectEveryGroupTrainedOnce(c.output_dir, 6 * 4);
    for (double st : Column(c.output_dir, "max_staleness")) EXPECT_LE(st, 2);
  }
}

// Two turns per episode: the first is answered with a tool message, the
// second ends the episode with no reward of the environment's (the task's
// reward, test_length, scores the last turn: it varies, so steps learn).
class TwoTurnEnvironment final : public Environment {
 public:
  class Ep final : public Episode {
   public:
    absl::StatusOr<Observation> Step(const AssistantTurn& turn,
                                     absl::Time) override {
      Observation o;
      o.done = turn.index >= 1;
      if (!o.done) o.messages.push_back({"tool", "ok"});
      o.metrics["steps"] = 1;
      return o;
    }
  };
  absl::StatusOr<std::unique_ptr<Episode>> Open(const Problem&, uint64_t,
                                                absl::Time,
                                                EpisodeStart*) override {
    return std::unique_ptr<Episode>(new Ep);
  }
};

JobConfig TwoTurnJob(const std::string& out, int steps) {
  static const bool registered = [] {
    return EnvironmentRegistry::Global()
        .Register("test_two_turns",
                  [](const EnvConfig&)
                      -> absl::StatusOr<std::unique_ptr<Environment>> {
                    return std::make_unique<TwoTurnEnvironment>();
                  })
        .ok();
  }();
  EXPECT_TRUE(registered);
  JobConfig c = TinyRlJob(out, steps);
  c.env.name = "test_two_turns";
  c.env.max_turns = 2;
  return c;
}

// An episode takes as many turns as its answer has characters (1 to 3 on
// TinyRlJob's task): cards sampling different problems decode for
// different numbers of forwards.
class AnswerTurnsEnvironment final : public Environment {
 public:
  class Ep final : public Episode {
   public:
    explicit Ep(int turns) : turns_(turns) {}
    absl::StatusOr<Observation> Step(const AssistantTurn& turn,
                                     absl::Time) override {
      Observation o;
      o.done = turn.index + 1 >= turns_;
      if (!o.done) o.messages.push_back({"tool", "ok"});
      return o;
    }

   private:
    int turns_;
  };
  absl::StatusOr<std::unique_ptr<Episode>> Open(const Problem& problem,
                                                uint64_t, absl::Time,
                                                EpisodeStart*) override {
    return std::unique_ptr<Episode>(
        new Ep(static_cast<int>(problem.answer.size())));
  }
};

JobConfig AnswerTurnsJob(const std::string& out, int steps) {
  static const bool registered = [] {
    return EnvironmentRegistry::Global()
        .Register("test_answer_turns",
                  [](const EnvConfig&)
                      -> absl::StatusOr<std::unique_ptr<Environment>> {
                    return std::make_unique<AnswerTurnsEnvironment>();
                  })
        .ok();
  }();
  EXPECT_TRUE(registered);
  JobConfig c = TinyRlJob(out, steps);
  c.env.name = "test_answer_turns";
  c.env.max_turns = 3;
  return c;
}

// placement.expert_sampling shard: every card samples and evaluates from
// its own expert shard, in lockstep with its group, and holds no gathered
// copy of the whole model. Colocated (single- and multi-turn), and fused
// with lag 1 (the rollout thread exchanging over a group of its own beside
// the trainer's): the
// samples, evaluations, losses and checkpoints (a step's and the end's,
// whole models gathered for them) are the gathered run's bit for bit, the
// card books fewer weight bytes, and resume is exact.
TEST(RlJobTest, ExpertShardsSampleInLockstepAsTheGatheredModel) {
  for (const char* layout : {"colocated", "multi-turn", "fused"}) {
    const std::string name = layout;
    const bool fused = name == "fused";
    JobConfig gathered =
        TinyExpertParallelJob("moe-ep2-gathered-" + name, 4, 2);
    gathered.run.checkpoint_every = 2;
    gathered.run.collective_timeout_seconds = 30;  // a hang fails in seconds
    if (name == "multi-turn") {
      // Episodes of one to three turns: the two cards' rollouts and the
      // lead's evaluation run different numbers of forwards.
      gathered.env = AnswerTurnsJob("unused", 1).env;
    }
    if (fused) {
      gathered.placement.mode = PlacementMode::kFused;
      gathered.stalesync.max_policy_lag = 1;
      gathered.algorithm.decoupled_loss = true;
    }
    JobConfig shard = gathered;
    shard.placement.expert_sampling = ExpertSampling::kShard;
    shard.output_dir = gathered.output_dir + "-shard";
    std::filesystem::remove_all(gathered.output_dir);
    std::filesystem::remove_all(shard.output_dir);
    auto a = RunRlJob(gathered);
    ASSERT_TRUE(a.ok()) << name << ": " << a.status();
    auto b = RunRlJob(shard);
    ASSERT_TRUE(b.ok()) << name << ": " << b.status();
    for (const char* key : {"reward_mean", "loss", "grad_norm", "kl", "entropy",
                            "eval_accuracy", "max_staleness"}) {
      EXPECT_EQ(Column(shard.output_dir, key), Column(gathered.output_dir, key))
          << name << ": " << key;
    }
    EXPECT_EQ(b->initial_eval_accuracy, a->initial_eval_accuracy) << name;
    EXPECT_EQ(b->final_eval_accuracy, a->final_eval_accuracy) << name;
    ExpectSameWeights(a->checkpoint_dir, b->checkpoint_dir, gathered.model);
    // No card held the whole model: shard 1 wrote its experts apart.
    const auto weights = [](const std::string& dir) {
      return std::filesystem::file_size(dir + "/model.pt");
    };
    EXPECT_FALSE(std::filesystem::exists(a->checkpoint_dir +
                                         "/model.expert-shard-1.pt"));
    ASSERT_TRUE(std::filesystem::exists(b->checkpoint_dir +
                                        "/model.expert-shard-1.pt"));
    EXPECT_LT(weights(b->checkpoint_dir), weights(a->checkpoint_dir));
    ExpectSameWeights(gathered.output_dir + "/checkpoints/step_2",
                      shard.output_dir + "/checkpoints/step_2", gathered.model);
    const std::vector<double> held =
        Column(gathered.output_dir, "card_memory_weights_bytes");
    const std::vector<double> own =
        Column(shard.output_dir, "card_memory_weights_bytes");
    ASSERT_EQ(own.size(), held.size());
    for (size_t i = 0; i < own.size(); ++i) {
      EXPECT_GT(own[i], 0) << name;
      EXPECT_LT(own[i], held[i]) << name << ": step " << i + 1;
    }
    // Sampling exchanged tokens with the group, only there: at every step
    // on the card's thread; the fused rollout thread's count up to each
    // record, which it may run ahead of.
    double sampled = 0;
    for (double bytes :
         Column(shard.output_dir, "expert_sampling_alltoall_bytes")) {
      if (!fused) {
        EXPECT_GT(bytes, 0) << name;
      }
      sampled += bytes;
    }
    EXPECT_GT(sampled, 0) << name;
    EXPECT_EQ(Column(gathered.output_dir, "expert_sampling_alltoall_bytes"),
              std::vector<double>(4, -1.0))
        << name;
    if (fused) {
      ExpectExactLaggedResume(shard, 4, 2);
    } else {
      ExpectExactResume(shard, 4, 2);
    }
  }
  // StaleSync across two super nodes (clock skew 1, syncs every 3 steps,
  // on the c10d plane whose sums do not depend on timing): each super
  // node's group samples in lockstep on its own, weight syncs move each
  // shard's state, and the run is the gathered one.
  JobConfig skew = TinyExpertParallelJob("moe-ep2-skew-gathered", 6, 2);
  skew.placement.super_nodes = 2;
  skew.stalesync.max_clock_skew = 1;
  skew.run.checkpoint_every = 3;
  skew.run.data_plane = DataPlane::kC10d;
  skew.run.collective_timeout_seconds = 30;
  JobConfig skew_shard = skew;
  skew_shard.placement.expert_sampling = ExpertSampling::kShard;
  skew_shard.output_dir = skew.output_dir + "-shard";
  std::filesystem::remove_all(skew.output_dir);
  std::filesystem::remove_all(skew_shard.output_dir);
  auto a = RunRlJob(skew);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = RunRlJob(skew_shard);
  ASSERT_TRUE(b.ok()) << b.status();
  for (const char* key :
       {"reward_mean", "loss", "grad_norm", "eval_accuracy"}) {
    EXPECT_EQ(Column(skew_shard.output_dir, key), Column(skew.output_dir, key))
        << "clock skew 1: " << key;
  }
  // Both super nodes end with the same weights (the CRC of each one's lead
  // card's shard, under shard).
  ASSERT_EQ(b->final_weights_crc32c.size(), 2u);
  EXPECT_EQ(b->final_weights_crc32c.begin()->second,
            b->final_weights_crc32c.rbegin()->second);
  ExpectSameWeights(a->checkpoint_dir, b->checkpoint_dir, skew.model);
}

// Multi-turn episodes resume exactly: synchronously, fused with lag 2 and
// disaggregated with lag 1,
// where the checkpoint keeps the episodes the rollout had finished ahead
// (each trained once after the resume) and those not started are sampled
// after it from their own keys.
TEST(RlJobTest, MultiTurnEpisodesResumeExactly) {
  JobConfig c = TwoTurnJob("resume-episodes", 4);
  ExpectExactResume(c, 4, 2);
  const std::vector<double> turns =
      Column(c.output_dir + "-straight", "env_turns_mean");
  ASSERT_EQ(turns.size(), 4u);
  for (double t : turns) {
    EXPECT_GT(t, 1.0);
    EXPECT_LE(t, 2.0);
  }
  for (double f : Column(c.output_dir + "-straight", "env_masked_frac")) {
    EXPECT_GT(f, 0.0);
  }
  for (double f : Column(c.output_dir + "-straight", "env_failed_episodes")) {
    EXPECT_EQ(f, 0.0);
  }
  // The environment's own metric: one "steps" per Step call, so its mean
  // per episode is the episode's turns answered.
  const std::vector<double> steps =
      Column(c.output_dir + "-straight", "env_steps");
  ASSERT_EQ(steps.size(), 4u);
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_DOUBLE_EQ(steps[i], turns[i]);
  }
  c = TwoTurnJob("resume-episodes-fused-lag2", 6);
  c.placement.mode = PlacementMode::kFused;
  c.stalesync.max_policy_lag = 2;
  c.algorithm.decoupled_loss = true;
  ExpectExactLaggedResume(c, 6, 3);
  // Kept in the checkpoint with the prefetched episodes.
  EXPECT_EQ(Column(c.output_dir + "-split", "env_steps"),
            Column(c.output_dir + "-straight", "env_steps"));
  c = TwoTurnJob("resume-episodes-disaggregated-lag1", 6);
  c.placement.mode = PlacementMode::kDisaggregated;
  c.placement.cards_per_super_node = 2;
  c.placement.rollout_cards_per_super_node = 1;
  c.stalesync.max_policy_lag = 1;
  c.algorithm.decoupled_loss = true;
  ExpectExactLaggedResume(c, 6, 3);
}

// Router replay over tool-using episodes: a MoE policy's episodes carry
// the experts of every token they fed, the tool's answers included, and the
// trainer replays them (0 disagreement every step, where capacity drops
// otherwise move the trainer's routing).
TEST(RlJobTest, MultiTurnMoeEpisodesReplayTheirRouting) {
  for (bool replay : {false, true}) {
    SCOPED_TRACE(replay);
    JobConfig c = TwoTurnJob(absl::StrCat("episodes-moe-replay-", replay), 3);
    c.model.moe_experts = 4;
    c.model.moe_top_k = 2;
    c.model.moe_capacity_factor = 0.75;
    c.algorithm.router_replay = replay;
    std::filesystem::remove_all(c.output_dir);
    ASSERT_TRUE(RunRlJob(c).ok());
    const std::vector<double> d =
        Column(c.output_dir, "moe_route_disagreement");
    ASSERT_EQ(d.size(), 3u);
    for (double v : d) {
      if (replay) {
        EXPECT_EQ(v, 0.0);
      } else {
        EXPECT_GT(v, 0.0);
      }
    }
  }
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
