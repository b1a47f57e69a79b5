// ConfigTest: the range rules and the checks across fields (sampling,
// stalesync, placement, env).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/config_test_util.h"
#include "fusionrl/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using config_testing::ExpectError;
using config_testing::ExpectSameConfig;
using config_testing::MissingPath;
using config_testing::WriteTempFile;

// Top-k / top-p behaviour log-probs are the truncated distribution's: the
// plain PPO ratio would take them as the trainer's, so sampling with either
// needs a recomputed proximal policy (decoupled PPO or a rollout correction).
TEST(ConfigTest, TruncatedSamplingNeedsARecomputedProximalPolicy) {
  for (const char* sampling : {"  top_k: 20\n", "  top_p: 0.9\n"}) {
    SCOPED_TRACE(sampling);
    const std::string rollout = absl::StrCat("rollout:\n", sampling);
    absl::StatusOr<JobConfig> plain = ParseJobConfig(rollout, "job.yaml");
    ASSERT_FALSE(plain.ok());
    EXPECT_THAT(std::string(plain.status().message()),
                HasSubstr("needs the trainer to recompute the proximal "
                          "log-probs"));
    for (const char* fix : {"algorithm:\n  rollout_correction: tis\n",
                            "algorithm:\n  decoupled_loss: true\n",
                            "rollout:\n  temperature: 0\n"}) {
      SCOPED_TRACE(fix);
      const std::string text =
          std::string(fix).rfind("rollout", 0) == 0
              ? absl::StrCat("rollout:\n", sampling, "  temperature: 0\n")
              : absl::StrCat(rollout, fix);
      EXPECT_TRUE(ParseJobConfig(text, "job.yaml").ok()) << text;
    }
  }
}

TEST(ConfigTest, RolloutCorrectionAndDecoupledLossAreOneWeight) {
  absl::StatusOr<JobConfig> both = ParseJobConfig(
      "algorithm:\n  decoupled_loss: true\n  rollout_correction: mis\n",
      "job.yaml");
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(std::string(both.status().message()),
              HasSubstr("job.yaml: algorithm.rollout_correction: mis with "
                        "algorithm.decoupled_loss: true"));
  // A rollout correction is a behaviour weight: it also admits a lag.
  EXPECT_TRUE(ParseJobConfig("algorithm:\n  rollout_correction: tis\n"
                             "placement:\n  mode: fused\n"
                             "stalesync:\n  max_policy_lag: 1\n",
                             "job.yaml")
                  .ok());
  absl::StatusOr<JobConfig> bad_cap =
      ParseJobConfig("algorithm:\n  rollout_correction_cap: 1\n", "job.yaml");
  ASSERT_FALSE(bad_cap.ok());
  EXPECT_THAT(std::string(bad_cap.status().message()),
              HasSubstr("algorithm.rollout_correction_cap: must be > 1"));
}

TEST(ConfigTest, OverlongSettingsAreParsedAndChecked) {
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      "rollout:\n  max_new_tokens: 32\n  overlong: penalize\n"
      "  overlong_buffer: 8\n  overlong_penalty: 0.5\n",
      "job.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rollout.overlong, OverlongMode::kPenalize);
  EXPECT_EQ(c->rollout.overlong_buffer, 8);
  EXPECT_EQ(c->rollout.overlong_penalty, 0.5);
  absl::StatusOr<JobConfig> unknown =
      ParseJobConfig("rollout:\n  overlong: drop\n", "job.yaml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("rollout.overlong: must be one of keep, mask, "
                        "penalize; got 'drop'"));
  absl::StatusOr<JobConfig> long_buffer = ParseJobConfig(
      "rollout:\n  max_new_tokens: 8\n  overlong_buffer: 9\n", "job.yaml");
  ASSERT_FALSE(long_buffer.ok());
  EXPECT_THAT(std::string(long_buffer.status().message()),
              HasSubstr("rollout.overlong_buffer: must be <= "
                        "rollout.max_new_tokens (8), got 9"));
}

