#include "local/rl_job_test_util.h"

#include <torch/types.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/train/checkpoint.h"
#include "fusionrl/task.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

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

}  // namespace

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
void ExpectSameWeights(const std::string& dir_a, const std::string& dir_b,
                       const ModelConfig& model, double tolerance) {
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
                       JobSummary* straight) {
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

}  // namespace fusionrl
