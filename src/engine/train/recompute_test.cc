// Selective recompute / swap (model.activations): gradients equal to keeping
// everything, and activation memory measured by MeasureTrainStep.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/swiglu.h"
#include "engine/model/test_util.h"
#include "engine/rollout/sample.h"
#include "engine/train/activation_memory.h"
#include "engine/train/activation_planner.h"
#include "engine/train/memory_accounting.h"
#include "engine/train/trainer.h"

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
  a.policy = ParseActivationPolicy(policy).value();
  return a;
}

ActivationConfig Mixed() {
  ActivationConfig a;
  a.policy = ActivationPolicy::kKeep;
  a.attention = SubBlockActivation::kRecompute;
  a.mlp = SubBlockActivation::kSwap;
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

// How far a recomputed RMSNorm's float32 rounding moves a gradient (see
// EveryPolicyGivesTheGradientsOfKeep): measured at most 9.7e-8 absolute in
// these tests (the planner's plans; 0 with every sub-block recomputed);
// the bound is about twice that.
constexpr double kRecomputedNormGradTol = 2e-7;
// The SwiGLU node (mlp_act) sums its gradients in another order than
// autograd's composite graph: the bound for a finer recompute unit.
constexpr double kRecomputedActGradTol = 1e-6;

// Gradients of every parameter: bit-identical when `exact`, else within
// kRecomputedNormGradTol absolute.
void ExpectSameGrads(const StepResult& a, const StepResult& b,
                     bool exact = true) {
  ASSERT_EQ(a.grads.size(), b.grads.size());
  double max_diff = 0;
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_TRUE(a.grads[i].defined()) << i;
    ASSERT_TRUE(b.grads[i].defined()) << i;
    const double diff = (a.grads[i] - b.grads[i]).abs().max().item<double>();
    if (exact) {
      EXPECT_TRUE(at::equal(a.grads[i], b.grads[i]))
          << "parameter " << i << " max diff " << diff;
    } else {
      EXPECT_LE(diff, kRecomputedNormGradTol) << "parameter " << i;
      max_diff = std::max(max_diff, diff);
    }
  }
  if (!exact) std::printf("recomputed norms: max grad diff %.3g\n", max_diff);
}