TEST(ConfigTest, EnvSettingsAreParsedAndChecked) {
  absl::StatusOr<JobConfig> c = ParseJobConfig(
      "env:\n  name: remote\n  address: 127.0.0.1:5000,10.0.0.2:5000\n"
      "  tool_format: hermes\n  max_turns: 6\n  max_episode_tokens: 64\n"
      "  call_deadline_seconds: 2.5\n  on_failure: drop\n"
      "  admit_after_steps: 8\n",
      "job.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->env.name, "remote");
  EXPECT_EQ(c->env.address, "127.0.0.1:5000,10.0.0.2:5000");
  EXPECT_EQ(c->env.tool_format, "hermes");
  EXPECT_EQ(c->env.max_turns, 6);
  EXPECT_EQ(c->env.max_episode_tokens, 64);
  EXPECT_EQ(c->env.call_deadline_seconds, 2.5);
  EXPECT_EQ(c->env.on_failure, "drop");
  EXPECT_EQ(c->env.admit_after_steps, 8);
  const std::pair<const char*, const char*> bad[] = {
      {"env:\n  name: remote\n",
       "env.address: env.name: remote needs the environment server's "
       "host:port"},
      {"env:\n  address: 127.0.0.1:5000\n",
       "env.address: is set but env.name is not"},
      {"rollout:\n  max_new_tokens: 16\n"
       "env:\n  name: calculator\n  max_episode_tokens: 8\n",
       "env.max_episode_tokens: must be 0 or >= rollout.max_new_tokens (16), "
       "got 8"},
      {"env:\n  name: calculator\nplacement:\n  mode: fused\n"
       "stalesync:\n  max_policy_lag: 2\n  partial_rollout_tokens: 4\n"
       "algorithm:\n  decoupled_loss: true\n",
       "stalesync.partial_rollout_tokens: must be 0 with env.name set"},
      {"env:\n  name: calculator\nrollout:\n  overlong: penalize\n",
       "rollout.overlong: penalize ramps a response's reward"},
      {"env:\n  name: calculator\n  on_failure: retry\n",
       "env.on_failure: must be one of zero, drop; got 'retry'"},
      {"env:\n  name: calculator\n  max_turns: 0\n", "env.max_turns: "},
      {"env:\n  name: calculator\n  call_deadline_seconds: 0\n",
       "env.call_deadline_seconds: "},
  };
  for (const auto& [yaml, message] : bad) {
    absl::StatusOr<JobConfig> r = ParseJobConfig(yaml, "job.yaml");
    ASSERT_FALSE(r.ok()) << yaml;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(message)) << yaml;
  }
}

TEST(ConfigTest, RejectsOutOfRangeValue) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig("rollout:\n  top_p: 1.5\n", "job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            "job.yaml: rollout.top_p: must be in (0, 1], got 1.5");
}

TEST(ConfigTest, RejectsEnumOutsideSet) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig("algorithm:\n  adv_estimator: ppo2\n", "job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            "job.yaml: algorithm.adv_estimator: must be one of grpo, rloo, "
            "reinforce_pp; got 'ppo2'");
}

TEST(ConfigTest, BehaviourWeightModeIsParsedOnceAsAnEnum) {
  absl::StatusOr<JobConfig> defaults = ParseJobConfig("{}", "job.yaml");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->algorithm.behaviour_weight_mode,
            BehaviourWeightMode::kTruncate);
  for (BehaviourWeightMode mode :
       {BehaviourWeightMode::kTruncate, BehaviourWeightMode::kMask}) {
    const std::string name = BehaviourWeightModeName(mode);
    absl::StatusOr<BehaviourWeightMode> parsed = ParseBehaviourWeightMode(name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, mode);
    absl::StatusOr<JobConfig> config = ParseJobConfig(
        absl::StrCat("algorithm:\n  behaviour_weight_mode: ", name, "\n"),
        "job.yaml");
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->algorithm.behaviour_weight_mode, mode);
    EXPECT_THAT(JobConfigToYaml(*config),
                HasSubstr(absl::StrCat("behaviour_weight_mode: ", name, "\n")));
  }
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      "{}", "job.yaml", {"algorithm.behaviour_weight_mode=mask"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->algorithm.behaviour_weight_mode,
            BehaviourWeightMode::kMask);
}

TEST(ConfigTest, RejectsUnknownBehaviourWeightMode) {
  absl::StatusOr<JobConfig> config =
      ParseJobConfig("algorithm:\n  behaviour_weight_mode: clip\n", "job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            "job.yaml: algorithm.behaviour_weight_mode: must be one of "
            "truncate, mask; got 'clip'");
  ExpectError("{}", absl::StatusCode::kInvalidArgument,
              {"--set algorithm.behaviour_weight_mode=Mask: must be one of "
               "truncate, mask; got 'Mask'"},
              {"algorithm.behaviour_weight_mode=Mask"});
  ExpectError("algorithm:\n  behaviour_weight_mode: [mask]\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: algorithm.behaviour_weight_mode: expected a string, "
               "got a sequence"});
  // An empty value reads as "": an enum without that spelling names its
  // values (a sub-block's activation setting has it: the policy's action).
  ExpectError("algorithm:\n  behaviour_weight_mode:\n",
              absl::StatusCode::kInvalidArgument,
              {"job.yaml: algorithm.behaviour_weight_mode: must be one of "
               "truncate, mask; got ''"});
  EXPECT_FALSE(ParseBehaviourWeightMode("").ok());
  EXPECT_STREQ(BehaviourWeightModeName(static_cast<BehaviourWeightMode>(7)),
               "?");
  // A value set in code outside the enum is caught by validation.
  JobConfig c;
  c.algorithm.behaviour_weight_mode = static_cast<BehaviourWeightMode>(7);
  const absl::Status status = ValidateJobConfig(c);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("algorithm.behaviour_weight_mode: not a valid value"));
}

