// The RL job end to end in-process with LoRA: exact resume in every
// placement, and weight syncs that move the adapters only.
#include <algorithm>
#include <filesystem>
#include <string>

#include "engine/model/model.h"
#include "fusionrl/job.h"
#include "gtest/gtest.h"
#include "local/rl_job_test_util.h"

namespace fusionrl {
namespace {

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

}  // namespace
}  // namespace fusionrl