ActivationConfig RecomputeAttentionAndMlp() {
  ActivationConfig a = All("recompute");
  a.norm = SubBlockActivation::kKeep;
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
// (measured today: 0 here, where every sub-block of the layer is
// recomputed as one node; 9.7e-8 absolute for the planner's plans, which
// recompute norms next to kept sub-blocks). Those policies are checked
// within kRecomputedNormGradTol.
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
    SCOPED_TRACE(std::string(ActivationPolicyName(c.act.policy)) + " norm=" +
                 SubBlockActivationName(c.act.norm) + " " + c.act.layers);
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

// The finer unit: the attention core (scores, mask, softmax, weighted sum)
// recomputed from kept q, k, v. Gradients within 1e-6 of keep (the issue's
// bound; the core's backward sums the q/k/v gradients in another order
// only where GQA repeats k and v), and it holds less than keep and more
// than recomputing the whole attention sub-block (which keeps only its
// input). Dense, MoE, and grouped-query heads.
TEST(RecomputeCoreTest, AttentionCoreRecomputeKeepsGradientsAndSavesMemory) {
  for (int kv_heads : {0, 2}) {
    for (bool moe : {false, true}) {
      SCOPED_TRACE(std::string(moe ? "moe" : "dense") + " kv_heads " +
                   std::to_string(kv_heads));
      auto make = [&](const ActivationConfig& act) {
        ModelConfig c = Config(moe);
        c.n_kv_heads = kv_heads;
        c.activations = act;
        return PolicyModel::Create(c, kVocab, c10::Device("cpu"), 11).value();
      };
      ActivationConfig core;
      core.attention_core = SubBlockActivation::kRecompute;
      ActivationConfig whole;
      whole.attention = SubBlockActivation::kRecompute;
      const CollatedBatch batch = Batch(3);
      auto keep_model = make(All("keep"));
      auto core_model = make(core);
      auto whole_model = make(whole);
      const StepResult keep = Train(*keep_model, {batch});
      const StepResult got = Train(*core_model, {batch});
      const StepResult attn = Train(*whole_model, {batch});
      EXPECT_NEAR(got.report.loss, keep.report.loss, 1e-7);
      ASSERT_EQ(got.grads.size(), keep.grads.size());
      for (size_t i = 0; i < got.grads.size(); ++i) {
        EXPECT_LE((got.grads[i] - keep.grads[i]).abs().max().item<double>(),
                  1e-6)
            << "parameter " << i;
      }
      EXPECT_LT(got.report.held_bytes, keep.report.held_bytes);
      EXPECT_GT(got.report.held_bytes, attn.report.held_bytes);
      std::printf("%s kv_heads %d: held keep %lld, core %lld, attention %lld\n",
                  moe ? "moe" : "dense", kv_heads,
                  static_cast<long long>(keep.report.held_bytes),
                  static_cast<long long>(got.report.held_bytes),
                  static_cast<long long>(attn.report.held_bytes));
    }
  }
}

// The SwiGLU node against autograd's composite graph, in float64: gathered
// rows (one token twice, one never), a gate, and the dense form on a 3-D
// input without either.
TEST(SwiGLURecomputedActTest, OutputAndGradientsEqualTheCompositeGraph) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const int64_t m = 7, d = 6, f = 10;
  auto param = [&](std::vector<int64_t> shape) {
    return at::randn(shape, gen, f64).requires_grad_(true);
  };
  const at::Tensor x = param({m, d}), w1 = param({f, d}), w3 = param({f, d}),
                   w2 = param({d, f});
  const at::Tensor rows = at::tensor({4, 0, 2, 4, 6}, at::kLong);
  const at::Tensor gate = at::rand({5, 1}, gen, f64).requires_grad_(true);
  const at::Tensor dy = at::randn({5, d}, gen, f64);
  auto grads = [&](const at::Tensor& y, std::vector<at::Tensor> wrt) {
    return torch::autograd::grad({y}, wrt, {dy});
  };
  auto composite = [&](const at::Tensor& xs) {
    return at::mm(at::silu(at::mm(xs, w1.t())) * at::mm(xs, w3.t()), w2.t());
  };
  const at::Tensor want = composite(x.index_select(0, rows)) * gate;
  const at::Tensor got = SwiGLURecomputedAct(x, rows, gate, w1, w3, w2);
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-12);
  const auto gw = grads(want, {x, gate, w1, w3, w2});
  const auto gg = grads(got, {x, gate, w1, w3, w2});
  const char* names[] = {"x", "gate", "w1", "w3", "w2"};
  for (size_t i = 0; i < gw.size(); ++i) {
    EXPECT_LE((gg[i] - gw[i]).abs().max().item<double>(), 1e-12) << names[i];
    EXPECT_GT(gw[i].abs().max().item<double>(), 1e-3) << names[i];
  }
  EXPECT_EQ(gg[0][5].abs().max().item<double>(), 0);  // row 5 not gathered

  // Float32 on a CPU runs the backward's fused elementwise pass (8-float
  // lanes, then a tail: F = 10): the same gradients as the float64 graph,
  // to float32 rounding.
  auto f32 = [](const at::Tensor& t) {
    return t.detach().to(at::kFloat).requires_grad_(t.requires_grad());
  };
  const at::Tensor xf = f32(x), w1f = f32(w1), w3f = f32(w3), w2f = f32(w2),
                   gatef = f32(gate);
  const at::Tensor gotf = SwiGLURecomputedAct(xf, rows, gatef, w1f, w3f, w2f);
  const auto gf = torch::autograd::grad({gotf}, {xf, gatef, w1f, w3f, w2f},
                                        {dy.to(at::kFloat)});
  for (size_t i = 0; i < gw.size(); ++i) {
    const double scale = gw[i].abs().max().item<double>();
    EXPECT_LE((gf[i].to(at::kDouble) - gw[i]).abs().max().item<double>(),
              1e-5 * scale)
        << "float32 " << names[i];
  }

  const at::Tensor x3 = param({2, 3, d});
  const at::Tensor dy3 = at::randn({2, 3, d}, gen, f64);
  const at::Tensor want3 = composite(x3.reshape({-1, d})).view({2, 3, d});
  const at::Tensor got3 =
      SwiGLURecomputedAct(x3, at::Tensor(), at::Tensor(), w1, w3, w2);
  ASSERT_EQ(got3.sizes(), want3.sizes());
  EXPECT_LE((got3 - want3).abs().max().item<double>(), 1e-12);
  const auto w3grads = torch::autograd::grad({want3}, {x3, w1, w3, w2}, {dy3});
  const auto g3grads = torch::autograd::grad({got3}, {x3, w1, w3, w2}, {dy3});
  for (size_t i = 0; i < w3grads.size(); ++i) {
    EXPECT_LE((g3grads[i] - w3grads[i]).abs().max().item<double>(), 1e-12)
        << "dense " << i;
  }
}