// Every mode, estimator and over-stale policy is an enum parsed once by the
// reader: each YAML spelling parses to its enumerator and is emitted back
// unchanged, and a bad spelling keeps the message of the old string keys.
TEST(ConfigTest, ModesAndEstimatorsAreParsedOnceAsEnums) {
  struct Case {
    std::string key;                 // "algorithm.adv_estimator"
    std::vector<std::string> names;  // every spelling, in enum order
    std::function<std::string(const JobConfig&)> name_of;  // via XName()
    std::string bad;      // a spelling that is not one
    std::string message;  // its error, after "job.yaml: <key>: "
  };
  const std::vector<Case> cases = {
      {"algorithm.adv_estimator",
       {"grpo", "rloo", "reinforce_pp"},
       [](const JobConfig& c) {
         return AdvEstimatorName(c.algorithm.adv_estimator);
       },
       "ppo2",
       "must be one of grpo, rloo, reinforce_pp; got 'ppo2'"},
      {"algorithm.loss_agg_mode",
       {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
        "seq-mean-token-sum-norm"},
       [](const JobConfig& c) {
         return LossAggModeName(c.algorithm.loss_agg_mode);
       },
       "mean",
       "must be one of token-mean, seq-mean-token-mean, seq-mean-token-sum, "
       "seq-mean-token-sum-norm; got 'mean'"},
      {"algorithm.kl_estimator",
       {"k1", "k2", "k3"},
       [](const JobConfig& c) {
         return KlEstimatorName(c.algorithm.kl_estimator);
       },
       "k4",
       "must be one of k1, k2, k3; got 'k4'"},
      {"algorithm.kl_mode",
       {"loss", "reward"},
       [](const JobConfig& c) { return KlModeName(c.algorithm.kl_mode); },
       "both",
       "must be one of loss, reward; got 'both'"},
      {"algorithm.behaviour_weight_level",
       {"token", "sequence"},
       [](const JobConfig& c) {
         return BehaviourWeightLevelName(c.algorithm.behaviour_weight_level);
       },
       "tokens",
       "must be one of token, sequence; got 'tokens'"},
      {"placement.mode",
       {"colocated-sync", "disaggregated", "fused"},
       [](const JobConfig& c) { return PlacementModeName(c.placement.mode); },
       "colocated",
       "must be one of colocated-sync, disaggregated, fused; got 'colocated'"},
      {"placement.fused_turns",
       {"auto", "concurrent", "interleaved", "probe"},
       [](const JobConfig& c) {
         return FusedTurnsName(c.placement.fused_turns);
       },
       "alternating",
       "must be one of auto, concurrent, interleaved, probe; got "
       "'alternating'"},
      {"stalesync.over_stale",
       {"regenerate", "drop"},
       [](const JobConfig& c) {
         return OverStalePolicyName(c.stalesync.over_stale);
       },
       "resample",
       "must be one of regenerate, drop; got 'resample'"},
      {"stalesync.rollout_version",
       {"lagged", "newest", "jit"},
       [](const JobConfig& c) {
         return RolloutVersionName(c.stalesync.rollout_version);
       },
       "latest",
       "must be one of lagged, newest, jit; got 'latest'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    const size_t dot = c.key.find('.');
    const std::string section = c.key.substr(0, dot);
    const std::string field = c.key.substr(dot + 1);
    for (const std::string& name : c.names) {
      SCOPED_TRACE(name);
      std::string yaml =
          absl::StrCat(section, ":\n  ", field, ": ", name, "\n");
      if (name == "disaggregated") {
        absl::StrAppend(&yaml, "  cards_per_super_node: 2\n",
                        "  rollout_cards_per_super_node: 1\n");
      }
      if (name == "concurrent" || name == "interleaved" || name == "probe") {
        absl::StrAppend(&yaml, "  mode: fused\nstalesync:\n  ",
                        "max_policy_lag: 1\nalgorithm:\n  ",
                        "decoupled_loss: true\n");
      }
      absl::StatusOr<JobConfig> config = ParseJobConfig(yaml, "job.yaml");
      ASSERT_TRUE(config.ok()) << config.status();
      EXPECT_EQ(c.name_of(*config), name);
      const std::string emitted = JobConfigToYaml(*config);
      EXPECT_THAT(emitted, HasSubstr(absl::StrCat(field, ": ", name, "\n")));
      absl::StatusOr<JobConfig> back = ParseJobConfig(emitted, "job.yaml");
      ASSERT_TRUE(back.ok()) << back.status();
      ExpectSameConfig(*back, *config);
    }
    // A bad spelling in the file, quoted empty, or given as an override.
    ExpectError(absl::StrCat(section, ":\n  ", field, ": ", c.bad, "\n"),
                absl::StatusCode::kInvalidArgument,
                {absl::StrCat("job.yaml: ", c.key, ": ", c.message)});
    const std::string empty_message =
        absl::StrCat(c.message.substr(0, c.message.rfind("got '")), "got ''");
    ExpectError(absl::StrCat(section, ":\n  ", field, ": \"\"\n"),
                absl::StatusCode::kInvalidArgument,
                {absl::StrCat("job.yaml: ", c.key, ": ", empty_message)});
    ExpectError("{}", absl::StatusCode::kInvalidArgument,
                {absl::StrCat("--set ", c.key, "=", c.bad, ": ", c.message)},
                {absl::StrCat(c.key, "=", c.bad)});
  }
  EXPECT_STREQ(AdvEstimatorName(static_cast<AdvEstimator>(7)), "?");
  EXPECT_STREQ(LossAggModeName(static_cast<LossAggMode>(7)), "?");
  EXPECT_STREQ(KlEstimatorName(static_cast<KlEstimator>(7)), "?");
  EXPECT_STREQ(KlModeName(static_cast<KlMode>(7)), "?");
  EXPECT_STREQ(BehaviourWeightLevelName(static_cast<BehaviourWeightLevel>(7)),
               "?");
  EXPECT_STREQ(PlacementModeName(static_cast<PlacementMode>(7)), "?");
  EXPECT_STREQ(OverStalePolicyName(static_cast<OverStalePolicy>(7)), "?");
  // Case matters, and nothing is a prefix match (these were the engine's
  // own parsers' tests before the config layer parsed the names).
  EXPECT_FALSE(ParsePlacementMode("Fused").ok());
  EXPECT_FALSE(ParseLossAggMode("Token-Mean").ok());
  EXPECT_FALSE(ParseLossAggMode("token-sum").ok());
  EXPECT_FALSE(ParseLossAggMode("").ok());
  EXPECT_FALSE(ParseKlEstimator("low_var_kl").ok());
  EXPECT_FALSE(ParseBehaviourWeightLevel("tokens").ok());
}

// A policy lag without the decoupled loss trains stale samples with the
// plain PPO ratio, a biased update: refused, naming both keys.
TEST(ConfigTest, RefusesPolicyLagWithoutDecoupledLoss) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      "placement:\n  mode: fused\nstalesync:\n  max_policy_lag: 2\n",
      "job.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(config.status().message()),
            "job.yaml: stalesync.max_policy_lag: 2 > 0 requires "
            "algorithm.decoupled_loss: true (samples from an older policy "
            "trained with the plain PPO ratio give a biased update); set "
            "algorithm.decoupled_loss: true (or algorithm.rollout_correction: "
            "tis | mis), or stalesync.max_policy_lag: 0");
  // The override that set the lag is blamed.
  ExpectError("placement:\n  mode: fused\n", absl::StatusCode::kInvalidArgument,
              {"--set stalesync.max_policy_lag=1: 1 > 0 requires "
               "algorithm.decoupled_loss: true"},
              {"stalesync.max_policy_lag=1"});
  // Also for a config built in code.
  JobConfig c;
  c.stalesync.max_policy_lag = 1;
  EXPECT_THAT(std::string(ValidateJobConfig(c).message()),
              HasSubstr("stalesync.max_policy_lag: 1 > 0 requires "
                        "algorithm.decoupled_loss: true"));
  c.algorithm.decoupled_loss = true;
  EXPECT_TRUE(ValidateJobConfig(c).ok());
  config = ParseJobConfig(
      "placement:\n  mode: fused\nstalesync:\n  max_policy_lag: 2\n"
      "algorithm:\n  decoupled_loss: true\n",
      "job.yaml");
  EXPECT_TRUE(config.ok()) << config.status();
  // Lag 0 (synchronous) needs nothing.
  config = ParseJobConfig("stalesync:\n  max_policy_lag: 0\n", "job.yaml");
  EXPECT_TRUE(config.ok()) << config.status();
}

