// The simulator against hand-computed cost-model sums and the controller's
// own records: step times, scaling with and without collective cost, every
// prompt group trained once, the clock-skew gate under a straggler, no
// tensor bytes through the controller, strict config errors, calibration.
#include "sim/simulator.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/calibration.h"
#include "sim/cost_model.h"
#include "sim/sim_config.h"

namespace fusionrl::sim {
namespace {

using ::testing::HasSubstr;

// One super node's share: 2 prompt groups x 4 responses per card.
std::string JobYaml(int steps, int prompts_per_node) {
  return absl::StrCat(R"(name: simtest
model: {d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64, max_seq_len: 24}
task: {name: reverse, eval_size: 10, min_digits: 1, max_digits: 3}
rollout: {prompts_per_step: )",
                      prompts_per_node, R"(, group_size: 4, max_new_tokens: 5}
run: {eval_every: 0, total_steps: )",
                      steps, "}\n");
}

// No randomness, no stragglers: every card of every node takes the same
// time, so any difference between runs is the model's structure.
CostModel Deterministic() {
  CostModel m;
  m.response_length = {100, 0, 4096};
  m.prompt_length = 10;
  m.jitter_sigma = 0;
  m.straggler_super_nodes = 0;
  return m;
}

class SimulatorTest : public ::testing::Test {
 protected:
  absl::StatusOr<SimRunResult> Run(const CostModel& cost,
                                   const std::string& mode, int nodes,
                                   int cards, int steps = 6) {
    SimRunSpec spec;
    spec.job_yaml = JobYaml(steps, 2 * cards);
    spec.source_name = "simtest.yaml";
    spec.cost = cost;
    absl::StatusOr<SimMode> m = ParseSimMode(mode);
    if (!m.ok()) return m.status();
    spec.mode = *m;
    spec.super_nodes = nodes;
    spec.cards_per_super_node = cards;
    spec.output_dir = absl::StrCat(::testing::TempDir(), "/sim-test-", ++runs_);
    std::filesystem::remove_all(spec.output_dir);
    return RunSimulation(spec);
  }

  static double Efficiency(const SimRunResult& n, const SimRunResult& one) {
    return n.tokens_per_second / (n.super_nodes * one.tokens_per_second);
  }