// mlp_act in a policy: the gradients of keep within 1e-6 (float32 rounding:
// the node sums its gradients in another order), less held than keep and
// more than a recomputed mlp sub-block.
TEST(RecomputeMlpActTest, MlpActRecomputeKeepsGradientsAndSavesMemory) {
  for (bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "moe" : "dense");
    ActivationConfig act;
    act.mlp_act = SubBlockActivation::kRecompute;
    ActivationConfig whole;
    whole.mlp = SubBlockActivation::kRecompute;
    const CollatedBatch batch = Batch(3);
    auto keep_model = Model(moe, All("keep"));
    auto act_model = Model(moe, act);
    auto mlp_model = Model(moe, whole);
    const StepResult keep = Train(*keep_model, {batch});
    const StepResult got = Train(*act_model, {batch});
    const StepResult mlp = Train(*mlp_model, {batch});
    EXPECT_NEAR(got.report.loss, keep.report.loss, 1e-6);
    ASSERT_EQ(got.grads.size(), keep.grads.size());
    double max_diff = 0;
    for (size_t i = 0; i < got.grads.size(); ++i) {
      const double diff =
          (got.grads[i] - keep.grads[i]).abs().max().item<double>();
      EXPECT_LE(diff, 1e-6) << "parameter " << i;
      max_diff = std::max(max_diff, diff);
    }
    EXPECT_LT(got.report.held_bytes, keep.report.held_bytes);
    EXPECT_GT(got.report.held_bytes, mlp.report.held_bytes);
    std::printf(
        "%s: held keep %lld, mlp_act %lld, mlp %lld; max grad diff %.3g\n",
        moe ? "moe" : "dense", static_cast<long long>(keep.report.held_bytes),
        static_cast<long long>(got.report.held_bytes),
        static_cast<long long>(mlp.report.held_bytes), max_diff);
  }
}