// Partial rollout is refused, naming the key, wherever it cannot act.
// placement.fused_turns pins the card's choice only where there is one
// (worker/step/card_turns.h); elsewhere it would be ignored silently.
TEST(ConfigTest, FusedTurnsNeedAFusedRunWithALagAndSharedThreads) {
  JobConfig c;
  c.placement.mode = PlacementMode::kFused;
  c.stalesync.max_policy_lag = 1;
  c.algorithm.decoupled_loss = true;
  for (FusedTurns t :
       {FusedTurns::kAuto, FusedTurns::kConcurrent, FusedTurns::kInterleaved}) {
    c.placement.fused_turns = t;
    EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  }
  const std::vector<std::function<void(JobConfig&)>> edits = {
      [](JobConfig& j) { j.placement.mode = PlacementMode::kColocatedSync; },
      [](JobConfig& j) { j.stalesync.max_policy_lag = 0; },
      [](JobConfig& j) { j.placement.fused_share_idle_threads = false; },
  };
  for (const auto& edit : edits) {
    JobConfig bad = c;
    bad.placement.fused_turns = FusedTurns::kInterleaved;
    edit(bad);
    EXPECT_THAT(std::string(ValidateJobConfig(bad).message()),
                HasSubstr("placement.fused_turns: interleaved applies only to "
                          "placement.mode fused"));
    bad.placement.fused_turns = FusedTurns::kAuto;
    EXPECT_TRUE(ValidateJobConfig(bad).ok()) << ValidateJobConfig(bad);
  }
}

