#include "engine/model/moe.h"

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/collectives/grad_sync.h"
#include "engine/model/expert_parallel.h"
#include "engine/model/model.h"
#include "engine/model/moe_module.h"
#include "engine/model/moe_test_util.h"
#include "engine/model/test_util.h"
#include "engine/rollout/rollout.h"
#include "engine/train/activation_planner.h"
#include "engine/train/checkpoint.h"
#include "engine/train/trainer.h"
#include "engine/train/trainer_batch.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

constexpr int kPad = 0, kBos = 1, kEos = 2;

using moe_testing::MakeMoe;
using moe_testing::RandomTokens;
using moe_testing::Routed;

// Router logits whose softmax is exactly the given probabilities (up to
// float rounding): log p, shifted per row by `shift` (softmax ignores it,
// the z-loss sees it).
at::Tensor LogitsFromProbs(const std::vector<std::vector<double>>& probs,
                           const std::vector<double>& shift) {
  std::vector<at::Tensor> rows;
  for (size_t t = 0; t < probs.size(); ++t) {
    rows.push_back(torch::tensor(probs[t], torch::kDouble).log() + shift[t]);
  }
  return torch::stack(rows).to(torch::kFloat);
}

// Four tokens over three experts:
//   t0 [0.5, 0.3, 0.2]  t1 [0.1, 0.6, 0.3]  t2 [0.2, 0.1, 0.7]
//   t3 [0.4, 0.35, 0.25]
at::Tensor HandLogits() {
  return LogitsFromProbs(
      {{0.5, 0.3, 0.2}, {0.1, 0.6, 0.3}, {0.2, 0.1, 0.7}, {0.4, 0.35, 0.25}},
      {0.5, -1.0, 0.25, 1.5});
}

void ExpectNear(const at::Tensor& actual, const std::vector<double>& expected,
                double tol) {
  const auto a = actual.to(torch::kDouble).reshape({-1}).contiguous();
  ASSERT_EQ(a.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(a[static_cast<int64_t>(i)].item<double>(), expected[i], tol)
        << "element " << i;
  }
}

TEST(MoeRouteTest, TopOnePicksTheMostLikelyExpertAndGatesWithItsProbability) {
  const moe::RouterOutput r = moe::Route(HandLogits(), 1, 0);
  EXPECT_TRUE(torch::equal(r.expert_index,
                           torch::tensor({{0}, {1}, {2}, {0}}, torch::kLong)));
  ExpectNear(r.gates, {0.5, 0.6, 0.7, 0.4}, 1e-6);
  ExpectNear(r.probs,
             {0.5, 0.3, 0.2, 0.1, 0.6, 0.3, 0.2, 0.1, 0.7, 0.4, 0.35, 0.25},
             1e-6);
  EXPECT_TRUE(r.keep.all().item<bool>());
  ExpectNear(r.expert_load, {0.5, 0.25, 0.25}, 0);
  EXPECT_EQ(r.dropped_frac.item<float>(), 0.0f);
}

TEST(MoeRouteTest, TopTwoRenormalisesTheGatesOverTheChosenPair) {
  const moe::RouterOutput r = moe::Route(HandLogits(), 2, 0);
  EXPECT_TRUE(torch::equal(
      r.expert_index,
      torch::tensor({{0, 1}, {1, 2}, {2, 0}, {0, 1}}, torch::kLong)));
  ExpectNear(r.gates,
             {0.5 / 0.8, 0.3 / 0.8, 0.6 / 0.9, 0.3 / 0.9, 0.7 / 0.9, 0.2 / 0.9,
              0.4 / 0.75, 0.35 / 0.75},
             1e-6);
  // Assignments: firsts 0, 1, 2, 0; seconds 1, 2, 0, 1.
  ExpectNear(r.expert_load, {3.0 / 8, 3.0 / 8, 2.0 / 8}, 0);
  EXPECT_TRUE(r.keep.all().item<bool>());
}

// model.moe_gates pins the rule (Hugging Face's norm_topk_prob): top-2
// gates that are the chosen probabilities themselves, and top-1 gates
// renormalised to 1; the routing itself is unchanged.
TEST(MoeRouteTest, GateRuleCanBePinnedEitherWay) {
  moe::RouteOptions o;
  o.top_k = 2;
  o.renormalise = false;
  const moe::RouterOutput raw = moe::Route(HandLogits(), o);
  EXPECT_TRUE(torch::equal(raw.expert_index,
                           moe::Route(HandLogits(), 2, 0).expert_index));
  ExpectNear(raw.gates, {0.5, 0.3, 0.6, 0.3, 0.7, 0.2, 0.4, 0.35}, 1e-6);
  o.top_k = 1;
  o.renormalise = true;
  const moe::RouterOutput one = moe::Route(HandLogits(), o);
  ExpectNear(one.gates, {1, 1, 1, 1}, 1e-6);
  // The module follows its config: a top-2 block whose gates are the raw
  // probabilities outputs less than the renormalised one wherever a
  // token's two probabilities sum below 1 (here: every token).
  torch::manual_seed(3);
  MoeFeedForward renorm(8, 16, 4, 2, 1, 0.0, false);
  MoeFeedForward probs(8, 16, 4, 2, 1, 0.0, false, ExpertShard{}, false);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < renorm->parameters().size(); ++i) {
    probs->parameters()[i].copy_(renorm->parameters()[i]);
  }
  const auto x = torch::randn({1, 5, 8});
  const auto a = renorm(x, MoeRouting{});
  const auto b = probs(x, MoeRouting{});
  const auto p = at::softmax(renorm->router(x.view({5, 8})), -1);
  const auto sum2 = std::get<0>(p.topk(2, -1)).sum(-1);  // [5]
  EXPECT_LT((b.view({5, 8}) - a.view({5, 8}) * sum2.unsqueeze(1))
                .abs()
                .max()
                .item<double>(),
            1e-5);
}