  int runs_ = 0;
};

TEST_F(SimulatorTest, OneCardStepIsTheHandComputedSum) {
  const CostModel m = Deterministic();
  auto r = Run(m, "colocated-sync", 1, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  // 2 groups x 4 = 8 responses of 100 tokens after 10-token prompts.
  const double rollout = 3e-5 * 10 * 8      // prefill
                         + 0.005 * 100      // decode steps of the batch
                         + 5e-5 * 8 * 100;  // rows x decode steps
  const double train = 0.05 + 1.4e-4 * 8 * (100 + 10);
  EXPECT_NEAR(r->mean_step_seconds, rollout + train, 1e-12);
  EXPECT_NEAR(r->seconds, 6 * (rollout + train), 1e-11);
  EXPECT_EQ(r->tokens, 6 * 8 * 100);
  EXPECT_NEAR(r->tokens_per_second, 800 / (rollout + train), 1e-6);
  EXPECT_NEAR(r->card_busy_fraction, 1.0, 1e-12);
  EXPECT_EQ(r->max_staleness, 0);
}

TEST_F(SimulatorTest, ScalingIsLinearWithoutCollectiveCostAndNotWith) {
  CostModel free = Deterministic();
  free.intra_bandwidth_gbps = 1e15;
  free.inter_bandwidth_gbps = 1e15;
  free.intra_latency_us = 0;
  free.inter_latency_us = 0;
  auto one = Run(free, "colocated-sync", 1, 2);
  auto four = Run(free, "colocated-sync", 4, 2);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_NEAR(Efficiency(*four, *one), 1.0, 1e-9);

  const CostModel paid = Deterministic();  // 50 GB/s across super nodes
  auto one_paid = Run(paid, "colocated-sync", 1, 2);
  auto four_paid = Run(paid, "colocated-sync", 4, 2);
  ASSERT_TRUE(one_paid.ok()) << one_paid.status();
  ASSERT_TRUE(four_paid.ok()) << four_paid.status();
  EXPECT_LT(Efficiency(*four_paid, *one_paid), 1.0 - 1e-6);
  // The difference is exactly the synchronous cross-node ring per step.
  EXPECT_NEAR(four_paid->mean_step_seconds - one_paid->mean_step_seconds,
              InterCollectiveSeconds(paid, 4, 2), 1e-9);
}

TEST_F(SimulatorTest, EveryPromptGroupIsTrainedOnceInEveryMode) {
  CostModel m;  // defaults: long tail, jitter, a straggler
  m.response_length.median = 50;
  m.response_length.max = 400;
  for (const std::string mode :
       {"colocated-sync", "fused", "fused+stalesync:2"}) {
    SCOPED_TRACE(mode);
    auto r = Run(m, mode, 3, 2, 7);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->job_phase, "JOB_PHASE_SUCCEEDED");
    EXPECT_EQ(r->steps, 7);
    // 3 super nodes x 2 cards x 2 groups per card, 7 steps.
    EXPECT_EQ(r->groups_submitted, 7 * 12);
    EXPECT_EQ(r->groups_trained, 7 * 12);
    // The controller's token total is the simulator's.
    EXPECT_EQ(r->controller_rollout_tokens, r->tokens);
    EXPECT_LE(r->max_staleness, mode == "fused+stalesync:2" ? 2 : 0);
  }
}

TEST_F(SimulatorTest, ClockSkewGateBoundsTheStragglersLead) {
  CostModel m;
  m.response_length = {100, 0.5, 1000};
  m.straggler_super_nodes = 1;
  m.straggler_slowdown = 1.3;
  auto stale = Run(m, "fused+stalesync:2", 4, 2, 12);
  auto sync = Run(m, "colocated-sync", 4, 2, 12);
  ASSERT_TRUE(stale.ok()) << stale.status();
  ASSERT_TRUE(sync.ok()) << sync.status();
  // The controller's gate: skew reached, never beyond k + 1.
  EXPECT_GE(stale->max_clock_skew, 1);
  EXPECT_LE(stale->max_clock_skew, 3);
  EXPECT_EQ(sync->max_clock_skew, 0);
  EXPECT_GT(stale->tokens_per_second, sync->tokens_per_second);

  // k = 0: the straggler holds every node back, step after step.
  CostModel even = m;
  even.straggler_super_nodes = 0;
  even.jitter_sigma = 0;
  even.response_length.sigma = 0;
  CostModel slow = even;
  slow.straggler_super_nodes = 1;
  auto fast_run = Run(even, "colocated-sync", 4, 2);
  auto slow_run = Run(slow, "colocated-sync", 4, 2);
  ASSERT_TRUE(fast_run.ok()) << fast_run.status();
  ASSERT_TRUE(slow_run.ok()) << slow_run.status();
  const double coll =
      IntraCollectiveSeconds(even, 2) + InterCollectiveSeconds(even, 4, 2);
  EXPECT_NEAR(slow_run->mean_step_seconds - coll,
              1.3 * (fast_run->mean_step_seconds - coll), 1e-9);
  // The three fast super nodes idle while they wait.
  EXPECT_LT(slow_run->card_busy_fraction, 0.9);
}

// fused+stalesync:s:k sets the policy lag and the clock skew apart: with
// s = 2, k = 1 the rollouts still run 2 versions behind, while the gate
// holds the straggler's lead to k + 1 = 2 (never 3, as s = k = 2 allows).
TEST_F(SimulatorTest, PolicyLagAndClockSkewAreSetApart) {
  auto m = ParseSimMode("fused+stalesync:2:1");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->policy_lag, 2);
  EXPECT_EQ(m->clock_skew, 1);
  m = ParseSimMode("fused+stalesync:3");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->policy_lag, 3);
  EXPECT_EQ(m->clock_skew, 3);
  for (const char* bad :
       {"fused+stalesync:", "fused+stalesync:2:", "fused+stalesync:2:1:0",
        "fused+stalesync:-1", "fused+stalesync2", "fused+stalesync:a:1"}) {
    auto b = ParseSimMode(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(b.status().message()), ::testing::HasSubstr(bad));
  }

  CostModel c;
  c.response_length = {100, 0.5, 1000};
  auto run = Run(c, "fused+stalesync:2:1", 4, 2, 12);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->max_staleness, 2);
  EXPECT_GE(run->max_clock_skew, 1);
  EXPECT_LE(run->max_clock_skew, 2);
  EXPECT_EQ(run->groups_trained, run->groups_submitted);
}