TEST(ConfigTest, PartialRolloutNeedsAFusedLaggedRunWithALagOfTwo) {
  JobConfig c;
  c.placement.mode = PlacementMode::kFused;
  c.stalesync.max_policy_lag = 2;
  c.algorithm.decoupled_loss = true;
  c.rollout.max_new_tokens = 16;
  c.stalesync.partial_rollout_tokens = 8;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.placement.mode = PlacementMode::kDisaggregated;
  c.placement.cards_per_super_node = 2;
  c.placement.rollout_cards_per_super_node = 1;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  struct Case {
    std::function<void(JobConfig&)> edit;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](JobConfig& j) { j.placement.mode = PlacementMode::kColocatedSync; },
       "stalesync.partial_rollout_tokens: 8 > 0 needs placement.mode fused "
       "or disaggregated"},
      {[](JobConfig& j) { j.stalesync.max_policy_lag = 1; },
       "stalesync.partial_rollout_tokens: 8 > 0 needs "
       "stalesync.max_policy_lag >= 2 (got 1)"},
      {[](JobConfig& j) {
         j.stalesync.rollout_version = RolloutVersion::kNewest;
       },
       "stalesync.partial_rollout_tokens: 8 > 0 needs "
       "stalesync.rollout_version: lagged"},
      {[](JobConfig& j) { j.rollout.max_new_tokens = 8; },
       "stalesync.partial_rollout_tokens: 8 must be below "
       "rollout.max_new_tokens (8)"},
  };
  for (const Case& k : cases) {
    JobConfig bad = c;
    bad.placement.mode = PlacementMode::kFused;
    bad.placement.cards_per_super_node = 1;
    bad.placement.rollout_cards_per_super_node = 0;
    k.edit(bad);
    EXPECT_THAT(std::string(ValidateJobConfig(bad).message()),
                HasSubstr(k.says));
  }
  ExpectError("stalesync:\n  partial_rollout_tokens: -1\n",
              absl::StatusCode::kInvalidArgument,
              {"stalesync.partial_rollout_tokens"});
}

TEST(ConfigTest, StepsSharingAVersionNeedAFusedLaggedRunWithinTheLag) {
  JobConfig c;
  c.placement.mode = PlacementMode::kFused;
  c.stalesync.max_policy_lag = 2;
  c.algorithm.decoupled_loss = true;
  c.stalesync.steps_per_version = 3;  // s + 1
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  struct Case {
    std::function<void(JobConfig&)> edit;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](JobConfig& j) {
         j.placement.mode = PlacementMode::kColocatedSync;
         j.stalesync.max_policy_lag = 0;
       },
       "stalesync.steps_per_version: 3 > 1 needs placement.mode fused or "
       "disaggregated"},
      {[](JobConfig& j) { j.stalesync.max_policy_lag = 1; },
       "stalesync.steps_per_version: 3 must be at most "
       "stalesync.max_policy_lag + 1 (2)"},
      {[](JobConfig& j) {
         j.stalesync.rollout_version = RolloutVersion::kJustInTime;
       },
       "stalesync.steps_per_version: 3 > 1 needs "
       "stalesync.rollout_version: lagged"},
      {[](JobConfig& j) {
         j.rollout.max_new_tokens = 16;
         j.stalesync.partial_rollout_tokens = 8;
       },
       "stalesync.steps_per_version: 3 > 1 does not combine with "
       "stalesync.partial_rollout_tokens"},
  };
  for (const Case& k : cases) {
    JobConfig bad = c;
    k.edit(bad);
    EXPECT_THAT(std::string(ValidateJobConfig(bad).message()),
                HasSubstr(k.says));
  }
  ExpectError("stalesync:\n  steps_per_version: 0\n",
              absl::StatusCode::kInvalidArgument,
              {"stalesync.steps_per_version"});
}