TEST(MoeLossTest, AuxLossIsNTimesAssignmentShareDotMeanProbability) {
  // Mean probabilities P = [1.2, 1.35, 1.45] / 4 = [0.3, 0.3375, 0.3625].
  const at::Tensor logits = HandLogits();
  const moe::RouterOutput top1 = moe::Route(logits, 1, 0);
  // f = [0.5, 0.25, 0.25]: 3 * (0.15 + 0.084375 + 0.090625) = 0.975.
  EXPECT_NEAR(moe::AuxLoss(top1.probs, top1.expert_index).item<double>(), 0.975,
              1e-6);
  const moe::RouterOutput top2 = moe::Route(logits, 2, 0);
  // f = [0.375, 0.375, 0.25]: 3 * (0.1125 + 0.1265625 + 0.090625).
  EXPECT_NEAR(moe::AuxLoss(top2.probs, top2.expert_index).item<double>(),
              0.9890625, 1e-6);
  // Perfect balance gives exactly 1.
  const auto uniform = torch::full({4, 2}, 0.5);
  const auto alternating = torch::tensor({{0}, {1}, {0}, {1}}, torch::kLong);
  EXPECT_NEAR(moe::AuxLoss(uniform, alternating).item<double>(), 1.0, 1e-7);
}

TEST(MoeLossTest, ZLossIsMeanSquaredLogSumExp) {
  // Each row's probabilities sum to 1, so logsumexp = its shift:
  // (0.25 + 1 + 0.0625 + 2.25) / 4.
  EXPECT_NEAR(moe::ZLoss(HandLogits()).item<double>(), 0.890625, 1e-6);
  // [0, 0] -> log 2; [log 3, 0] -> log 4: (1 + 4) / 2 * log(2)^2.
  const auto logits = torch::tensor({{0.0, 0.0}, {std::log(3.0), 0.0}});
  EXPECT_NEAR(moe::ZLoss(logits).item<double>(),
              2.5 * std::log(2.0) * std::log(2.0), 1e-6);
}

TEST(MoeCapacityTest, CapacityIsCeilOfFactorTimesAssignmentsPerExpert) {
  EXPECT_EQ(moe::Capacity(0.0, 100, 2, 4), 0);  // dropless
  EXPECT_EQ(moe::Capacity(1.0, 4, 1, 2), 2);
  EXPECT_EQ(moe::Capacity(1.0, 4, 2, 4), 2);
  EXPECT_EQ(moe::Capacity(1.25, 10, 2, 4), 7);  // ceil(6.25)
  EXPECT_EQ(moe::Capacity(0.01, 3, 1, 8), 1);   // never below one slot
}

TEST(MoeCapacityTest, TopOneKeepsTheFirstTokensUpToCapacity) {
  // Four tokens, all preferring expert 0 (by different margins), C = 2.
  const auto logits =
      torch::tensor({{1.0, 0.0}, {3.0, 0.0}, {0.5, 0.0}, {2.0, 0.0}});
  const moe::RouterOutput r =
      moe::Route(logits, 1, moe::Capacity(1.0, 4, 1, 2));
  EXPECT_TRUE(torch::equal(r.keep.squeeze(1),
                           torch::tensor({true, true, false, false})));
  EXPECT_EQ(r.dropped_frac.item<float>(), 0.5f);
  ExpectNear(r.expert_load, {1.0, 0.0}, 0);
}

TEST(MoeCapacityTest, FirstChoicesOutrankSecondChoices) {
  // N = 4, k = 2, C = ceil(4 * 2 / 4) = 2. Choices (first, second):
  // t0 (0, 1), t1 (0, 1), t2 (1, 0), t3 (0, 2).
  const auto logits = torch::tensor({{3.0, 2.0, 0.0, -1.0},
                                     {3.0, 2.0, 0.0, -1.0},
                                     {2.0, 3.0, 0.0, -1.0},
                                     {3.0, 0.0, 2.0, -1.0}});
  const moe::RouterOutput r =
      moe::Route(logits, 2, moe::Capacity(1.0, 4, 2, 4));
  // Expert 0 takes the first choices of t0 and t1; t3's first choice and
  // t2's second are past capacity. Expert 1 takes t2's first choice before
  // t0's second (first choices rank first), so t1's second is dropped.
  EXPECT_TRUE(torch::equal(
      r.keep,
      torch::tensor(
          {{true, true}, {true, false}, {true, false}, {false, true}})));
  EXPECT_EQ(r.dropped_frac.item<float>(), 0.375f);
  ExpectNear(r.expert_load, {4.0 / 8, 3.0 / 8, 1.0 / 8, 0.0}, 0);
}

