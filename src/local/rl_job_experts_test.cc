// The RL job end to end in-process with a MoE policy: grouped routing and
// router replay, expert parallelism (cards holding shards of the experts)
// and cards sampling from their shards in lockstep.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fusionrl/environment.h"
#include "fusionrl/job.h"
#include "fusionrl/task.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "local/rl_job_test_util.h"

namespace fusionrl {
namespace {

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

}  // namespace
}  // namespace fusionrl