TEST(ConfigTest, ValidateChecksRanges) {
  struct Case {
    std::function<void(JobConfig&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](JobConfig& c) { c.seed = -1; }, "seed: must be >= 0, got -1"},
      {[](JobConfig& c) { c.run.collective_timeout_seconds = 0; },
       "run.collective_timeout_seconds: must be > 0, got 0"},
      {[](JobConfig& c) { c.num_threads = 0; },
       "num_threads: must be in [1, 1024], got 0"},
      {[](JobConfig& c) { c.num_threads = 2000; },
       "num_threads: must be in [1, 1024], got 2000"},
      {[](JobConfig& c) { c.device = "gpu"; },
       "device: must be cpu, cuda, cuda:<index> or mps; got 'gpu'"},
      {[](JobConfig& c) { c.device = "cuda:"; },
       "device: must be cpu, cuda, cuda:<index> or mps; got 'cuda:'"},
      {[](JobConfig& c) { c.device = ""; }, "device: must not be empty"},
      {[](JobConfig& c) { c.name = ""; }, "name: must not be empty"},
      {[](JobConfig& c) { c.output_dir = ""; },
       "output_dir: must not be empty"},
      {[](JobConfig& c) { c.model.d_model = 4; },
       "model.d_model: must be >= 8, got 4"},
      {[](JobConfig& c) { c.model.d_model = 130; },
       "model.d_model: must be divisible by model.n_heads (4), got 130"},
      {[](JobConfig& c) { c.model.d_model = 12; },
       "model.d_model: head size model.d_model / model.n_heads must be even"},
      {[](JobConfig& c) { c.model.max_seq_len = 1; },
       "model.max_seq_len: must be >= 2, got 1"},
      {[](JobConfig& c) { c.model.norm_eps = 0; },
       "model.norm_eps: must be > 0, got 0"},
      {[](JobConfig& c) { c.model.rope_theta = -1; },
       "model.rope_theta: must be > 0, got -1"},
      {[](JobConfig& c) { c.model.moe_experts = 129; },
       "model.moe_experts: must be in [0, 128], got 129"},
      {[](JobConfig& c) { c.model.moe_experts = -1; },
       "model.moe_experts: must be in [0, 128], got -1"},
      {[](JobConfig& c) {
         c.model.moe_experts = 1;
         c.model.moe_top_k = 1;
       },
       "model.moe_experts: must be 0 (dense) or in [2, 128], got 1"},
      {[](JobConfig& c) {
         c.model.moe_experts = 1;
         c.model.moe_top_k = 2;
       },
       "model.moe_top_k: must be <= model.moe_experts (1), got 2"},
      {[](JobConfig& c) {
         c.model.moe_experts = 4;
         c.model.moe_top_k = 5;
       },
       "model.moe_top_k: must be <= model.moe_experts (4), got 5"},
      {[](JobConfig& c) { c.model.moe_top_k = 0; },
       "model.moe_top_k: must be in [1, 8], got 0"},
      {[](JobConfig& c) { c.model.moe_groups = 0; },
       "model.moe_groups: must be in [1, 128], got 0"},
      {[](JobConfig& c) { c.model.moe_capacity_factor = -0.5; },
       "model.moe_capacity_factor: must be >= 0, got -0.5"},
      {[](JobConfig& c) { c.model.moe_aux_loss_coef = -1; },
       "model.moe_aux_loss_coef: must be >= 0, got -1"},
      {[](JobConfig& c) { c.model.moe_z_loss_coef = -1; },
       "model.moe_z_loss_coef: must be >= 0, got -1"},
      {[](JobConfig& c) { c.model.moe_d_ff = -1; },
       "model.moe_d_ff: must be >= 0, got -1"},
      {[](JobConfig& c) { c.task.name = ""; }, "task.name: must not be empty"},
      {[](JobConfig& c) { c.task.eval_size = 0; },
       "task.eval_size: must be >= 1, got 0"},
      {[](JobConfig& c) { c.task.min_digits = 0; },
       "task.min_digits: must be in [1, 18], got 0"},
      {[](JobConfig& c) { c.task.max_digits = 19; },
       "task.max_digits: must be in [1, 18], got 19"},
      {[](JobConfig& c) {
         c.task.min_digits = 5;
         c.task.max_digits = 3;
       },
       "task.max_digits: must be >= task.min_digits (5), got 3"},
      {[](JobConfig& c) { c.task.num_operands = 7; },
       "task.num_operands: must be in [2, 6], got 7"},
      {[](JobConfig& c) { c.task.max_operand = 0; },
       "task.max_operand: must be in [1, 1000], got 0"},
      {[](JobConfig& c) { c.task.long_fraction = 1.5; },
       "task.long_fraction: must be in [0, 1], got 1.5"},
      {[](JobConfig& c) { c.task.long_fraction = -0.1; },
       "task.long_fraction: must be in [0, 1], got -0.1"},
      {[](JobConfig& c) { c.task.long_max = 0; },
       "task.long_max: must be in [1, 500], got 0"},
      {[](JobConfig& c) { c.task.long_max = 501; },
       "task.long_max: must be in [1, 500], got 501"},
      {[](JobConfig& c) { c.task.chat_template = "qwen"; },
       "task.chat_template: must be chatml, llama3 or none (empty = auto, "
       "from the model's tokenizer_config.json); got 'qwen'"},
      {[](JobConfig& c) { c.rollout.group_size = 0; },
       "rollout.group_size: must be >= 1, got 0"},
      {[](JobConfig& c) { c.rollout.temperature = -0.5; },
       "rollout.temperature: must be >= 0, got -0.5"},
      {[](JobConfig& c) {
         c.rollout.temperature = std::numeric_limits<double>::quiet_NaN();
       },
       "rollout.temperature: must be >= 0, got nan"},
      {[](JobConfig& c) { c.rollout.top_k = -1; },
       "rollout.top_k: must be >= 0, got -1"},
      {[](JobConfig& c) { c.rollout.top_p = 0; },
       "rollout.top_p: must be in (0, 1], got 0"},
      {[](JobConfig& c) {
         c.algorithm.adv_estimator = AdvEstimator::kRloo;
         c.rollout.group_size = 1;
       },
       "rollout.group_size: must be >= 2 when algorithm.adv_estimator is "
       "rloo, got 1"},
      {[](JobConfig& c) {
         c.algorithm.adv_estimator = static_cast<AdvEstimator>(7);
       },
       "algorithm.adv_estimator: not a valid value (7)"},
      {[](JobConfig& c) { c.algorithm.gamma = 1.5; },
       "algorithm.gamma: must be in [0, 1], got 1.5"},
      {[](JobConfig& c) { c.algorithm.clip_ratio_low = 1; },
       "algorithm.clip_ratio_low: must be in [0, 1), got 1"},
      {[](JobConfig& c) { c.algorithm.clip_ratio_c = -1; },
       "algorithm.clip_ratio_c: must be >= 0, got -1"},
      {[](JobConfig& c) {
         c.algorithm.loss_agg_mode = static_cast<LossAggMode>(7);
       },
       "algorithm.loss_agg_mode: not a valid value (7)"},
      {[](JobConfig& c) { c.algorithm.kl_coef = -0.1; },
       "algorithm.kl_coef: must be >= 0, got -0.1"},
      {[](JobConfig& c) {
         c.algorithm.kl_estimator = static_cast<KlEstimator>(7);
       },
       "algorithm.kl_estimator: not a valid value (7)"},
      {[](JobConfig& c) { c.algorithm.kl_mode = static_cast<KlMode>(7); },
       "algorithm.kl_mode: not a valid value (7)"},
      {[](JobConfig& c) { c.algorithm.ppo_epochs = 0; },
       "algorithm.ppo_epochs: must be >= 1, got 0"},
      {[](JobConfig& c) { c.optim.lr = 0; }, "optim.lr: must be > 0, got 0"},
      {[](JobConfig& c) { c.optim.beta2 = 1; },
       "optim.beta2: must be in [0, 1), got 1"},
      {[](JobConfig& c) { c.optim.eps = 0; }, "optim.eps: must be > 0, got 0"},
      {[](JobConfig& c) { c.optim.grad_clip = -1; },
       "optim.grad_clip: must be >= 0, got -1"},
      {[](JobConfig& c) { c.optim.micro_batch_size = 0; },
       "optim.micro_batch_size: must be >= 1, got 0"},
      {[](JobConfig& c) { c.run.total_steps = 0; },
       "run.total_steps: must be >= 1, got 0"},
      {[](JobConfig& c) { c.run.log_every = 0; },
       "run.log_every: must be >= 1, got 0"},
      {[](JobConfig& c) { c.sft.batch_size = 0; },
       "sft.batch_size: must be >= 1, got 0"},
      {[](JobConfig& c) { c.sft.lr = 0; }, "sft.lr: must be > 0, got 0"},
      {[](JobConfig& c) { c.sft.warmup_steps = -1; },
       "sft.warmup_steps: must be >= 0, got -1"},
      {[](JobConfig& c) { c.sft.steps = -1; },
       "sft.steps: must be >= 0, got -1"},
      {[](JobConfig& c) { c.rollout.max_new_tokens = 80; },
       "rollout.max_new_tokens: must be < model.max_seq_len (64), got 80"},
      {[](JobConfig& c) { c.rollout.max_new_tokens = 64; },
       "rollout.max_new_tokens: must be < model.max_seq_len (64), got 64"},
      {[](JobConfig& c) { c.placement.mode = static_cast<PlacementMode>(7); },
       "placement.mode: not a valid value (7)"},
      {[](JobConfig& c) {
         c.stalesync.over_stale = static_cast<OverStalePolicy>(7);
       },
       "stalesync.over_stale: not a valid value (7)"},
      {[](JobConfig& c) { c.placement.super_nodes = 0; },
       "placement.super_nodes: must be in [1, 4096], got 0"},
      {[](JobConfig& c) { c.placement.super_nodes = 4097; },
       "placement.super_nodes: must be in [1, 4096], got 4097"},
      {[](JobConfig& c) { c.placement.cards_per_super_node = 0; },
       "placement.cards_per_super_node: must be in [1, 4096], got 0"},
      {[](JobConfig& c) { c.placement.cards_per_super_node = 4097; },
       "placement.cards_per_super_node: must be in [1, 4096], got 4097"},
      {[](JobConfig& c) { c.placement.rollout_cards_per_super_node = -1; },
       "placement.rollout_cards_per_super_node: must be >= 0, got -1"},
      {[](JobConfig& c) {
         c.placement.mode = PlacementMode::kDisaggregated;
         c.placement.cards_per_super_node = 4;
       },
       "placement.rollout_cards_per_super_node: disaggregated needs "
       "1..cards_per_super_node-1 rollout cards, got 0"},
      {[](JobConfig& c) {
         c.placement.mode = PlacementMode::kDisaggregated;
         c.placement.cards_per_super_node = 4;
         c.placement.rollout_cards_per_super_node = 4;
       },
       "placement.rollout_cards_per_super_node: disaggregated needs "
       "1..cards_per_super_node-1 rollout cards, got 4"},
      {[](JobConfig& c) {
         c.placement.mode = PlacementMode::kDisaggregated;
         c.placement.rollout_cards_per_super_node = 1;
       },
       "placement.cards_per_super_node: must be >= 2 when placement.mode is "
       "disaggregated (at least one rollout and one train card), got 1"},
      {[](JobConfig& c) {
         c.placement.mode = PlacementMode::kFused;
         c.placement.cards_per_super_node = 4;
         c.placement.rollout_cards_per_super_node = 2;
       },
       "placement.rollout_cards_per_super_node: must be 0 unless "
       "placement.mode is disaggregated, got 2"},
      {[](JobConfig& c) { c.placement.rollout_cards_per_super_node = 1; },
       "placement.rollout_cards_per_super_node: must be 0 unless "
       "placement.mode is disaggregated, got 1"},
      {[](JobConfig& c) { c.memory.card_budget_mib = -0.5; },
       "memory.card_budget_mib: must be in [0, 1099511627776], got -0.5"},
      {[](JobConfig& c) { c.memory.card_budget_mib = 2e12; },
       "memory.card_budget_mib: must be in [0, 1099511627776], got 2e+12"},
      {[](JobConfig& c) {
         c.memory.card_budget_mib = std::numeric_limits<double>::quiet_NaN();
       },
       "memory.card_budget_mib: must be in [0, 1099511627776], got nan"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    JobConfig config;
    c.mutate(config);
    absl::Status status = ValidateJobConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), StartsWith(c.message));
    // With a source, messages are prefixed by it.
    config.source_path = "job.yaml";
    status = ValidateJobConfig(config);
    EXPECT_THAT(std::string(status.message()),
                StartsWith("job.yaml: " + c.message));
  }
}