TEST(MoeModuleTest, DroppedTokensGetZeroFromTheExpertsButKeepTheShared) {
  for (bool shared : {false, true}) {
    MoeFeedForward m = MakeMoe(2, 1, 1.0, shared);
    torch::NoGradGuard no_grad;
    // Router: logit 0 = x[0] > 0 = logit 1, so every token prefers expert 0.
    m->router->weight.zero_();
    m->router->weight[0][0] = 1.0;
    auto x = RandomTokens({4, 8});
    x.select(1, 0).copy_(torch::tensor({1.0, 2.0, 3.0, 4.0}));
    const auto out = m->forward(x, Routed(at::Tensor(), true));
    EXPECT_EQ(m->last_stats().dropped_frac.item<float>(), 0.5f);
    const auto base = shared ? m->shared->forward(x)
                             : torch::zeros_like(x);  // dropped: t2, t3
    EXPECT_TRUE(torch::equal(out.narrow(0, 2, 2), base.narrow(0, 2, 2)))
        << "shared " << shared;
    // Kept tokens: p_0 * expert0(x) (+ shared).
    const auto p0 = torch::softmax(m->router(x), -1).select(1, 0).unsqueeze(1);
    const auto kept = p0 * m->experts[0]->forward(x) + base;
    EXPECT_TRUE(
        torch::allclose(out.narrow(0, 0, 2), kept.narrow(0, 0, 2), 0, 1e-10));
    // Without capacity nothing is dropped.
    const auto all = m->forward(x, Routed(at::Tensor(), false));
    EXPECT_EQ(m->last_stats().dropped_frac.item<float>(), 0.0f);
    EXPECT_TRUE(torch::allclose(all, kept, 0, 1e-10));
  }
}

// Each token's output computed one token and one choice at a time.
at::Tensor PerTokenReference(MoeFeedForward& m, const at::Tensor& x,
                             const moe::RouteOptions& options) {
  const int top_k = options.top_k;
  const moe::RouterOutput r = moe::Route(m->router(x), options);
  const auto idx = r.expert_index.accessor<int64_t, 2>();
  const auto keep = r.keep.accessor<bool, 2>();
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < x.size(0); ++t) {
    const auto xt = x.narrow(0, t, 1);
    at::Tensor y = torch::zeros_like(xt);
    for (int j = 0; j < top_k; ++j) {
      if (!keep[t][j]) continue;
      y = y + r.gates.narrow(0, t, 1).narrow(1, j, 1) *
                  m->experts[idx[t][j]]->forward(xt);
    }
    if (!m->shared.is_empty()) y = y + m->shared->forward(xt);
    rows.push_back(y);
  }
  return torch::cat(rows);
}

at::Tensor PerTokenReference(MoeFeedForward& m, const at::Tensor& x,
                             int64_t capacity, int top_k) {
  moe::RouteOptions options;
  options.top_k = top_k;
  options.capacity = capacity;
  return PerTokenReference(m, x, options);
}

TEST(MoeModuleTest, BatchedDispatchEqualsPerTokenLoop) {
  for (int top_k : {1, 2}) {
    for (double cf : {0.0, 0.75}) {
      MoeFeedForward m = MakeMoe(4, top_k, cf, /*shared=*/top_k == 2);
      torch::NoGradGuard no_grad;
      const auto x = RandomTokens({24, 8});
      const auto out = m->forward(x, Routed(at::Tensor(), true));
      const int64_t c = moe::Capacity(cf, 24, top_k, 4);
      const auto ref = PerTokenReference(m, x, c, top_k);
      EXPECT_LE((out - ref).abs().max().item<double>(), 1e-10)
          << "k " << top_k << " cf " << cf;
      if (cf > 0) {
        EXPECT_GT(m->last_stats().dropped_frac.item<float>(), 0.0f);
      }
    }
  }
}

TEST(MoeModuleTest, PaddingTokensAreNotRoutedAndGetZero) {
  MoeFeedForward m = MakeMoe(4, 2, 0.0, /*shared=*/true);
  torch::NoGradGuard no_grad;
  const auto x = RandomTokens({2, 3, 8});
  const auto valid = torch::tensor({{false, true, true}, {true, true, false}});
  const auto out = m->forward(x, Routed(valid, false));
  EXPECT_TRUE(torch::equal(out[0][0], torch::zeros({8}, torch::kDouble)));
  EXPECT_TRUE(torch::equal(out[1][2], torch::zeros({8}, torch::kDouble)));
  const auto rows = torch::stack({x[0][1], x[0][2], x[1][0], x[1][1]});
  const auto ref = PerTokenReference(m, rows, 0, 2);
  EXPECT_LE((torch::stack({out[0][1], out[0][2], out[1][0], out[1][1]}) - ref)
                .abs()
                .max()
                .item<double>(),
            1e-10);
  // Statistics count the four routed tokens only: 8 assignments.
  const auto load = m->last_stats().expert_load;
  EXPECT_NEAR(load.sum().item<double>(), 1.0, 1e-6);
  EXPECT_EQ((load * 8).round().sum().item<double>(), 8.0);
}

