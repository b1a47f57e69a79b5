#include "core/mode_spec.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;

TEST(ModeSpecTest, BenchSetsPlacementLagAndSuffixKnobs) {
  absl::StatusOr<ModeSpec> m = ParseModeSpec(
      "fused+stalesync:3+turns:interleaved+partial:64+version:jit+shared:2",
      ModeGrammar::kBench);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->placement, PlacementMode::kFused);
  EXPECT_EQ(m->policy_lag, 3);
  EXPECT_FALSE(m->clock_skew.has_value());
  EXPECT_EQ(m->fused_turns, FusedTurns::kInterleaved);
  EXPECT_EQ(m->partial_rollout_tokens, 64);
  EXPECT_EQ(m->rollout_version, RolloutVersion::kJustInTime);
  EXPECT_EQ(m->steps_per_version, 2);

  m = ParseModeSpec("disaggregated", ModeGrammar::kBench);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->placement, PlacementMode::kDisaggregated);
  EXPECT_EQ(m->policy_lag, 0);
  // Without suffixes: their defaults, and the config's rollout_version.
  EXPECT_EQ(m->fused_turns, FusedTurns::kAuto);
  EXPECT_EQ(m->partial_rollout_tokens, 0);
  EXPECT_EQ(m->steps_per_version, 1);
  EXPECT_FALSE(m->rollout_version.has_value());

  m = ParseModeSpec("fused+stalesync", ModeGrammar::kBench);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->policy_lag, 2);
}

TEST(ModeSpecTest, BenchRefusesWithTheSpellingExpected) {
  struct Case {
    const char* spec;
    const char* message;
  };
  for (const Case& c : {
           Case{"nope",
                "--modes: unknown mode 'nope' (colocated-sync, fused, "
                "fused+stalesync[:s], disaggregated[:s], each "
                "optionally +turns:T, +partial:N, +version:V and "
                "+shared:M)"},
           Case{"fused+stalesync:2:1",
                "--modes: 'fused+stalesync:2:1': expected "
                "fused+stalesync[:s], s in 0..1024"},
           Case{"disaggregated:2000+partial:4",
                "--modes: 'disaggregated:2000': expected disaggregated[:s], "
                "s in 0..1024"},
           Case{"fused+partial:0",
                "--modes: 'fused+partial:0': expected <mode>+partial:N, N >= "
                "1 (stalesync.partial_rollout_tokens); suffixes come in the "
                "order +turns, +partial, +version, +shared"},
           Case{"fused+shared:2+turns:auto", "expected <mode>+shared:M"},
           Case{"fused+version:old", "expected <mode>+version:V"},
           Case{"fused+turns:x", "expected <mode>+turns:T"},
       }) {
    absl::StatusOr<ModeSpec> m = ParseModeSpec(c.spec, ModeGrammar::kBench);
    ASSERT_FALSE(m.ok()) << c.spec;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(c.message));
  }
}

TEST(ModeSpecTest, SimulateSetsLagAndSkewOnly) {
  absl::StatusOr<ModeSpec> m =
      ParseModeSpec("fused+stalesync", ModeGrammar::kSimulate);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->policy_lag, 2);
  EXPECT_EQ(m->clock_skew, 2);
  EXPECT_FALSE(m->fused_turns.has_value());
  EXPECT_FALSE(m->partial_rollout_tokens.has_value());
  EXPECT_FALSE(m->steps_per_version.has_value());
  m = ParseModeSpec("fused", ModeGrammar::kSimulate);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->placement, PlacementMode::kFused);
  EXPECT_EQ(m->clock_skew, 0);
  // Bench's spellings are not the simulator's.
  for (const char* bad : {"disaggregated", "fused+partial:4"}) {
    m = ParseModeSpec(bad, ModeGrammar::kSimulate);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(std::string(m.status().message()),
              absl::StrCat("--modes: unknown mode '", bad,
                           "' (colocated-sync, fused, "
                           "fused+stalesync[:s[:k]])"));
  }
  m = ParseModeSpec("fused+stalesync:1:2000", ModeGrammar::kSimulate);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(std::string(m.status().message()),
            "--modes: 'fused+stalesync:1:2000': expected "
            "fused+stalesync[:s[:k]] (policy lag s, clock skew k, each in "
            "0..1024; k = s when omitted)");
}

TEST(ModeSpecTest, ApplySetsOnlyTheNamedKnobs) {
  JobConfig c;
  c.placement.cards_per_super_node = 3;
  c.stalesync.max_clock_skew = 5;
  c.stalesync.rollout_version = RolloutVersion::kNewest;
  absl::StatusOr<ModeSpec> m =
      ParseModeSpec("disaggregated:1+partial:8", ModeGrammar::kBench);
  ASSERT_TRUE(m.ok()) << m.status();
  ApplyModeSpec(*m, c);
  EXPECT_EQ(c.placement.mode, PlacementMode::kDisaggregated);
  EXPECT_EQ(c.placement.rollout_cards_per_super_node, 3);
  EXPECT_EQ(c.placement.cards_per_super_node, 6);
  EXPECT_EQ(c.stalesync.max_policy_lag, 1);
  EXPECT_TRUE(c.algorithm.decoupled_loss);
  EXPECT_EQ(c.stalesync.partial_rollout_tokens, 8);
  EXPECT_EQ(c.stalesync.max_clock_skew, 5);  // not a bench knob
  EXPECT_EQ(c.stalesync.rollout_version, RolloutVersion::kNewest);

  JobConfig s;
  s.stalesync.steps_per_version = 4;
  m = ParseModeSpec("fused+stalesync:2:1", ModeGrammar::kSimulate);
  ASSERT_TRUE(m.ok()) << m.status();
  ApplyModeSpec(*m, s);
  EXPECT_EQ(s.placement.mode, PlacementMode::kFused);
  EXPECT_EQ(s.stalesync.max_policy_lag, 2);
  EXPECT_EQ(s.stalesync.max_clock_skew, 1);
  EXPECT_EQ(s.stalesync.steps_per_version, 4);  // not a simulator knob
}

}  // namespace
}  // namespace fusionrl
