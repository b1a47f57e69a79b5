// Selective recompute / swap (model.activations): gradients equal to keeping
// everything, and activation memory measured by MeasureTrainStep.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/activation_memory.h"
#include "engine/model.h"
#include "engine/sample.h"
#include "engine/test_util.h"
#include "engine/trainer.h"

namespace fusionrl {
namespace {

constexpr int kVocab = 50;
constexpr int64_t kBatch = 3;
constexpr int64_t kLen = 12;

ModelConfig Config(bool moe) {
  ModelConfig c = testing_util::TinyModelConfig();
  if (moe) {
    c.moe_experts = 4;
    c.moe_top_k = 2;
    c.moe_shared_expert = true;
    c.moe_capacity_factor = 1.0;  // some assignments are dropped
    c.moe_aux_loss_coef = 0.5;    // large, so the aux gradient matters
    c.moe_z_loss_coef = 0.1;
  }
  return c;
}

std::unique_ptr<PolicyModel> Model(bool moe, const ActivationConfig& act) {
  ModelConfig c = Config(moe);
  c.activations = act;
  auto m = PolicyModel::Create(c, kVocab, c10::Device("cpu"), /*seed=*/11);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

ActivationConfig All(const std::string& policy) {
  ActivationConfig a;
  a.policy = policy;
  return a;
}

ActivationConfig Mixed() {
  ActivationConfig a;
  a.policy = "keep";
  a.attention = "recompute";
  a.mlp = "swap";
  a.layers = "1: attention=keep, mlp=recompute, norm=swap";
  return a;
}

// A left-padded batch (row 1 has 3 padding tokens, row 2 one).
CollatedBatch Batch(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  CollatedBatch b;
  b.input_ids = at::randint(1, kVocab, {kBatch, kLen}, gen, at::kLong);
  b.valid = at::ones({kBatch, kLen}, at::kBool);
  b.valid.index_put_({1, at::indexing::Slice(0, 3)}, false);
  b.valid.index_put_({2, 0}, false);
  b.input_ids.masked_fill_(b.valid.logical_not(), 0);
  b.positions = PositionsFromValid(b.valid);
  return b;
}

struct StepResult {
  ActivationReport report;
  std::vector<at::Tensor> grads;
};

StepResult Train(PolicyModel& model, const std::vector<CollatedBatch>& mbs) {
  StepResult r;
  for (const auto& mb : mbs) {
    auto report = MeasureTrainStep(model, mb);
    EXPECT_TRUE(report.ok()) << report.status();
    r.report = *report;
  }
  for (const auto& p : model.parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

// Gradients of every parameter: bit-identical when `exact`, else within
// 1e-6 absolute (float32 rounding; see EveryPolicyGivesTheGradientsOfKeep).
void ExpectSameGrads(const StepResult& a, const StepResult& b,
                     bool exact = true) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_TRUE(a.grads[i].defined()) << i;
    ASSERT_TRUE(b.grads[i].defined()) << i;
    const double diff = (a.grads[i] - b.grads[i]).abs().max().item<double>();
    if (exact) {
      EXPECT_TRUE(at::equal(a.grads[i], b.grads[i]))
          << "parameter " << i << " max diff " << diff;
    } else {
      EXPECT_LE(diff, 1e-6) << "parameter " << i;
    }
  }
}

ActivationConfig RecomputeAttentionAndMlp() {
  ActivationConfig a = All("recompute");
  a.norm = "keep";
  return a;
}

class RecomputeTest : public ::testing::TestWithParam<bool> {};

// Recompute re-runs the same kernels on the same inputs (no randomness in
// the model) and swap hands backward bit-identical copies, so the
// gradients are bit-identical to keep's, with one measured exception: a
// recomputed RMSNorm. Its input's gradient is the sum of three terms (the
// residual path and two uses inside the norm); keep adds them in the
// engine's order, recompute adds the two inner ones first (inside the
// recompute node) and then the residual one, so float32 rounding differs
// (measured: at most 1.7e-7 absolute here). Those policies are checked
// within 1e-6.
TEST_P(RecomputeTest, EveryPolicyGivesTheGradientsOfKeep) {
  const bool moe = GetParam();
  const CollatedBatch batch = Batch(1);
  auto keep_model = Model(moe, All("keep"));
  const StepResult keep = Train(*keep_model, {batch});
  struct Case {
    ActivationConfig act;
    bool exact;
  };
  for (const Case& c :
       {Case{All("recompute"), false}, Case{RecomputeAttentionAndMlp(), true},
        Case{All("swap"), true}, Case{Mixed(), true}}) {
    SCOPED_TRACE(c.act.policy + " norm=" + c.act.norm + " " + c.act.layers);
    auto model = Model(moe, c.act);
    const StepResult got = Train(*model, {batch});
    if (c.exact) {
      EXPECT_EQ(got.report.loss, keep.report.loss);
    } else {
      EXPECT_NEAR(got.report.loss, keep.report.loss, 1e-6);
    }
    ExpectSameGrads(got, keep, c.exact);
    if (moe) {
      EXPECT_EQ(model->moe_stats().aux_loss, keep_model->moe_stats().aux_loss);
    }
  }
}

// Under recompute the MoE block's first forward runs without autograd; the
// aux/z losses it reports must still carry their gradient (they are outputs
// of the recompute node): back-propagating AuxLoss() alone gives keep's
// gradients, bit for bit (norms kept: see above), and they are not all zero.
TEST(RecomputeMoeTest, AuxLossAloneHasTheGradientsOfKeep) {
  const CollatedBatch batch = Batch(2);
  std::vector<std::vector<at::Tensor>> grads;
  for (const ActivationConfig& act :
       {All("keep"), RecomputeAttentionAndMlp()}) {
    auto model = Model(true, act);
    model->set_training(true);
    model->Forward(batch.input_ids, batch.positions, batch.valid);
    const at::Tensor aux = model->AuxLoss();
    ASSERT_TRUE(aux.defined());
    ASSERT_TRUE(aux.requires_grad());
    EXPECT_GT(aux.item<double>(), 0);
    aux.backward();
    grads.emplace_back();
    for (const auto& p : model->parameters()) {
      grads.back().push_back(p.grad().defined() ? p.grad().clone()
                                                : at::zeros_like(p));
    }
  }
  double total = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(at::equal(grads[0][i], grads[1][i]))
        << "parameter " << i << " max diff "
        << (grads[0][i] - grads[1][i]).abs().max().item<double>();
    total += grads[1][i].abs().sum().item<double>();
  }
  EXPECT_GT(total, 0);
}

TEST_P(RecomputeTest, GradientAccumulationOverMicroBatchesEqualsKeep) {
  const bool moe = GetParam();
  const std::vector<CollatedBatch> mbs = {Batch(3), Batch(4)};
  auto keep_model = Model(moe, All("keep"));
  const StepResult keep = Train(*keep_model, mbs);
  auto model = Model(moe, RecomputeAttentionAndMlp());
  ExpectSameGrads(Train(*model, mbs), keep);
  auto all = Model(moe, All("recompute"));
  ExpectSameGrads(Train(*all, mbs), keep, /*exact=*/false);
}

// Recompute-all frees, per layer, at least what the sub-blocks held inside:
// the softmax probabilities [B, H, T, T] and (dense) SwiGLU's w1 x and w3 x
// [B, T, d_ff], float32. Recompute keeps only the sub-blocks' inputs, which
// keep also holds (the linears save them).
TEST(ActivationMemoryTest, RecomputeHoldsLessByAtLeastTheDroppedActivations) {
  const CollatedBatch batch = Batch(5);
  auto keep_model = Model(false, All("keep"));
  auto rec_model = Model(false, All("recompute"));
  const StepResult keep = Train(*keep_model, {batch});
  const StepResult rec = Train(*rec_model, {batch});
  const ModelConfig c = Config(false);
  const int64_t dropped_per_layer =
      (kBatch * c.n_heads * kLen * kLen + 2 * kBatch * kLen * c.d_ff) * 4;
  std::printf("held for backward: keep %lld, recompute %lld, bound %lld\n",
              static_cast<long long>(keep.report.held_bytes),
              static_cast<long long>(rec.report.held_bytes),
              static_cast<long long>(c.n_layers * dropped_per_layer));
  EXPECT_GT(keep.report.held_bytes, 0);
  EXPECT_EQ(rec.report.host_pool_bytes, 0);
  EXPECT_GE(keep.report.held_bytes - rec.report.held_bytes,
            c.n_layers * dropped_per_layer)
      << "keep " << keep.report.held_bytes << " recompute "
      << rec.report.held_bytes;
}

// On a CPU device the host pool is the same memory: swap moves what is held
// into the pool but frees nothing.
TEST(ActivationMemoryTest, SwapOnCpuMovesBytesToTheHostPoolButFreesNothing) {
  const CollatedBatch batch = Batch(6);
  auto keep_model = Model(false, All("keep"));
  auto swap_model = Model(false, All("swap"));
  const StepResult keep = Train(*keep_model, {batch});
  const int64_t packed_before = swap_model->activation_host_pool().packed();
  const StepResult swap = Train(*swap_model, {batch});
  std::printf("held for backward: keep %lld; swap device %lld + host %lld\n",
              static_cast<long long>(keep.report.held_bytes),
              static_cast<long long>(swap.report.device_held_bytes),
              static_cast<long long>(swap.report.host_pool_bytes));
  EXPECT_TRUE(SwapEngineInstalled());
  EXPECT_FALSE(SwapFreesDeviceMemory(c10::Device("cpu")));
  EXPECT_GT(swap_model->activation_host_pool().packed(), packed_before);
  EXPECT_GT(swap.report.host_pool_bytes, 0);
  EXPECT_LT(swap.report.device_held_bytes, keep.report.device_held_bytes);
  EXPECT_EQ(swap.report.held_bytes,
            swap.report.device_held_bytes + swap.report.host_pool_bytes);
  // Slack: 1% of keep's figure.
  EXPECT_GE(swap.report.held_bytes,
            keep.report.held_bytes - keep.report.held_bytes / 100)
      << "keep " << keep.report.held_bytes << " swap device "
      << swap.report.device_held_bytes << " host "
      << swap.report.host_pool_bytes;
  // Backward released the graph and with it the pool.
  EXPECT_EQ(swap_model->activation_host_pool().current_bytes(), 0);
  EXPECT_GE(swap.report.host_pool_peak_bytes, swap.report.host_pool_bytes);
}

TEST(ActivationMemoryTest, NoGradForwardIgnoresThePlan) {
  const CollatedBatch batch = Batch(7);
  auto keep_model = Model(true, All("keep"));
  auto model = Model(true, Mixed());
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(
      model->Forward(batch.input_ids, batch.positions, batch.valid),
      keep_model->Forward(batch.input_ids, batch.positions, batch.valid)));
  EXPECT_EQ(model->activation_host_pool().packed(), 0);
}

// The real training path: a Trainer step with micro-batches (MoE: with its
// aux losses added per micro-batch by the trainer) under a mixed plan gives
// keep's gradients bit for bit.
TEST_P(RecomputeTest, TrainerStepWithAMixedPlanGivesTheGradientsOfKeep) {
  const bool moe = GetParam();
  std::vector<Sample> samples;
  for (int g = 0; g < 4; ++g) {
    for (int i = 0; i < 4; ++i) {
      Sample s;
      s.group_id = g;
      s.prompt_ids = {1, 40 + g};
      for (int t = 0; t <= (g + i) % 5; ++t) {
        s.response_ids.push_back(20 + g * 3 + i + t);
      }
      s.response_ids.push_back(2);
      s.behaviour_logp.assign(s.response_ids.size(), -1.0f);
      s.reward = (i + g) % 3 == 0 ? 1.0 : 0.0;
      samples.push_back(s);
    }
  }
  std::vector<std::vector<at::Tensor>> grads;
  for (const ActivationConfig& act : {All("keep"), Mixed()}) {
    JobConfig c;
    c.model = Config(moe);
    c.model.activations = act;
    c.rollout.group_size = 4;
    c.optim.grad_clip = 0;
    c.optim.micro_batch_size = 3;
    auto model = Model(moe, act);
    auto trainer = Trainer::Create(*model, nullptr, c, /*pad_id=*/0);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->Step(samples).ok());
    grads.emplace_back();
    for (const auto& p : model->parameters()) {
      grads.back().push_back(p.grad().clone());
    }
  }
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(at::equal(grads[0][i], grads[1][i])) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(DenseAndMoe, RecomputeTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Moe" : "Dense";
                         });