TEST(MoeModuleTest, GradientsMatchThePerTokenReference) {
  for (double cf : {0.0, 0.75}) {
    MoeFeedForward m = MakeMoe(4, 2, cf, /*shared=*/true);
    const auto x = RandomTokens({16, 8});
    const auto w = RandomTokens({16, 8});
    auto grads = [&](bool batched) {
      m->zero_grad();
      const auto out =
          batched ? m->forward(x, Routed(at::Tensor(), true))
                  : PerTokenReference(m, x, moe::Capacity(cf, 16, 2, 4), 2);
      auto loss = (out * w).sum();
      if (batched) {
        loss = loss + m->last_stats().aux_loss + m->last_stats().z_loss;
      } else {
        const auto logits = m->router(x);
        const auto r = moe::Route(logits, 2, 0);
        loss =
            loss + moe::AuxLoss(r.probs, r.expert_index) + moe::ZLoss(logits);
      }
      loss.backward();
      std::vector<at::Tensor> g;
      for (const auto& p : m->parameters()) {
        g.push_back(p.grad().defined() ? p.grad().clone()
                                       : torch::zeros_like(p));
      }
      return g;
    };
    const auto batched = grads(true);
    const auto reference = grads(false);
    const auto names = m->named_parameters().keys();
    for (size_t i = 0; i < batched.size(); ++i) {
      EXPECT_LE((batched[i] - reference[i]).abs().max().item<double>(), 1e-10)
          << names[i] << " cf " << cf;
    }
    // The router learns from the task loss (through the gates) and the aux
    // losses; every expert got tokens.
    EXPECT_GT(m->router->weight.grad().abs().sum().item<double>(), 0);
    for (const auto& e : m->experts) {
      EXPECT_GT(e->w1->weight.grad().abs().sum().item<double>(), 0);
    }
  }
}

ModelConfig TinyMoeConfig(int top_k, double capacity_factor, bool shared) {
  ModelConfig c = testing_util::TinyModelConfig();
  c.moe_experts = 4;
  c.moe_top_k = top_k;
  c.moe_capacity_factor = capacity_factor;
  c.moe_shared_expert = shared;
  c.moe_d_ff = 32;
  return c;
}

std::unique_ptr<PolicyModel> TinyMoeModel(const ModelConfig& c,
                                          uint64_t seed = 7) {
  return PolicyModel::Create(c, 98, c10::Device("cpu"), seed).value();
}

// `prompts` sampled by the rollout engine (temperature 0.7, 12 new tokens,
// seed 99), with their behaviour log-probs, collated for the trainer.
CollatedBatch SampleAndCollate(PolicyModel& model,
                               const std::vector<std::vector<int>>& prompts) {
  RolloutEngine engine(model, kPad, kEos);
  SamplingParams p;
  p.temperature = 0.7;
  p.max_new_tokens = 12;
  auto out = engine.Generate(prompts, p, 99).value();
  std::vector<Sample> samples(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    samples[i].prompt_ids = prompts[i];
    samples[i].response_ids = out[i].tokens;
    samples[i].behaviour_logp = out[i].logp;
  }
  return Collate(samples, kPad, c10::Device("cpu"));
}

// The sampler's behaviour log-probs (KV-cached, one token per call) equal
// the trainer's recomputation (one full forward, training mode, autograd on)
// for the same weights: routing sees the same hidden state per token.
TEST(MoeModelTest, RolloutLogProbsMatchTrainerRecomputation) {
  for (int top_k : {1, 2}) {
    auto model = TinyMoeModel(TinyMoeConfig(top_k, 0.0, top_k == 2));
    const CollatedBatch batch =
        SampleAndCollate(*model, {{kBos, 20, 21, 22},
                                  {kBos, 40},
                                  {kBos, 50, 51},
                                  {kBos, 60, 61, 62, 63}});
    model->set_training(true);
    const auto logp = ResponseLogProbs(*model, batch, 0.7, nullptr);
    ASSERT_TRUE(logp.requires_grad());
    const double diff =
        ((logp.detach() - batch.behaviour_logp) * batch.response_mask)
            .abs()
            .max()
            .item<double>();
    EXPECT_LT(diff, 1e-5) << "top_k " << top_k;
    EXPECT_EQ(model->moe_stats().dropped_frac, 0.0);
  }
}