TEST(RecomputeCoreTest, PlanResolvesAttentionCore) {
  ActivationConfig a;
  a.policy = ActivationPolicy::kRecompute;
  a.attention_core = SubBlockActivation::kRecompute;
  a.layers = "1: attention=keep; 2: attention_core=keep";
  auto plan = ResolveActivationPlan(a, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ((*plan)[0].attention_core, ActivationAction::kRecompute);
  EXPECT_EQ((*plan)[1].attention, ActivationAction::kKeep);
  EXPECT_EQ((*plan)[1].attention_core, ActivationAction::kRecompute);
  EXPECT_EQ((*plan)[2].attention_core, ActivationAction::kKeep);
  ActivationConfig policy_only;
  policy_only.policy =
      ActivationPolicy::kRecompute;  // the policy does not set the core
  EXPECT_EQ(ResolveActivationPlan(policy_only, 1).value()[0].attention_core,
            ActivationAction::kKeep);
  ActivationConfig swap;
  swap.attention_core = SubBlockActivation::kSwap;
  EXPECT_NE(ResolveActivationPlan(swap, 1).status().message().find(
                "keep or recompute"),
            std::string::npos);
  ActivationConfig layer_swap;
  layer_swap.layers = "0: attention_core=swap";
  EXPECT_FALSE(ResolveActivationPlan(layer_swap, 1).ok());
  ActivationConfig act;
  act.mlp_act = SubBlockActivation::kRecompute;
  act.layers = "1: mlp_act=keep";
  auto act_plan = ResolveActivationPlan(act, 2);
  ASSERT_TRUE(act_plan.ok()) << act_plan.status();
  EXPECT_EQ((*act_plan)[0].mlp_act, ActivationAction::kRecompute);
  EXPECT_EQ((*act_plan)[1].mlp_act, ActivationAction::kKeep);
  EXPECT_EQ(ResolveActivationPlan(policy_only, 1).value()[0].mlp_act,
            ActivationAction::kKeep);
  ActivationConfig act_swap;
  act_swap.layers = "0: mlp_act=swap";
  EXPECT_FALSE(ResolveActivationPlan(act_swap, 1).ok());
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
  // The held figure measured independently: this test's own allocation
  // counter, read at the end of the loss (inside MeasureTrainStep's forward),
  // less the logits [B, T, V] floats that MeasureTrainStep frees right after
  // it. On a CPU the pool's copies come from the same allocator, so the
  // counter sees them: held includes them.
  {
    auto again = Model(false, All("swap"));
    int64_t at_loss = -1;
    int64_t pool_at_loss = -1;
    ScopedAllocationCounter counter;
    auto r = MeasureTrainStep(
        *again, batch,
        [&](PolicyModel& m, const CollatedBatch& b, const at::Tensor& logits) {
          at::Tensor loss = DefaultStepLoss(m, b, logits);
          at_loss = counter.current_bytes();
          pool_at_loss = m.activation_host_pool().current_bytes();
          return loss;
        });
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->held_bytes, at_loss - kBatch * kLen * kVocab * 4);
    EXPECT_EQ(r->host_pool_bytes, pool_at_loss);
    EXPECT_EQ(r->held_bytes, swap.report.held_bytes);  // allocator counts
  }
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

// The pool's byte count by hand, on a graph whose saved tensors are known:
// sin and cos each save their input x (the same tensor: one copy), their
// product saves both factors, and p * p saves p, which is excluded (as the
// model's parameters are) and saved as is. Three [3, 5] float copies = 180
// bytes, all given back when backward frees the graph; the gradients are
// those of plain saving, bit for bit.
TEST(ActivationMemoryTest, SwapScopeCopiesEachSavedTensorOnceIntoThePool) {
  const at::Tensor x0 = at::randn({3, 5});
  const at::Tensor p0 = at::randn({5});
  auto run = [&](bool swap, std::shared_ptr<ActivationHostPool> pool,
                 int64_t* pool_at_end_of_forward) {
    const at::Tensor x = x0.clone().requires_grad_();
    const at::Tensor p = p0.clone().requires_grad_();
    const std::unordered_set<const void*> exclude = {
        p.storage().unsafeGetStorageImpl()};
    at::Tensor loss;
    {
      std::unique_ptr<SwapScope> scope;
      if (swap) scope = std::make_unique<SwapScope>(pool, &exclude);
      loss = (x.sin() * x.cos()).sum() + (p * p).sum();
    }
    if (pool_at_end_of_forward != nullptr) {
      *pool_at_end_of_forward = pool->current_bytes();
    }
    loss.backward();
    return std::make_pair(x.grad(), p.grad());
  };
  auto pool = std::make_shared<ActivationHostPool>();
  int64_t held = -1;
  const auto swapped = run(true, pool, &held);
  const auto plain =
      run(false, std::make_shared<ActivationHostPool>(), nullptr);
  // x (once), sin(x) and cos(x): 3 x 15 floats; p * p saves only p.
  EXPECT_EQ(held, 3 * 15 * 4);
  EXPECT_EQ(pool->current_bytes(), 0);
  EXPECT_TRUE(at::equal(swapped.first, plain.first));
  EXPECT_TRUE(at::equal(swapped.second, plain.second));
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
  // MoE: bit for bit. Dense: keep's last layer computes only the response
  // window (PolicyModel::ForwardHidden), a plan that recomputes or swaps it
  // computes every position, and the GEMMs over fewer rows round
  // differently (ModelTest.HiddenFromAPositionEqualsTheNarrowedFullForward).
  for (size_t i = 0; i < grads[0].size(); ++i) {
    if (moe) {
      EXPECT_TRUE(at::equal(grads[0][i], grads[1][i])) << "parameter " << i;
    } else {
      const double scale = grads[0][i].abs().max().item<double>();
      EXPECT_LE((grads[0][i] - grads[1][i]).abs().max().item<double>(),
                1e-6 * std::max(1.0, scale))
          << "parameter " << i;
    }
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

// Consecutive recomputed steps run as one node keeping only what the run
// reads from before it: with every sub-block recomputed a layer holds just
// its input, B x T x D floats (so each extra layer adds exactly that).
TEST(ActivationPlanTest, WholeLayerRecomputeHoldsOnlyTheLayerInput) {
  const CollatedBatch b = Batch(5);
  int64_t held[2];
  for (int i = 0; i < 2; ++i) {
    ModelConfig c = Config(false);
    c.n_layers = 2 + 2 * i;
    c.activations = All("recompute");
    auto m = PolicyModel::Create(c, kVocab, c10::Device("cpu"), 11);
    ASSERT_TRUE(m.ok()) << m.status();
    auto r = MeasureTrainStep(**m, b, nullptr, /*run_backward=*/false);
    ASSERT_TRUE(r.ok()) << r.status();
    held[i] = r->held_bytes;
  }
  const int64_t d = Config(false).d_model;
  EXPECT_EQ(held[1] - held[0], 2 * kBatch * kLen * d * 4);
}

TEST(ActivationPlanTest, AutoResolvesToKeepUntilPlanned) {
  ActivationConfig a = All("auto");
  a.budget_mib = 64;
  auto model = Model(true, a);
  for (const auto& layer : model->activation_plan()) {
    EXPECT_EQ(layer.attention, ActivationAction::kKeep);
    EXPECT_EQ(layer.mlp, ActivationAction::kKeep);
    EXPECT_EQ(layer.norm, ActivationAction::kKeep);
  }
}

// The planner's plan fits the budget, is minimal (putting any chosen
// sub-block back to keep breaks the budget), never swaps on a CPU, and
// gives keep's gradients; the model's .grad is untouched by planning.
TEST(ActivationPlannerTest, PlanFitsIsMinimalAndKeepsGradients) {
  for (bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "moe" : "dense");
    const CollatedBatch b = Batch(7);
    auto keep_model = Model(moe, All("keep"));
    const StepResult keep = Train(*keep_model, {b});
    auto model = Model(moe, All("keep"));
    PlannerOptions opts;
    opts.budget_bytes = keep.report.held_bytes / 2;
    opts.repeats = 1;
    auto report = PlanActivations(*model, b, opts);
    ASSERT_TRUE(report.ok()) << report.status();
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
    EXPECT_EQ(report->keep_held_bytes, keep.report.held_bytes);
    EXPECT_LE(report->planned_held_bytes, opts.budget_bytes);
    EXPECT_GT(report->estimated_step_time_ratio, 1.0);
    ASSERT_EQ(report->sub_blocks.size(), 5u * model->activation_plan().size());
    const std::vector<LayerActivationPlan> plan = model->activation_plan();
    int chosen = 0;
    for (const SubBlockProfile& sb : report->sub_blocks) {
      EXPECT_FALSE(sb.swap_candidate);
      EXPECT_NE(sb.chosen, ActivationAction::kSwap);
      EXPECT_GT(sb.forward_seconds, 0);
      if (sb.chosen == ActivationAction::kKeep) continue;
      ++chosen;
      std::vector<LayerActivationPlan> less = plan;
      ActivationAction LayerActivationPlan::*member =
          sb.sub_block == "attention" ? &LayerActivationPlan::attention
          : sb.sub_block == "mlp"     ? &LayerActivationPlan::mlp
          : sb.sub_block == "norm"    ? &LayerActivationPlan::norm
          : sb.sub_block == "attention_core"
              ? &LayerActivationPlan::attention_core
              : &LayerActivationPlan::mlp_act;
      EXPECT_EQ(less[sb.layer].*member, sb.chosen);
      less[sb.layer].*member = ActivationAction::kKeep;
      ASSERT_TRUE(model->SetActivationPlan(less).ok());
      auto r = MeasureTrainStep(*model, b, nullptr, /*run_backward=*/false);
      ASSERT_TRUE(r.ok());
      EXPECT_GT(r->held_bytes, opts.budget_bytes)
          << sb.layer << " " << sb.sub_block << " is not needed";
    }
    EXPECT_GT(chosen, 0);
    ASSERT_TRUE(model->SetActivationPlan(plan).ok());
    const StepResult planned = Train(*model, {b});
    EXPECT_EQ(planned.report.held_bytes, report->planned_held_bytes);
    // Bit-identical to keep (swap and recompute re-run or hand back the same
    // values) unless a norm is recomputed: then float32 rounding of its
    // input gradient, bounded as in EveryPolicyGivesTheGradientsOfKeep.
    bool recomputes_norm = false, recomputes_act = false;
    for (const LayerActivationPlan& l : plan) {
      recomputes_norm =
          recomputes_norm || l.norm == ActivationAction::kRecompute;
      recomputes_act =
          recomputes_act || l.mlp_act == ActivationAction::kRecompute;
    }
    double max_diff = 0;
    for (size_t i = 0; i < keep.grads.size(); ++i) {
      const double d =
          (planned.grads[i] - keep.grads[i]).abs().max().item<double>();
      max_diff = std::max(max_diff, d);
      if (!recomputes_norm && !recomputes_act) {
        EXPECT_TRUE(at::equal(planned.grads[i], keep.grads[i]))
            << "parameter " << i << " max diff " << d;
      }
    }
    std::printf(
        "planned vs keep: max grad diff %.3g (norm recomputed: %d, mlp_act "
        "recomputed: %d)\n",
        max_diff, recomputes_norm ? 1 : 0, recomputes_act ? 1 : 0);
    EXPECT_LE(max_diff,
              recomputes_act ? kRecomputedActGradTol : kRecomputedNormGradTol);
    // The plan round-trips through model.activations.layers.
    ActivationConfig again = All("keep");
    again.layers = FormatActivationPlan(plan);
    auto resolved = ResolveActivationPlan(again, plan.size());
    ASSERT_TRUE(resolved.ok()) << resolved.status();
    for (size_t l = 0; l < plan.size(); ++l) {
      EXPECT_EQ((*resolved)[l].attention, plan[l].attention);
      EXPECT_EQ((*resolved)[l].mlp, plan[l].mlp);
      EXPECT_EQ((*resolved)[l].norm, plan[l].norm);
      EXPECT_EQ((*resolved)[l].attention_core, plan[l].attention_core);
      EXPECT_EQ((*resolved)[l].mlp_act, plan[l].mlp_act);
    }
  }
}

TEST(ActivationPlannerTest, UnreachableBudgetFailsAndLeavesKeep) {
  auto model = Model(true, All("keep"));
  PlannerOptions opts;
  opts.budget_bytes = 1024;  // less than the logits alone
  opts.repeats = 1;
  auto report = PlanActivations(*model, Batch(3), opts);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(report.status().message().find("cannot be met"), std::string::npos)
      << report.status();
  for (const auto& layer : model->activation_plan()) {
    EXPECT_EQ(layer.mlp, ActivationAction::kKeep);
  }
  opts.budget_bytes = 0;
  EXPECT_EQ(PlanActivations(*model, Batch(3), opts).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// policy auto in a job: Trainer::Create plans for micro_batch_size x
// max_seq_len and installs the plan; an impossible budget fails Create.
TEST(ActivationPlannerTest, TrainerPlansAutoPolicyAtCreate) {
  JobConfig config;
  config.model = Config(true);
  config.model.activations = All("auto");
  config.model.activations.budget_mib = 0.5;
  config.optim.micro_batch_size = 2;
  auto m = PolicyModel::Create(config.model, kVocab, c10::Device("cpu"), 1);
  ASSERT_TRUE(m.ok()) << m.status();
  auto trainer = Trainer::Create(**m, nullptr, config, /*pad_id=*/0, nullptr);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  bool any = false;
  for (const auto& layer : (*m)->activation_plan()) {
    any = any || layer.attention != ActivationAction::kKeep ||
          layer.mlp != ActivationAction::kKeep ||
          layer.norm != ActivationAction::kKeep ||
          layer.attention_core != ActivationAction::kKeep ||
          layer.mlp_act != ActivationAction::kKeep;
  }
  EXPECT_TRUE(any);
  config.model.activations.budget_mib = 0.001;
  auto m2 = PolicyModel::Create(config.model, kVocab, c10::Device("cpu"), 1);
  ASSERT_TRUE(m2.ok());
  auto refused = Trainer::Create(**m2, nullptr, config, 0, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("model.activations (policy auto)"),
            std::string::npos)
      << refused.status();
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
