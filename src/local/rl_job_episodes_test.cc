// The RL job end to end in-process with multi-turn episodes: exact resume
// in every placement, and router replay over tool-using episodes.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fusionrl/environment.h"
#include "fusionrl/job.h"
#include "gtest/gtest.h"
#include "local/rl_job_test_util.h"

namespace fusionrl {
namespace {

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

}  // namespace
}  // namespace fusionrl
