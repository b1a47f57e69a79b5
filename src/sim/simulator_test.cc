// The simulator against hand-computed cost-model sums and the controller's
// own records: step times, scaling with and without collective cost, every
// prompt group trained once, the clock-skew gate under a straggler, no
// tensor bytes through the controller, strict config errors, calibration;
// the roofline timing and the co-location model of fused cards.
#include "sim/simulator.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/calibration.h"
#include "sim/cost_model.h"
#include "sim/sim_config.h"

namespace fusionrl::sim {
namespace {

using ::testing::HasSubstr;

// One super node's share: prompt groups of `group_size` responses.
std::string JobYaml(int steps, int prompts_per_node, int group_size = 4) {
  return absl::StrCat(R"(name: simtest
model: {d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64, max_seq_len: 24}
task: {name: reverse, eval_size: 10, min_digits: 1, max_digits: 3}
rollout: {prompts_per_step: )",
                      prompts_per_node, ", group_size: ", group_size,
                      R"(, max_new_tokens: 5}
run: {eval_every: 0, total_steps: )",
                      steps, "}\n");
}

// No randomness, no stragglers: every card of every node takes the same
// time, so any difference between runs is the model's structure. Measured
// (linear) seconds, so that step times are hand-computable sums.
CostModel Deterministic() {
  CostModel m;
  m.timing = Timing::kLinear;
  m.response_length = {100, 0, 4096};
  m.prompt_length = 10;
  m.jitter_sigma = 0;
  m.straggler_super_nodes = 0;
  return m;
}

class SimulatorTest : public ::testing::Test {
 protected:
  // 2 prompt groups of `group_size` responses per card.
  absl::StatusOr<SimRunResult> Run(const CostModel& cost,
                                   const std::string& mode, int nodes,
                                   int cards, int steps = 6,
                                   int group_size = 4) {
    SimRunSpec spec;
    spec.job_yaml = JobYaml(steps, 2 * cards, group_size);
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
    EXPECT_EQ(r->job_phase, "SUCCEEDED");
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

// --- the roofline timing and the co-location model -------------------------

TEST(CostModelTest, AMemoryBoundDecodeStepBarelyChangesWithBatch) {
  const CostModel m;  // 7B-like on an H100-class card
  const double bandwidth = 3350e9;
  const WorkSegment one = DecodeStep(m, 1, 512);
  EXPECT_NEAR(one.seconds, (7e9 * 2 + 512 * 57344.0) / bandwidth, 1e-15);
  EXPECT_NEAR(one.demand.hbm, 1, 1e-12);
  // 32x the rows: the weights are still most of the bytes.
  const WorkSegment many = DecodeStep(m, 32, 512);
  EXPECT_NEAR(many.demand.hbm, 1, 1e-12);
  EXPECT_LT(many.seconds / one.seconds, 1.1);
  EXPECT_LT(many.demand.compute, 0.5);
  // So a row's share of a step is ~32x dearer alone: a tail of one long
  // response costs almost what the full batch did per step.
  EXPECT_GT(one.seconds / (many.seconds / 32), 29);
  // Past the ridge (a tiny model, a huge batch) decode is compute-bound.
  CostModel tiny = m;
  tiny.model_params = 1e6;
  tiny.kv_bytes_per_token = 0;
  const WorkSegment wide = DecodeStep(tiny, 100000, 512);
  EXPECT_NEAR(wide.demand.compute, 1, 1e-12);
  EXPECT_NEAR(wide.seconds, 2 * 1e6 * 100000 / 989e12, 1e-15);
}

TEST(CostModelTest, TheRolloutWaitsForItsLongestResponse) {
  CostModel m;
  m.prompt_length = 0;
  // One row of 1000 tokens among 63 of 10: nearly the cost of 64 rows of
  // 1000, far from the average length's.
  std::vector<int> tail(63, 10);
  tail.push_back(1000);
  const std::vector<int> all_long(64, 1000);
  const std::vector<int> all_mean(64, (63 * 10 + 1000) / 64);
  const double t_tail = RolloutSeconds(m, tail);
  EXPECT_GT(t_tail, 0.8 * RolloutSeconds(m, all_long));
  EXPECT_GT(t_tail, 30 * RolloutSeconds(m, all_mean));
  // One segment per batch size: 64 rows, then 1 (no prefill: no prompt).
  const Work w = RolloutWork(m, tail);
  ASSERT_EQ(w.segments.size(), 2u);
  EXPECT_LT(w.segments[1].demand.compute, w.segments[0].demand.compute);
  // Training is compute-bound: 8 x params x tokens at 40% of peak.
  EXPECT_NEAR(TrainSeconds(m, tail), 8 * 7e9 * (63 * 10 + 1000) / 395.6e12,
              1e-12);
}

TEST(CostModelTest, CoLocationNeverGivesARoleMoreThanItsSoloSpeed) {
  const std::vector<double> levels = {0, 0.1, 0.5, 0.9, 1};
  for (double interference : {1.0, 0.7}) {
    for (double rh : levels) {
      for (double rc : levels) {
        for (double th : levels) {
          for (double tc : levels) {
            const Demand roll{rh, rc}, train{th, tc};
            const CoRates r = CoLocatedRates(roll, train, interference);
            SCOPED_TRACE(absl::StrCat("rollout {", rh, ", ", rc, "}, train {",
                                      th, ", ", tc, "}, ", interference));
            EXPECT_GE(r.rollout, 0);
            EXPECT_GE(r.train, 0);
            EXPECT_LE(r.rollout, interference + 1e-12);
            EXPECT_LE(r.train, interference + 1e-12);
            // No resource is used beyond the card's.
            EXPECT_LE(r.rollout * rh + r.train * th, 1 + 1e-9);
            EXPECT_LE(r.rollout * rc + r.train * tc, 1 + 1e-9);
            // Never worse than one role after the other (interference
            // aside).
            EXPECT_GE(r.rollout + r.train, interference - 1e-12);
          }
        }
      }
    }
  }
  // A bandwidth-bound decode and a compute-bound trainer: each runs on
  // what the other leaves of its resource, both resources used up.
  const CoRates r = CoLocatedRates({1, 0.2}, {0.1, 1}, 1);
  EXPECT_NEAR(r.rollout, 1 - 0.1 * r.train, 1e-12);
  EXPECT_NEAR(r.train, 1 - 0.2 * r.rollout, 1e-12);
  EXPECT_NEAR(r.rollout, 0.9 / 0.98, 1e-12);
  // Both bound by the same resource (the linear timing's cores): halves.
  const CoRates cores = CoLocatedRates({0, 1}, {0, 1}, 0.9);
  EXPECT_NEAR(cores.rollout, 0.45, 1e-12);
  EXPECT_NEAR(cores.train, 0.45, 1e-12);
  // The old fixed share, when set, replaces the model.
  CostModel old;
  old.fused_concurrency_share = 0.6;
  const CoRates fixed = CoLocatedRates(old, {1, 0.2}, {0.1, 1});
  EXPECT_EQ(fixed.rollout, 0.6);
  EXPECT_EQ(fixed.train, 0.6);
}

// A one-card step of the roofline timing, summed here step by step.
TEST_F(SimulatorTest, RooflineStepIsTheHandComputedSum) {
  CostModel m;
  m.response_length = {100, 0, 4096};
  m.prompt_length = 10;
  m.jitter_sigma = 0;
  m.straggler_super_nodes = 0;
  auto r = Run(m, "colocated-sync", 1, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  const double peak = 989e12, flops = peak * 0.4, bytes = 3350e9;
  const double weights = 7e9 * 2, kv = 57344;
  // 8 rows: prefill of 80 prompt tokens at the MFU, then 100 decode steps
  // of 8 rows at the roofline.
  double rollout = std::max(2 * 7e9 * 80 / flops, (weights + 80 * kv) / bytes);
  for (int t = 0; t < 100; ++t) {
    rollout +=
        std::max(2 * 7e9 * 8 / peak, (weights + 8 * (10 + t) * kv) / bytes);
  }
  const double train = 8 * 7e9 * 8 * (100 + 10) / flops;
  EXPECT_NEAR(r->mean_step_seconds, rollout + train, 1e-9);
}

// The fused gain, fused+stalesync:2 over colocated-sync, on one super
// node of 2 cards with 128 responses each (the 7B profile's batch), where
// rollout and training take comparable time.
class FusedGainTest : public SimulatorTest {
 protected:
  double Gain(const CostModel& m) {
    auto sync = Run(m, "colocated-sync", 1, 2, 10, 64);
    auto fused = Run(m, "fused+stalesync:2", 1, 2, 10, 64);
    EXPECT_TRUE(sync.ok()) << sync.status();
    EXPECT_TRUE(fused.ok()) << fused.status();
    if (!sync.ok() || !fused.ok()) return 0;
    return fused->tokens_per_second / sync->tokens_per_second;
  }
  static CostModel Profile(double sigma, double interference) {
    CostModel m;  // 7B-like, H100-class
    m.response_length.sigma = sigma;
    m.straggler_super_nodes = 0;
    m.interference = interference;
    return m;
  }
};

TEST_F(FusedGainTest, FusedNeverLosesWithoutInterferenceAndLessWithIt) {
  // Every card alike (no tail, no jitter): the gain is co-running alone.
  auto alike = [](double interference) {
    CostModel m = Profile(0, interference);
    m.jitter_sigma = 0;
    return m;
  };
  const double ideal = Gain(alike(1.0));
  const double some = Gain(alike(0.8));
  const double half = Gain(alike(0.5));
  EXPECT_GT(ideal, 1.05);
  EXPECT_LT(some, ideal - 0.05);
  // At 0.5 co-running does less than one role after the other.
  EXPECT_LT(half, 1.0);
  std::printf("fused gain: interference 1 %.3f, 0.8 %.3f, 0.5 %.3f\n", ideal,
              some, half);
  // With the tail and jitter, interference 1 still never loses.
  EXPECT_GE(Gain(Profile(0.7, 1.0)), 1.0);
}

// A long tail is decode at a small batch: a memory-bound step that uses
// little compute, which the trainer takes. While the rollout is shorter
// than training (as here), more tail is more time co-run.
TEST_F(FusedGainTest, ALongerTailRaisesTheFusedGain) {
  const double short_tail = Gain(Profile(0.3, 0.9));
  const double long_tail = Gain(Profile(0.7, 0.9));
  EXPECT_GT(long_tail, short_tail + 0.05);
  std::printf("fused gain: tail sigma 0.3 %.3f, 0.7 %.3f\n", short_tail,
              long_tail);
}

TEST(SimConfigTest, KeysOfTheOtherTimingNameWhatReplacedThem) {
  auto old = ParseSimConfig(
      "job: {}\ncost_model: {decode_seconds_per_token: 5.0e-5}\n", "sim.yaml");
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(old.status().message(),
              HasSubstr("sim.yaml: cost_model.decode_seconds_per_token: a "
                        "key of timing: linear"));
  EXPECT_THAT(old.status().message(), HasSubstr("peak_tflops, hbm_gbps"));
  EXPECT_THAT(old.status().message(), HasSubstr("set timing: linear"));
  // The old config, with its timing named, still reads (share included).
  auto kept = ParseSimConfig(
      "job: {}\ncost_model: {timing: linear, decode_seconds_per_token: "
      "5.0e-5, fused_concurrency_share: 0.6}\n",
      "sim.yaml");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->cost.timing, Timing::kLinear);
  EXPECT_EQ(kept->cost.fused_concurrency_share, 0.6);
  auto other = ParseSimConfig(
      "job: {}\ncost_model: {timing: linear, peak_tflops: 900}\n", "sim.yaml");
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(),
              HasSubstr("cost_model.peak_tflops: a key of timing: roofline"));
  auto timing =
      ParseSimConfig("job: {}\ncost_model: {timing: gpu}\n", "sim.yaml");
  ASSERT_FALSE(timing.ok());
  EXPECT_THAT(timing.status().message(),
              HasSubstr("cost_model.timing: must be roofline or linear"));
  auto range =
      ParseSimConfig("job: {}\ncost_model: {interference: 0}\n", "sim.yaml");
  ASSERT_FALSE(range.ok());
  EXPECT_THAT(range.status().message(),
              HasSubstr("cost_model.interference: must be in (0, 1]"));
  // --cost reads as strictly, after a calibration's linear timing too.
  CostModel linear;
  linear.timing = Timing::kLinear;
  auto cost = ApplyCostOverrides(linear, {"mfu=0.5"});
  ASSERT_FALSE(cost.ok());
  EXPECT_THAT(cost.status().message(), HasSubstr("--cost: cost_model.mfu"));
}

TEST(SimConfigTest, ShippedConfigsLoad) {
  for (const char* name :
       {"simulate.yaml", "simulate-7b.yaml", "simulate-32b.yaml"}) {
    SCOPED_TRACE(name);
    auto c =
        LoadSimConfig(absl::StrCat(FUSIONRL_SOURCE_DIR, "/configs/", name));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->cost.timing, Timing::kRoofline);
    EXPECT_EQ(c->cost.fused_concurrency_share, 0);
  }
}

// The figures of docs/simulate.md ("The GPU regime"): not a check, a
// driver, run by hand (sim_test --gtest_also_run_disabled_tests
// --gtest_filter=SimReport.DISABLED_GpuRegime). It does what `fusionrl
// simulate CONFIG --cards-per-super-node C --modes ... --cost ...` does
// (LoadSimConfig, ApplyCostOverrides, RunSimulation) and prints one line
// per run.
TEST(SimReport, DISABLED_GpuRegime) {
  struct Case {
    const char* config;
    int cards;  // per super node
    std::vector<std::string> cost;
    std::vector<int> super_nodes;
  };
  const char* const k7 = "simulate-7b.yaml";
  const char* const k32 = "simulate-32b.yaml";
  const std::vector<Case> cases = {
      {k7, 8, {}, {1, 4}},
      {k32, 2, {}, {1, 4}},
      {k7, 8, {"interference=1"}, {1}},
      {k32, 2, {"interference=1"}, {1}},
      {k7, 8, {"interference=0.8"}, {1}},
      {k32, 2, {"interference=0.8"}, {1}},
      {k7, 8, {"response_length.sigma=0.3"}, {1}},
      {k32, 2, {"response_length.sigma=0.3"}, {1}},
      {k7, 8, {"train_hbm_fraction=0.3"}, {1}},
      {k32, 2, {"train_hbm_fraction=0.3"}, {1}},
      {k7, 8, {"fused_concurrency_share=0.6"}, {1}},
      {k7, 8, {"straggler_super_nodes=1"}, {4}},
      {k32, 2, {"straggler_super_nodes=1"}, {4}},
  };
  int run = 0;
  for (const Case& c : cases) {
    auto config =
        LoadSimConfig(absl::StrCat(FUSIONRL_SOURCE_DIR, "/configs/", c.config));
    ASSERT_TRUE(config.ok()) << config.status();
    auto cost = ApplyCostOverrides(config->cost, c.cost);
    ASSERT_TRUE(cost.ok()) << cost.status();
    std::map<int, double> sync;  // colocated-sync tokens/s per N
    for (const char* mode_name :
         {"colocated-sync", "fused+stalesync:1", "fused+stalesync:2"}) {
      double one = 0;
      std::vector<int> counts = c.super_nodes;
      if (counts.front() != 1) counts.insert(counts.begin(), 1);
      for (int n : counts) {
        SimRunSpec spec;
        spec.job_yaml = config->job_yaml;
        spec.source_name = c.config;
        spec.cost = *cost;
        spec.mode = *ParseSimMode(mode_name);
        spec.super_nodes = n;
        spec.cards_per_super_node = c.cards;
        spec.output_dir =
            absl::StrCat(::testing::TempDir(), "/sim-report-", ++run);
        std::filesystem::remove_all(spec.output_dir);
        auto r = RunSimulation(spec);
        ASSERT_TRUE(r.ok()) << r.status();
        if (n == 1) one = r->tokens_per_second;
        if (std::string(mode_name) == "colocated-sync") {
          sync[n] = r->tokens_per_second;
        }
        // config | --cost | mode | N | tokens/s | x colocated-sync (same
        // N) | scaling efficiency | step | card busy
        std::printf("%s | %s | %s | %d | %.0f | %.3f | %.3f | %.1f s | %.2f\n",
                    c.config, absl::StrJoin(c.cost, " ").c_str(), mode_name, n,
                    r->tokens_per_second, r->tokens_per_second / sync[n],
                    r->tokens_per_second / (n * one), r->mean_step_seconds,
                    r->card_busy_fraction);
      }
    }
  }
}

}  // namespace
}  // namespace fusionrl::sim