TEST(ActivationPlanTest, CreateResolvesThePlanPerLayer) {
  auto model = Model(false, Mixed());
  const auto& plan = model->activation_plan();
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].attention, ActivationAction::kRecompute);
  EXPECT_EQ(plan[0].mlp, ActivationAction::kSwap);
  EXPECT_EQ(plan[0].norm, ActivationAction::kKeep);
  EXPECT_EQ(plan[1].attention, ActivationAction::kKeep);
  EXPECT_EQ(plan[1].mlp, ActivationAction::kRecompute);
  EXPECT_EQ(plan[1].norm, ActivationAction::kSwap);
}

TEST(ActivationPlanTest, AutoIsNotImplementedYet) {
  ModelConfig c = Config(false);
  c.activations.policy = "auto";
  c.activations.budget_mib = 64;
  auto m = PolicyModel::Create(c, kVocab, c10::Device("cpu"), 1);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("not implemented"), std::string::npos);
}

TEST(ActivationPlanTest, BadPlansAreRejected) {
  ModelConfig c = Config(false);
  c.activations.layers = "2: mlp=keep";  // n_layers is 2
  auto m = PolicyModel::Create(c, kVocab, c10::Device("cpu"), 1);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  auto model = Model(false, All("keep"));
  EXPECT_EQ(model->SetActivationPlan({LayerActivationPlan{}}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fusionrl