TEST(ConfigTest, ValidateAcceptsEdgeValues) {
  JobConfig c;
  c.device = "cuda:12";
  c.algorithm.adv_estimator = AdvEstimator::kRloo;
  c.rollout.group_size = 2;
  c.algorithm.clip_ratio_c = 0.5;  // <= 1: dual clip off
  c.rollout.temperature = 0;
  c.rollout.top_p = 1;
  c.rollout.max_new_tokens = 63;
  c.task.min_digits = 18;
  c.task.max_digits = 18;
  c.task.name = "my_registered_task";
  c.optim.beta1 = 0;
  c.model.d_model = 8;
  c.model.n_heads = 4;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.model.moe_experts = 2;  // top_k 2 of 2 experts, dropless
  c.model.moe_capacity_factor = 0;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.model.moe_experts = 64;
  c.model.moe_top_k = 1;
  c.model.moe_capacity_factor = 0.01;
  c.model.moe_aux_loss_coef = 0;
  c.model.moe_z_loss_coef = 0;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.device = "mps";
  EXPECT_TRUE(ValidateJobConfig(c).ok());
  c.placement.mode = PlacementMode::kDisaggregated;
  c.placement.super_nodes = 4096;
  c.placement.cards_per_super_node = 2;
  c.placement.rollout_cards_per_super_node = 1;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.placement.cards_per_super_node = 4096;
  c.placement.rollout_cards_per_super_node = 4095;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.placement.mode = PlacementMode::kFused;
  c.placement.rollout_cards_per_super_node = 0;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.memory.card_budget_mib = 1099511627776.0;
  c.memory.offload_optimizer = OffloadPolicy::kNever;
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
}

}  // namespace
}  // namespace fusionrl