TEST_F(SimulatorTest, NoTensorBytesGoThroughTheController) {
  for (const std::string mode : {"colocated-sync", "fused+stalesync:1"}) {
    auto r = Run(Deterministic(), mode, 2, 2);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->controller_tensor_bytes_per_step, 0);
    EXPECT_GT(r->controller_messages_per_step, 0);
    EXPECT_GT(r->controller_cpu_seconds_per_step, 0);
  }
}

TEST_F(SimulatorTest, MessagesFollowTheWorkersProtocol) {
  // Per step and node: GetStepPlan for each of its 2 cards and one
  // FinishStep; per run: one GetAssignment per node and the end (each
  // node's GetStepPlan, the lead's FinishStep). 2 nodes, 6 steps.
  auto r = Run(Deterministic(), "colocated-sync", 2, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->controller_messages_per_step, (6.0 * 2 * 3 + 2 + 2 + 1) / 6,
              1e-12);
}

TEST(SimConfigTest, UnknownCostModelKeyIsNamed) {
  auto c = ParseSimConfig(
      "job: {run: {total_steps: 2}}\ncost_model: {decode_secs: 1}\n",
      "sim.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              HasSubstr("sim.yaml: cost_model.decode_secs: unknown key"));
  auto nested = ParseSimConfig(
      "job: {}\ncost_model: {response_length: {mean: 3}}\n", "sim.yaml");
  ASSERT_FALSE(nested.ok());
  EXPECT_THAT(nested.status().message(),
              HasSubstr("sim.yaml: cost_model.response_length.mean: unknown"));
  auto value = ParseSimConfig(
      "job: {}\ncost_model: {inter_bandwidth_gbps: 0}\n", "sim.yaml");
  ASSERT_FALSE(value.ok());
  EXPECT_THAT(value.status().message(),
              HasSubstr("cost_model.inter_bandwidth_gbps: must be > 0"));
  auto job =
      ParseSimConfig("job: {rollout: {prompt_per_step: 2}}\n", "sim.yaml");
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(),
              HasSubstr("sim.yaml: job.rollout.prompt_per_step: unknown key"));
  auto top = ParseSimConfig("job: {}\ncost: {}\n", "sim.yaml");
  ASSERT_FALSE(top.ok());
  EXPECT_THAT(top.status().message(), HasSubstr("sim.yaml: cost: unknown"));
}

TEST(CalibrationTest, FitsLinearCostsOfARun) {
  const std::string dir = ::testing::TempDir() + "/sim-calibration";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.yaml")
      << "num_threads: 2\nplacement: {super_nodes: 1, "
         "cards_per_super_node: 1}\nrollout: {prompts_per_step: 4, "
         "group_size: 2, max_new_tokens: 9}\n";
  std::ofstream metrics(dir + "/metrics.jsonl");
  // rollout = 0.1 + 0.001 t, train = 0.2 + 0.002 t, 0.05 s else.
  const double tokens[] = {50, 30, 40, 60, 50};
  for (int i = 0; i < 5; ++i) {
    const double t = tokens[i], ro = 0.1 + 0.001 * t, tr = 0.2 + 0.002 * t;
    metrics << "{\"step\":" << i + 1 << ",\"rollout_tokens\":" << t
            << ",\"rollout_seconds\":" << ro << ",\"train_seconds\":" << tr
            << ",\"step_seconds\":" << ro + tr + 0.05 << "}\n";
  }
  metrics.close();
  auto cal = CalibrateFromRun(dir, CostModel{});
  ASSERT_TRUE(cal.ok()) << cal.status();
  EXPECT_EQ(cal->steps_used, 4);
  EXPECT_EQ(cal->rollout_fit, "least squares");
  EXPECT_NEAR(cal->cost.decode_seconds_per_token, 0.001, 1e-9);
  EXPECT_NEAR(cal->cost.train_seconds_per_token, 0.002, 1e-9);
  EXPECT_NEAR(cal->cost.train_seconds_per_step_base, 0.2, 1e-9);
  EXPECT_NEAR(cal->cost.step_overhead_seconds, 0.05, 1e-9);
  // 45 tokens over 8 responses: 5.625 -> 6 decode steps share the 0.1 s.
  EXPECT_NEAR(cal->cost.response_length.median, 45.0 / 8, 1e-9);
  EXPECT_NEAR(cal->cost.decode_seconds_per_step_base, 0.1 / 6, 1e-9);
  EXPECT_EQ(cal->cost.calibration_threads, 2);
  EXPECT_FALSE(CalibrateFromRun(dir + "/missing", CostModel{}).ok());
}

}  // namespace
}  // namespace fusionrl::sim