// With a capacity factor that drops assignments the two disagree: the
// sampler is dropless, the trainer's training forward drops what overflows
// an expert's capacity over the whole micro-batch (a batch composition the
// sampler never sees), and a dropped assignment changes its token's output
// and, through attention, every later token of the sequence. Measured at
// capacity factor 1.25 (top-2, four experts, a shared expert: the
// benchmark's MoE shape), 8 prompts x up to 12 tokens: 1.16% of the
// assignments dropped; |trainer - rollout| log-prob max 0.55, mean 0.0097
// over the 84 response tokens, 4.8% of them changed by more than 1e-5
// (docs/BENCHMARKS.md says what this means for training). Upper bounds:
// about twice the measured figures. Lower bounds: drops happen, and they
// move the log-probs far beyond the 1e-5 to which the same batch agrees
// when recomputed without capacity (no-grad, dropless), so the whole
// difference comes from the drops.
TEST(MoeModelTest, CapacityDropsMakeTrainerLogProbsDifferFromRollout) {
  auto model = TinyMoeModel(TinyMoeConfig(2, 1.25, true));
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back({kBos, 20 + 5 * i, 21 + i});
  const CollatedBatch batch = SampleAndCollate(*model, prompts);
  const at::Tensor mask = batch.response_mask;
  const double tokens = mask.sum().item<double>();
  struct Diff {
    double max, mean, changed;  // changed: share of tokens off by > 1e-5
  };
  auto diff_stats = [&](const at::Tensor& logp) {
    const at::Tensor d = (logp.detach() - batch.behaviour_logp).abs() * mask;
    return Diff{d.max().item<double>(), d.sum().item<double>() / tokens,
                (d > 1e-5).sum().item<double>() / tokens};
  };
  model->set_training(true);
  const Diff train = diff_stats(ResponseLogProbs(*model, batch, 0.7, nullptr));
  const double dropped = model->moe_stats().dropped_frac;
  Diff dropless;
  {
    torch::NoGradGuard no_grad;
    dropless = diff_stats(ResponseLogProbs(*model, batch, 0.7, nullptr));
    EXPECT_EQ(model->moe_stats().dropped_frac, 0.0);
  }
  std::printf(
      "capacity 1.25: dropped %.4f of assignments; |trainer - rollout| "
      "log-prob max %.4g mean %.4g over %.0f tokens, %.3f of them changed; "
      "dropless max %.3g\n",
      dropped, train.max, train.mean, tokens, train.changed, dropless.max);
  EXPECT_LT(dropless.max, 1e-5);
  EXPECT_GT(dropped, 0.0);
  EXPECT_LE(dropped, 0.025);
  EXPECT_GT(train.max, 1e-3);
  EXPECT_LE(train.max, 1.1);
  EXPECT_GT(train.mean, 1e-4);
  EXPECT_LE(train.mean, 0.02);
  EXPECT_GT(train.changed, 0.0);
  EXPECT_LE(train.changed, 0.1);
}

TEST(MoeModelTest, CapacityAppliesToTheTrainingForwardOnly) {
  auto model = TinyMoeModel(TinyMoeConfig(2, 0.5, false));
  const auto tokens = torch::randint(3, 98, {4, 10}, torch::kLong);
  const auto valid = torch::ones({4, 10}, torch::kBool);
  const auto pos = PositionsFromValid(valid);
  model->set_training(true);
  model->Forward(tokens, pos, valid);
  // C = ceil(0.5 * 40 * 2 / 4) = 10 of 80 assignments per expert: at least
  // 40 dropped.
  EXPECT_GE(model->moe_stats().dropped_frac, 0.5);
  const at::Tensor aux = model->AuxLoss();
  ASSERT_TRUE(aux.defined());
  EXPECT_TRUE(aux.requires_grad());
  {
    torch::NoGradGuard no_grad;  // e.g. a proximal recomputation
    model->Forward(tokens, pos, valid);
    EXPECT_EQ(model->moe_stats().dropped_frac, 0.0);
  }
  model->set_training(false);
  model->Forward(tokens, pos, valid);
  EXPECT_EQ(model->moe_stats().dropped_frac, 0.0);
  // The cached path is dropless even in training mode with autograd on.
  model->set_training(true);
  KvCache cache = model->NewCache(4, 10);
  model->ForwardCached(tokens, pos, valid, cache);
  EXPECT_EQ(model->moe_stats().dropped_frac, 0.0);
}

TEST(MoeModelTest, AuxLossIsTheWeightedSumOverLayers) {
  ModelConfig c = TinyMoeConfig(2, 0.0, false);
  c.moe_aux_loss_coef = 0.5;
  c.moe_z_loss_coef = 0.25;
  auto model = TinyMoeModel(c);
  const auto tokens = torch::randint(3, 98, {2, 6}, torch::kLong);
  const auto valid = torch::ones({2, 6}, torch::kBool);
  model->Forward(tokens, PositionsFromValid(valid), valid);
  const MoeStats s = model->moe_stats();
  ASSERT_EQ(s.expert_load.size(), 4u);
  double load = 0;
  for (double l : s.expert_load) load += l;
  EXPECT_NEAR(load, 1.0, 1e-6);
  // By hand: with every router weight zero each token's router
  // probabilities are uniform whatever its hidden state, so each layer's
  // load-balancing loss is N * sum_i f_i * (1/N) = 1 and its z-loss
  // logsumexp(0, 0, 0, 0)^2 = (ln 4)^2: AuxLoss() = n_layers * (0.5 * 1 +
  // 0.25 * (ln 4)^2) = 1.96090... for the two layers.
  int routers = 0;
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : model->named_parameters()) {
      if (name.size() >= 13 &&
          name.compare(name.size() - 13, 13, "router.weight") == 0) {
        p.zero_();
        ++routers;
      }
    }
  }
  ASSERT_EQ(routers, c.n_layers);
  model->Forward(tokens, PositionsFromValid(valid), valid);
  const double ln4 = std::log(4.0);
  EXPECT_NEAR(model->AuxLoss().item<double>(),
              c.n_layers * (0.5 * 1.0 + 0.25 * ln4 * ln4), 1e-5);
  // Every token picks the same two experts: load 1/2 on each.
  double top = 0;
  for (double l : model->moe_stats().expert_load) top = std::max(top, l);
  EXPECT_NEAR(top, 0.5, 1e-7);
  auto dense = testing_util::TinyModel();
  EXPECT_FALSE(dense->AuxLoss().defined());
  EXPECT_TRUE(dense->moe_stats().expert_load.empty());
}

TEST(MoeModelTest, CreateRejectsAnInvalidMixture) {
  ModelConfig c = TinyMoeConfig(2, 0.0, false);
  c.moe_experts = 1;
  EXPECT_EQ(PolicyModel::Create(c, 98, c10::Device("cpu"), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  c.moe_experts = 4;
  c.moe_top_k = 5;  // more than the experts
  EXPECT_EQ(PolicyModel::Create(c, 98, c10::Device("cpu"), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  c.moe_top_k = 2;
  c.moe_groups = 3;  // 4 experts do not split into 3 groups
  EXPECT_EQ(PolicyModel::Create(c, 98, c10::Device("cpu"), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  c.moe_top_k = 3;
  c.moe_groups = 2;  // 3 choices do not split over 2 groups
  EXPECT_EQ(PolicyModel::Create(c, 98, c10::Device("cpu"), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  c.moe_top_k = 4;
  c.moe_groups = 2;
  EXPECT_TRUE(PolicyModel::Create(c, 98, c10::Device("cpu"), 1).ok());
}

TEST(MoeCheckpointTest, MixtureShapeIsCheckedByKey) {
  const std::string dir = ::testing::TempDir() + "/ckpt_moe";
  auto moe_model = TinyMoeModel(TinyMoeConfig(2, 0.0, true), 1);
  ASSERT_TRUE(
      WriteCheckpoint(dir, *moe_model, nullptr, CheckpointMeta{"rl", "u"})
          .ok());
  // Same shape (capacity factor is not shape): loads, weights equal.
  auto same = TinyMoeModel(TinyMoeConfig(2, 1.5, true), 2);
  ASSERT_TRUE(ReadCheckpoint(dir, *same, nullptr).ok());
  const auto pa = moe_model->parameters(), pb = same->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(torch::equal(pa[i], pb[i]));

  auto expect_mismatch = [&](PolicyModel& m, const std::string& dir_,
                             const std::string& what) {
    const auto st = ReadCheckpoint(dir_, m, nullptr).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find(what), std::string::npos) << st;
  };
  auto dense = testing_util::TinyModel(1);
  expect_mismatch(*dense, dir,
                  "model.moe_experts is 4 in the checkpoint but 0");
  ModelConfig wider = TinyMoeConfig(2, 0.0, true);
  wider.moe_d_ff = 48;
  expect_mismatch(*TinyMoeModel(wider), dir,
                  "model.moe_d_ff is 32 in the checkpoint but 48");
  expect_mismatch(
      *TinyMoeModel(TinyMoeConfig(2, 0.0, false)), dir,
      "model.moe_shared_expert is true in the checkpoint but false");
  // MoGE routing, both ways.
  ModelConfig grouped = TinyMoeConfig(2, 0.0, true);
  grouped.moe_groups = 2;
  expect_mismatch(*TinyMoeModel(grouped), dir,
                  "model.moe_groups is 1 in the checkpoint but 2");
  const std::string grouped_dir = ::testing::TempDir() + "/ckpt_moe_groups";
  ASSERT_TRUE(WriteCheckpoint(grouped_dir, *TinyMoeModel(grouped), nullptr,
                              CheckpointMeta{"rl", "u"})
                  .ok());
  ASSERT_TRUE(
      ReadCheckpoint(grouped_dir, *TinyMoeModel(grouped), nullptr).ok());
  expect_mismatch(*same, grouped_dir,
                  "model.moe_groups is 2 in the checkpoint but 1");

  const std::string dense_dir = ::testing::TempDir() + "/ckpt_dense_for_moe";
  ASSERT_TRUE(
      WriteCheckpoint(dense_dir, *dense, nullptr, CheckpointMeta{"rl", "u"})
          .ok());
  expect_mismatch(*same, dense_dir,
                  "model.moe_experts is 0 in the checkpoint but 4");
}

// MoGE: with G groups every token takes top_k / G experts inside each group,
// the best of that group, so each group gets exactly T * top_k / G of the
// assignments whatever the router prefers; the k are ordered best first.
TEST(MoeGroupedRoutingTest, EveryGroupGetsTheSameAssignmentsEveryCall) {
  torch::manual_seed(11);
  for (const auto& [experts, top_k, groups] :
       std::vector<std::tuple<int, int, int>>{
           {8, 2, 2}, {8, 4, 2}, {8, 4, 4}, {6, 3, 3}, {16, 8, 4}}) {
    SCOPED_TRACE(absl::StrCat(experts, " experts, top ", top_k, ", ", groups,
                              " groups"));
    // A router that strongly prefers the first group: plain top-k would
    // put (nearly) every assignment there.
    auto logits = torch::randn({37, experts}, torch::kDouble);
    logits.narrow(1, 0, experts / groups).add_(4.0);
    moe::RouteOptions o;
    o.top_k = top_k;
    o.groups = groups;
    const moe::RouterOutput r = moe::Route(logits, o);
    const int per = experts / groups;
    const auto group_of = r.expert_index.div(per, "floor");
    for (int g = 0; g < groups; ++g) {
      // Exactly top_k / G choices of every token in every group.
      EXPECT_TRUE(torch::equal(group_of.eq(g).sum(1),
                               torch::full({37}, top_k / groups, torch::kLong)))
          << "group " << g;
      // They are that group's best: the group's (k/G)-th best probability
      // is at least every unchosen member's.
      const auto in_group = r.probs.narrow(1, g * per, per);
      const auto kth = std::get<0>(in_group.topk(top_k / groups, 1))
                           .select(1, top_k / groups - 1);
      const auto chosen_min = r.probs.gather(1, r.expert_index)
                                  .masked_fill(group_of.ne(g), 2.0)
                                  .amin(1);
      EXPECT_TRUE(torch::equal(chosen_min, kth));
      // The balance statistics see it: the group's share is exactly 1 / G.
      EXPECT_NEAR(r.expert_load.narrow(0, g * per, per).sum().item<double>(),
                  1.0 / groups, 1e-6);
    }
    // Best first, and the gates renormalised over the chosen experts.
    const auto p = r.probs.gather(1, r.expert_index);
    EXPECT_TRUE(torch::equal(std::get<0>(p.sort(-1, true)), p));
    EXPECT_TRUE(torch::allclose(r.gates, p / p.sum(1, true), 0, 1e-12));
    // Plain top-k on the same router is unbalanced (the check can fail).
    const moe::RouterOutput plain = moe::Route(logits, top_k, 0);
    EXPECT_GT(plain.expert_load.narrow(0, 0, per).sum().item<double>(),
              1.0 / groups + 0.1);
  }
}

TEST(MoeGroupedRoutingTest, MalformedGroupingIsRefused) {
  const auto logits = torch::randn({4, 8}, torch::kDouble);
  for (const auto& [top_k, groups] :
       std::vector<std::pair<int, int>>{{2, 3}, {3, 2}, {2, 4}, {9, 1}}) {
    moe::RouteOptions o;
    o.top_k = top_k;
    o.groups = groups;
    EXPECT_THROW(moe::Route(logits, o), c10::Error)
        << "top " << top_k << " groups " << groups;
  }
}

// Replay: the recorded experts, in their order, with gates recomputed
// from the current router; slots marked -1 route as usual.
TEST(MoeReplayTest, ReplayTakesTheRecordedExpertsAndRecomputesTheGates) {
  torch::manual_seed(5);
  const auto logits = torch::randn({6, 4}, torch::kDouble);
  moe::RouteOptions o;
  o.top_k = 2;
  o.replay = torch::tensor({{3, 0}, {1, 2}, {-1, -1}, {0, 1}, {2, 3}, {-1, -1}},
                           torch::kLong);
  const moe::RouterOutput r = moe::Route(logits, o);
  const moe::RouterOutput free = moe::Route(logits, 2, 0);
  const auto probs = torch::softmax(logits, -1);
  for (int64_t t = 0; t < 6; ++t) {
    const bool replayed = o.replay[t][0].item<int64_t>() >= 0;
    const auto want = replayed ? o.replay[t] : free.expert_index[t];
    EXPECT_TRUE(torch::equal(r.expert_index[t], want)) << t;
    const auto p = probs[t].index_select(0, want);
    EXPECT_TRUE(torch::allclose(r.gates[t], p / p.sum(), 0, 1e-12)) << t;
  }
  EXPECT_TRUE(r.keep.all().item<bool>());
  // A replay with capacity would drop replayed assignments: refused.
  o.capacity = 1;
  EXPECT_THROW(moe::Route(logits, o), c10::Error);
}

// The module with groups, and with top_k beyond 2, equals the per-token
// loop; recorded routes replayed give the same output, and replay holds
// the experts when the router has moved.
TEST(MoeModuleTest, GroupedDispatchAndReplayEqualThePerTokenLoop) {
  for (const auto& [top_k, groups] :
       std::vector<std::pair<int, int>>{{2, 2}, {4, 2}, {4, 1}, {3, 1}}) {
    SCOPED_TRACE(absl::StrCat("top ", top_k, " groups ", groups));
    MoeFeedForward m = MakeMoe(4, top_k, 0.0, /*shared=*/true, 3, groups);
    torch::NoGradGuard no_grad;
    const auto x = RandomTokens({2, 9, 8});
    m->set_record_routes(true);
    const auto out = m->forward(x, Routed(at::Tensor(), false));
    moe::RouteOptions o;
    o.top_k = top_k;
    o.groups = groups;
    const auto ref = PerTokenReference(m, x.reshape({18, 8}), o);
    EXPECT_LE((out.reshape({18, 8}) - ref).abs().max().item<double>(), 1e-10);
    const at::Tensor routes = m->last_routes().clone();
    ASSERT_EQ(routes.sizes(), (std::vector<int64_t>{2, 9, top_k}));
    // Replayed: the same experts, the same output.
    MoeRouting replay = Routed(at::Tensor(), false);
    replay.replay = routes;
    EXPECT_TRUE(torch::equal(m->forward(x, replay), out));
    EXPECT_TRUE(torch::equal(m->last_routes(), routes));
    // Move the router: free routing changes, replay keeps the experts.
    m->router->weight.mul_(-1.0);
    m->forward(x, Routed(at::Tensor(), false));
    EXPECT_FALSE(torch::equal(m->last_routes(), routes));
    m->forward(x, replay);
    EXPECT_TRUE(torch::equal(m->last_routes(), routes));
  }
}

// The rollout records the experts of every token it fed; replayed in the
// trainer's forward (training mode, autograd on, capacity 0.5 dropping
// assignments) they reproduce the rollout's experts exactly and bring the
// trainer's log-probs back to the behaviour log-probs, which the drops had
// moved. Without replay the measure sees the disagreement.
TEST(MoeReplayTest, ReplayMakesTrainerLogProbsMatchTheRolloutUnderDrops) {
  for (int groups : {1, 2}) {
    SCOPED_TRACE(groups);
    ModelConfig c = TinyMoeConfig(2, 0.5, true);
    c.moe_groups = groups;
    auto model = TinyMoeModel(c);
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 8; ++i) prompts.push_back({kBos, 20 + 5 * i, 21 + i});
    RolloutEngine engine(*model, kPad, kEos);
    SamplingParams p;
    p.temperature = 0.7;
    p.max_new_tokens = 12;
    const auto out = engine.Generate(prompts, p, 99).value();
    std::vector<Sample> samples(prompts.size());
    const int64_t width = c.n_layers * c.moe_top_k;
    for (size_t i = 0; i < prompts.size(); ++i) {
      samples[i].prompt_ids = prompts[i];
      samples[i].response_ids = out[i].tokens;
      samples[i].behaviour_logp = out[i].logp;
      samples[i].routes = out[i].routes;
      // Every fed token: the prompt and all generated tokens but the last.
      EXPECT_EQ(
          static_cast<int64_t>(out[i].routes.size()),
          static_cast<int64_t>(prompts[i].size() + out[i].tokens.size() - 1) *
              width);
    }
    CollatedBatch batch = Collate(samples, kPad, c10::Device("cpu"));
    batch.routes = CollateRoutes(samples, batch, c).value();
    ASSERT_TRUE(batch.routes.defined());
    const at::Tensor mask = batch.response_mask;
    auto max_diff = [&](const at::Tensor& logp) {
      return ((logp.detach() - batch.behaviour_logp).abs() * mask)
          .max()
          .item<double>();
    };
    model->set_training(true);
    model->set_record_routes(true);
    const double free_diff =
        max_diff(ResponseLogProbs(*model, batch, 0.7, nullptr));
    const RouteAgreement free =
        CompareRoutes(model->last_routes(), batch.routes);
    EXPECT_GT(model->moe_stats().dropped_frac, 0.0);
    model->SetRouteReplay(batch.routes);
    const at::Tensor replayed_logp =
        ResponseLogProbs(*model, batch, 0.7, nullptr);
    ASSERT_TRUE(replayed_logp.requires_grad());
    const double replay_diff = max_diff(replayed_logp);
    const RouteAgreement replayed =
        CompareRoutes(model->last_routes(), batch.routes);
    model->SetRouteReplay(at::Tensor());
    std::printf(
        "groups %d, capacity 0.5: without replay %.0f of %.0f recorded "
        "tokens routed elsewhere, |trainer - rollout| log-prob max %.3g; "
        "with replay %.0f, max %.3g\n",
        groups, free.differing, free.tokens, free_diff, replayed.differing,
        replay_diff);
    EXPECT_GT(free.tokens, 60);
    EXPECT_GT(free.differing, 0);
    EXPECT_GT(free_diff, 1e-3);
    EXPECT_EQ(replayed.differing, 0);
    EXPECT_EQ(replayed.tokens, free.tokens);
    EXPECT_LT(replay_diff, 1e-5);
    // Gradients flow to the router through the recomputed gates.
    (replayed_logp * mask).sum().backward();
    for (const auto& [name, t] : model->named_parameters()) {
      if (name.find("router") != std::string::npos) {
        ASSERT_TRUE(t.grad().defined()) << name;
        EXPECT_GT(t.grad().abs().sum().item<double>(), 0) << name;
      }
    }
  }
}

TEST(MoeReplayTest, MalformedRoutesAreRefusedByName) {
  ModelConfig c = TinyMoeConfig(2, 0.0, false);
  Sample s;
  s.prompt_ids = {kBos, 20};
  s.response_ids = {30, kEos};
  s.routes.assign(3 * c.n_layers * 2, 1);  // 3 tokens: fine
  std::vector<Sample> samples = {s};
  CollatedBatch batch = Collate(samples, kPad, c10::Device("cpu"));
  EXPECT_TRUE(CollateRoutes(samples, batch, c).ok());
  samples[0].routes.push_back(1);  // not whole tokens
  EXPECT_EQ(CollateRoutes(samples, batch, c).status().code(),
            absl::StatusCode::kInvalidArgument);
  samples[0].routes.assign(3 * c.n_layers * 2, 4);  // expert 4 of 4
  auto bad = CollateRoutes(samples, batch, c);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("expert 4"), std::string::npos)
      << bad.status();
  samples[0].routes.assign(5 * c.n_layers * 2, 1);  // more than its tokens
  EXPECT_FALSE(CollateRoutes(samples, batch, c).ok());
}

}  // namespace
}  // namespace fusionrl
