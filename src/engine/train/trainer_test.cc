#include "engine/train/trainer.h"

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "engine/collectives/grad_sync.h"
#include "engine/kernels/intra_op_threads.h"
#include "engine/model/test_util.h"
#include "engine/rollout/rollout.h"
#include "engine/train/algorithms.h"
#include "engine/train/master_weights.h"
#include "engine/train/trainer_test_util.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using testing_util::TinyModel;
using trainer_testing::FourGroupsOfFour;
using trainer_testing::GradsAfterStep;
using trainer_testing::kBos;
using trainer_testing::kCpu;
using trainer_testing::kEos;
using trainer_testing::kPad;
using trainer_testing::MakeSample;
using trainer_testing::SetBehaviourLogProbs;
using trainer_testing::TinyJob;

TEST(TrainerTest, CollateLeftPadsPromptsAndRightPadsResponses) {
  std::vector<Sample> samples = {MakeSample({kBos, 10, 11}, {20, kEos}, 1),
                                 MakeSample({kBos}, {30, 31, 32}, 0)};
  CollatedBatch b = Collate(samples, kPad, kCpu);
  EXPECT_EQ(b.prompt_len, 3);
  auto expected_ids = torch::tensor(
      {{kBos, 10, 11, 20, kEos, kPad}, {kPad, kPad, kBos, 30, 31, 32}},
      torch::kLong);
  EXPECT_TRUE(torch::equal(b.input_ids, expected_ids));
  auto expected_pos =
      torch::tensor({{0, 1, 2, 3, 4, 4}, {0, 0, 0, 1, 2, 3}}, torch::kLong);
  EXPECT_TRUE(torch::equal(b.positions, expected_pos)) << b.positions;
  auto expected_mask = torch::tensor({{1.f, 1.f, 0.f}, {1.f, 1.f, 1.f}});
  EXPECT_TRUE(torch::equal(b.response_mask, expected_mask));
  EXPECT_TRUE(torch::equal(
      b.response_ids,
      torch::tensor({{20, kEos, kPad}, {30, 31, 32}}, torch::kLong)));
}

TEST(TrainerTest, LearningRateWarmsUpLinearlyThenStaysConstant) {
  OptimConfig o;
  o.lr = 1e-3;
  o.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 0), 2.5e-4);
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 3), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 100), 1e-3);
  o.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(LearningRateAt(o, 0), 1e-3);
}

// Gradient accumulation over micro-batches must give the same gradient as one
// big batch, for every loss aggregation mode. (Gradients, not the updated
// weights: Adam's g / sqrt(v) turns float noise in near-zero gradients into
// full-size steps of either sign.)
TEST(TrainerTest, MicroBatchAccumulationMatchesFullBatch) {
  for (LossAggMode mode :
       {LossAggMode::kTokenMean, LossAggMode::kSeqMeanTokenMean,
        LossAggMode::kSeqMeanTokenSum, LossAggMode::kSeqMeanTokenSumNorm}) {
    JobConfig c = TinyJob();
    c.algorithm.loss_agg_mode = mode;
    c.optim.micro_batch_size = 16;
    auto full_model = TinyModel(3);
    auto full = Trainer::Create(*full_model, nullptr, c, kPad).value();
    ASSERT_TRUE(full->Step(FourGroupsOfFour()).ok());

    c.optim.micro_batch_size = 3;  // uneven split
    auto micro_model = TinyModel(3);
    auto micro = Trainer::Create(*micro_model, nullptr, c, kPad).value();
    ASSERT_TRUE(micro->Step(FourGroupsOfFour()).ok());

    auto pf = full_model->parameters(), pm = micro_model->parameters();
    for (size_t i = 0; i < pf.size(); ++i) {
      ASSERT_TRUE(pf[i].grad().defined());
      EXPECT_GT(pf[i].grad().abs().sum().item<double>(), 0)
          << LossAggModeName(mode) << " " << i;
      EXPECT_TRUE(torch::allclose(pf[i].grad(), pm[i].grad(), 1e-4, 1e-7))
          << LossAggModeName(mode) << " param " << i << " max diff "
          << (pf[i].grad() - pm[i].grad()).abs().max().item<double>();
    }
  }
}

// RL Fusion moves threads between a card's trainer and its rollout from one
// micro-batch to the next: a training step must not depend on how many
// threads computed it (engine/kernels/invariant_ops.h). Bit for bit, for the
// gradients and the updated weights, on a model and batch large enough that
// every product and sum would be split across threads.
TEST(TrainerTest, StepDoesNotDependOnTheThreadCount) {
  for (const bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "MoE" : "dense");
    JobConfig c = TinyJob();
    c.model.d_model = 96;
    c.model.n_layers = 2;
    c.model.n_heads = 4;
    c.model.d_ff = 256;
    c.model.max_seq_len = 64;
    if (moe) {
      c.model.moe_experts = 4;
      c.model.moe_top_k = 2;
      c.model.moe_shared_expert = true;
    }
    c.optim.micro_batch_size = 64;
    c.optim.grad_clip = 1.0;
    c.algorithm.decoupled_loss = true;
    std::vector<Sample> batch;
    for (int g = 0; g < 16; ++g) {
      for (int i = 0; i < 4; ++i) {
        std::vector<int> resp;
        for (int t = 0; t < 20 + (g * 7 + i * 5) % 30; ++t) {
          resp.push_back(3 + (g * 13 + i * 7 + t * 3) % 90);
        }
        resp.push_back(kEos);
        Sample s = MakeSample({kBos, 40 + g, 41 + i}, resp, (i + g) % 3 == 0);
        for (size_t t = 0; t < s.behaviour_logp.size(); ++t) {
          s.behaviour_logp[t] = -4.0f - 0.01f * static_cast<float>(t % 7);
        }
        batch.push_back(std::move(s));
      }
    }
    c.rollout.group_size = 4;
    std::vector<std::vector<at::Tensor>> grads, weights;
    const int before = at::get_num_threads();
    for (int threads : {1, 2}) {
      SetIntraOpThreads(threads);
      auto model = PolicyModel::Create(c.model, 98, kCpu, 5).value();
      auto trainer = Trainer::Create(*model, nullptr, c, kPad).value();
      ASSERT_TRUE(trainer->Step(batch).ok());
      std::vector<at::Tensor> g, w;
      for (const at::Tensor& p : model->parameters()) {
        g.push_back(p.grad().clone());
        w.push_back(p.detach().clone());
      }
      grads.push_back(std::move(g));
      weights.push_back(std::move(w));
    }
    SetIntraOpThreads(before);
    const auto named =
        PolicyModel::Create(c.model, 98, kCpu, 5).value()->named_parameters();
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i]))
          << named[i].first << ": max gradient difference "
          << (grads[0][i] - grads[1][i]).abs().max().item<double>();
      EXPECT_TRUE(torch::equal(weights[0][i], weights[1][i])) << named[i].first;
    }
  }
}

// Length bucketing: micro-batches of similar lengths, trimmed, compute less
// padding than one padded batch (and, above, the same gradients).
TEST(TrainerTest, LengthBucketedMicroBatchesComputeLessPadding) {
  JobConfig c = TinyJob();
  c.optim.micro_batch_size = 16;
  auto one_model = TinyModel(3);
  auto one = Trainer::Create(*one_model, nullptr, c, kPad).value();
  const TrainStats whole = one->Step(FourGroupsOfFour()).value();
  c.optim.micro_batch_size = 4;
  auto bucket_model = TinyModel(3);
  auto bucketed = Trainer::Create(*bucket_model, nullptr, c, kPad).value();
  const TrainStats b = bucketed->Step(FourGroupsOfFour()).value();
  // 16 sequences of prompt 2 and responses of 2..6 tokens: 16 x 8 padded.
  EXPECT_EQ(whole.computed_tokens, 16 * 8);
  int64_t real = 0;
  for (const Sample& s : FourGroupsOfFour()) {
    real += static_cast<int64_t>(s.prompt_ids.size() + s.response_ids.size());
  }
  EXPECT_LT(b.computed_tokens, whole.computed_tokens);
  EXPECT_GE(b.computed_tokens, real);
  EXPECT_EQ(b.tokens, whole.tokens);
  EXPECT_NEAR(b.loss, whole.loss, 1e-6);
  // Off: every micro-batch computes the batch's padded width.
  c.optim.length_bucketing = false;
  auto plain_model = TinyModel(3);
  auto plain = Trainer::Create(*plain_model, nullptr, c, kPad).value();
  EXPECT_EQ(plain->Step(FourGroupsOfFour()).value().computed_tokens, 16 * 8);
}

// On-policy samples: the decoupled loss is the plain PPO loss (weights 1).
// Samples whose behaviour policy gave every token twice the probability the
// trainer's weights give it: every behaviour weight is exp(-log 2) = 0.5, so
// the gradient is half the plain gradient taken against the proximal
// log-probs.
TEST(TrainerTest, DecoupledLossOnPolicyIsPlainPpoAndWeighsStaleSamples) {
  JobConfig c = TinyJob();
  auto probe = TinyModel(3);
  std::vector<Sample> on_policy = FourGroupsOfFour();
  SetBehaviourLogProbs(*probe, on_policy, 0.0f);
  std::vector<Sample> stale = on_policy;
  for (Sample& s : stale) {
    for (float& lp : s.behaviour_logp) lp += std::log(2.0f);
  }

  TrainStats plain_stats, dec_stats, stale_stats;
  const auto plain = GradsAfterStep(c, on_policy, &plain_stats);
  c.algorithm.decoupled_loss = true;
  const auto dec = GradsAfterStep(c, on_policy, &dec_stats);
  EXPECT_NEAR(dec_stats.behaviour_weight_mean, 1.0, 1e-5);
  EXPECT_EQ(dec_stats.behaviour_weight_truncated, 0.0);
  const auto weighted = GradsAfterStep(c, stale, &stale_stats);
  EXPECT_NEAR(stale_stats.behaviour_weight_mean, 0.5, 1e-5);
  ASSERT_EQ(plain.size(), dec.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::allclose(dec[i], plain[i], 1e-4, 1e-6)) << i;
    EXPECT_TRUE(torch::allclose(weighted[i], 0.5 * plain[i], 1e-4, 1e-6))
        << i << " max diff "
        << (weighted[i] - 0.5 * plain[i]).abs().max().item<double>();
  }
  // The cap truncates: behaviour 4x less likely than proximal -> 4, cap 2.
  for (Sample& s : stale) {
    for (float& lp : s.behaviour_logp) lp -= 3 * std::log(2.0f);
  }
  c.algorithm.behaviour_weight_cap = 2.0;
  const auto capped = GradsAfterStep(c, stale, &stale_stats);
  EXPECT_NEAR(stale_stats.behaviour_weight_mean, 2.0, 1e-5);
  EXPECT_EQ(stale_stats.behaviour_weight_truncated, 1.0);
}

// A dropped (over-stale) group is masked out of every loss term and
// normaliser: the step's gradient is that of the other groups alone, for
// every aggregation mode.
TEST(TrainerTest, ExcludedGroupsContributeNothing) {
  for (LossAggMode mode :
       {LossAggMode::kTokenMean, LossAggMode::kSeqMeanTokenMean,
        LossAggMode::kSeqMeanTokenSum, LossAggMode::kSeqMeanTokenSumNorm}) {
    JobConfig c = TinyJob();
    c.algorithm.loss_agg_mode = mode;
    std::vector<Sample> all = FourGroupsOfFour();
    std::vector<Sample> kept(all.begin(), all.begin() + 8);
    for (size_t i = 8; i < all.size(); ++i) all[i].excluded = true;
    TrainStats with_excluded, alone;
    const auto a = GradsAfterStep(c, all, &with_excluded);
    const auto b = GradsAfterStep(c, kept, &alone);
    EXPECT_EQ(with_excluded.tokens, alone.tokens) << LossAggModeName(mode);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-7))
          << LossAggModeName(mode) << " parameter " << i << " max diff "
          << (a[i] - b[i]).abs().max().item<double>();
    }
  }
}

// Multi-turn episodes: tokens the environment wrote (loss_mask 0) are in
// the context of the later model tokens but in no loss term or normaliser.
// Their behaviour log-probs (0 from the rollout) are moved here: if they
// were trained, their ratios and so the gradient would change.
TEST(TrainerTest, EnvironmentTokensGetZeroGradient) {
  for (LossAggMode mode :
       {LossAggMode::kTokenMean, LossAggMode::kSeqMeanTokenMean,
        LossAggMode::kSeqMeanTokenSum}) {
    JobConfig c = TinyJob();
    c.algorithm.loss_agg_mode = mode;
    auto probe = TinyModel(3);
    std::vector<Sample> masked = FourGroupsOfFour();
    SetBehaviourLogProbs(*probe, masked, 0.0f);
    int64_t model_tokens = 0;
    for (Sample& s : masked) {
      s.loss_mask.assign(s.response_ids.size(), 1);
      // Every second token from the first on (the final eos stays the
      // model's) is the environment's.
      for (size_t t = 0; t + 1 < s.response_ids.size(); t += 2) {
        s.loss_mask[t] = 0;
      }
      for (uint8_t m : s.loss_mask) model_tokens += m;
    }
    std::vector<Sample> moved = masked;
    for (Sample& s : moved) {
      for (size_t t = 0; t < s.response_ids.size(); ++t) {
        // Inside the PPO clip range: a trained token would move the loss.
        if (!s.loss_mask[t]) s.behaviour_logp[t] -= 0.1f;
      }
    }
    std::vector<Sample> unmasked = moved;
    for (Sample& s : unmasked) s.loss_mask.clear();
    TrainStats a_stats, b_stats, c_stats;
    const auto a = GradsAfterStep(c, masked, &a_stats);
    const auto b = GradsAfterStep(c, moved, &b_stats);
    const auto u = GradsAfterStep(c, unmasked, &c_stats);
    EXPECT_EQ(a_stats.tokens, model_tokens) << LossAggModeName(mode);
    double unmasked_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::equal(a[i], b[i]))
          << LossAggModeName(mode) << " parameter " << i << " max diff "
          << (a[i] - b[i]).abs().max().item<double>();
      unmasked_diff =
          std::max(unmasked_diff, (a[i] - u[i]).abs().max().item<double>());
    }
    // The same batch without the mask trains those tokens: another gradient.
    EXPECT_GT(unmasked_diff, 1e-4) << LossAggModeName(mode);
  }
}

TEST(TrainerTest, MiniBatchesTakeSeveralOptimizerStepsAndOneVersion) {
  JobConfig c = TinyJob();
  c.optim.mini_batch_size = 8;
  auto model = TinyModel(3);
  auto trainer = Trainer::Create(*model, nullptr, c, kPad).value();
  auto stats = trainer->Step(FourGroupsOfFour()).value();
  EXPECT_EQ(stats.optimizer_steps, 2);
  EXPECT_EQ(trainer->version(), 1);
}

TEST(TrainerTest, RejectsBatchNotMultipleOfGroupAndEmptyResponses) {
  JobConfig c = TinyJob();
  auto model = TinyModel(3);
  auto trainer = Trainer::Create(*model, nullptr, c, kPad).value();
  auto samples = FourGroupsOfFour();
  samples.pop_back();
  EXPECT_EQ(trainer->Step(samples).status().code(),
            absl::StatusCode::kInvalidArgument);
  samples = FourGroupsOfFour();
  samples[2].response_ids.clear();
  EXPECT_EQ(trainer->Step(samples).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(trainer->version(), 0);
}

TEST(TrainerTest, KlToReferenceStartsAtZeroAndGrows) {
  JobConfig c = TinyJob();
  c.algorithm.kl_coef = 0.1;
  auto model = TinyModel(3);
  auto reference = model->CloneFrozen();
  auto trainer = Trainer::Create(*model, reference.get(), c, kPad).value();
  const std::vector<Sample> samples = FourGroupsOfFour();
  auto first = trainer->Step(samples).value();
  EXPECT_NEAR(first.kl, 0.0, 1e-6);
  // After one update the second step's KL is the token mean of k3 (the
  // default estimator) between the updated policy and the reference on the
  // step's responses: with x = ref - logp, k3 = exp(x) - x - 1. Computed
  // here from the composite full-vocabulary log-probs (the trainer uses the
  // chunked head and algo::KlPenalty).
  double expected = 0;
  {
    at::NoGradGuard no_grad;
    const CollatedBatch b = Collate(samples, kPad, kCpu);
    const at::Tensor x = ResponseLogProbs(*reference, b, 1.0, nullptr) -
                         ResponseLogProbs(*model, b, 1.0, nullptr);
    const at::Tensor k3 = x.exp() - x - 1;
    expected =
        ((k3 * b.response_mask).sum() / b.response_mask.sum()).item<double>();
  }
  auto second = trainer->Step(samples).value();
  std::printf("KL after one step: trainer %.9g, by hand %.9g\n", second.kl,
              expected);
  EXPECT_GT(expected, 1e-4);  // the update moved the policy measurably
  // float32 through two paths: measured 0.719546391 vs 0.719546318 (1e-7
  // relative); bound 1e-5 relative.
  EXPECT_NEAR(second.kl, expected, 1e-5 * expected);
  EXPECT_EQ(Trainer::Create(*model, nullptr, c, kPad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A short RL run on a toy reward: 1 if the response's first token is the
// target id. The policy starts at ~1/98 and must learn it.
TEST(TrainerTest, RlRaisesRewardOnToyTask) {
  for (AdvEstimator estimator :
       {AdvEstimator::kGrpo, AdvEstimator::kRloo, AdvEstimator::kReinforcePp}) {
    JobConfig c = TinyJob();
    c.algorithm.adv_estimator = estimator;
    c.rollout.group_size = 8;
    c.optim.lr = 3e-3;
    c.optim.grad_clip = 1.0;
    auto model = TinyModel(5);
    auto trainer = Trainer::Create(*model, nullptr, c, kPad).value();
    RolloutEngine engine(*model, kPad, kEos);
    SamplingParams p;
    p.max_new_tokens = 3;
    constexpr int kTarget = 50;
    auto mean_reward = [&](int step, bool train) {
      std::vector<std::vector<int>> prompts;
      for (int g = 0; g < 8; ++g) {
        for (int i = 0; i < 8; ++i) prompts.push_back({kBos, 10 + g});
      }
      auto out = engine.Generate(prompts, p, 1000 + step).value();
      std::vector<Sample> samples;
      double total = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        Sample s;
        s.prompt_ids = prompts[i];
        s.response_ids = out[i].tokens;
        s.behaviour_logp = out[i].logp;
        s.reward = out[i].tokens[0] == kTarget ? 1.0 : 0.0;
        total += s.reward;
        samples.push_back(std::move(s));
      }
      if (train) {
        EXPECT_TRUE(trainer->Step(samples).ok());
      }
      return total / out.size();
    };
    double before = 0;
    for (int s = 0; s < 4; ++s) before += mean_reward(s, false) / 4;
    for (int s = 0; s < 40; ++s) mean_reward(100 + s, true);
    double after = 0;
    for (int s = 0; s < 4; ++s) after += mean_reward(500 + s, false) / 4;
    EXPECT_LT(before, 0.1) << AdvEstimatorName(estimator);
    EXPECT_GT(after, 0.5) << AdvEstimatorName(estimator) << " before "
                          << before;
  }
}

// The same toy run with a MoE policy (4 experts, top-2, a shared expert,
// capacity factor 1.25 in the training forward): the reward rises, and each
// step reports the router statistics.
TEST(TrainerTest, RlWithMoePolicyRaisesReward) {
  JobConfig c = TinyJob();
  c.model.moe_experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_capacity_factor = 1.25;
  c.model.moe_shared_expert = true;
  c.model.moe_d_ff = 32;
  c.rollout.group_size = 8;
  c.optim.lr = 3e-3;
  c.optim.grad_clip = 1.0;
  ASSERT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  auto model = PolicyModel::Create(c.model, 98, kCpu, 5).value();
  auto trainer = Trainer::Create(*model, nullptr, c, kPad).value();
  RolloutEngine engine(*model, kPad, kEos);
  SamplingParams p;
  p.max_new_tokens = 3;
  constexpr int kTarget = 50;
  TrainStats last;
  auto mean_reward = [&](int step, bool train) {
    std::vector<std::vector<int>> prompts;
    for (int g = 0; g < 8; ++g) {
      for (int i = 0; i < 8; ++i) prompts.push_back({kBos, 10 + g});
    }
    auto out = engine.Generate(prompts, p, 1000 + step).value();
    std::vector<Sample> samples;
    double total = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      Sample s;
      s.prompt_ids = prompts[i];
      s.response_ids = out[i].tokens;
      s.behaviour_logp = out[i].logp;
      s.reward = out[i].tokens[0] == kTarget ? 1.0 : 0.0;
      total += s.reward;
      samples.push_back(std::move(s));
    }
    if (train) {
      auto st = trainer->Step(samples);
      EXPECT_TRUE(st.ok()) << st.status();
      if (st.ok()) last = *st;
    }
    return total / out.size();
  };
  double before = 0;
  for (int s = 0; s < 4; ++s) before += mean_reward(s, false) / 4;
  for (int s = 0; s < 40; ++s) mean_reward(100 + s, true);
  double after = 0;
  for (int s = 0; s < 4; ++s) after += mean_reward(500 + s, false) / 4;
  EXPECT_LT(before, 0.1);
  EXPECT_GT(after, 0.5) << "before " << before;
  ASSERT_EQ(last.moe_expert_load.size(), 4u);
  double load = 0;
  for (double l : last.moe_expert_load) load += l;
  EXPECT_NEAR(load, 1.0, 1e-6);
  EXPECT_GT(last.moe_aux_loss, 0.0);
  EXPECT_GT(last.moe_z_loss, 0.0);
  // Capacity applies in the training forward: the trained policy's router is
  // not perfectly balanced, so some assignments overflow. Upper bound by
  // hand: a micro-batch of M tokens gives each expert C = ceil(1.25 * M * 2
  // / 4) >= 0.625 M slots; at worst every token picks the same two experts,
  // which keep 2C of the 2M assignments: at most 1 - 0.625 = 0.375 dropped.
  EXPECT_GT(last.moe_dropped_frac, 0.0);
  EXPECT_LE(last.moe_dropped_frac, 0.375);
}

// The MoE auxiliary loss enters the gradient once per micro-batch, weighted
// by the micro-batch's share of the mini-batch's sequences: the trainer's
// gradient with the loss on, minus the one with it off, is the gradient of
// sum over micro-batches of (sequences / 16) * PolicyModel::AuxLoss().
TEST(TrainerTest, MoeAuxLossIsAddedPerMicroBatchBySequenceShare) {
  JobConfig c = TinyJob();
  c.model.moe_experts = 4;
  c.model.moe_top_k = 2;
  c.optim.micro_batch_size = 6;  // micro-batches of 6, 6 and 4 sequences
  const std::vector<Sample> samples = FourGroupsOfFour();
  auto grads_after_step = [&](double aux_coef, double z_coef,
                              TrainStats* stats) {
    JobConfig cc = c;
    cc.model.moe_aux_loss_coef = aux_coef;
    cc.model.moe_z_loss_coef = z_coef;
    auto model = PolicyModel::Create(cc.model, 98, kCpu, 3).value();
    auto trainer = Trainer::Create(*model, nullptr, cc, kPad).value();
    *stats = trainer->Step(samples).value();
    std::vector<at::Tensor> g;
    for (const auto& p : model->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  TrainStats with_stats, without_stats;
  const auto with = grads_after_step(1.0, 0.1, &with_stats);
  const auto without = grads_after_step(0.0, 0.0, &without_stats);

  ModelConfig mc = c.model;
  mc.moe_aux_loss_coef = 1.0;
  mc.moe_z_loss_coef = 0.1;
  auto ref = PolicyModel::Create(mc, 98, kCpu, 3).value();
  ref->set_training(true);
  for (size_t start = 0; start < samples.size(); start += 6) {
    const size_t n = std::min<size_t>(6, samples.size() - start);
    const std::vector<Sample> slice(samples.begin() + start,
                                    samples.begin() + start + n);
    const CollatedBatch b = Collate(slice, kPad, kCpu);
    ref->Forward(b.input_ids, b.positions, b.valid);
    (ref->AuxLoss() * (static_cast<double>(n) / 16.0)).backward();
  }
  const auto pr = ref->parameters();
  int router_params = 0;
  for (size_t i = 0; i < pr.size(); ++i) {
    // lm_head and the last block's experts do not feed any router.
    const at::Tensor expected =
        pr[i].grad().defined() ? pr[i].grad() : torch::zeros_like(pr[i]);
    const auto diff = with[i] - without[i];
    EXPECT_TRUE(torch::allclose(diff, expected, 1e-4, 1e-7))
        << "param " << i << " max diff "
        << (diff - expected).abs().max().item<double>();
    // Only the router (and what feeds it) gets the aux gradient; the router
    // weights [4, 32] must have one.
    if (pr[i].sizes() == at::IntArrayRef({4, 32})) {
      ++router_params;
      EXPECT_GT(pr[i].grad().abs().sum().item<double>(), 0);
    }
  }
  EXPECT_EQ(router_params, c.model.n_layers);
  // Capacity factor 0: dropless. (The statistics' values and weighting are
  // checked by hand in MoeStatisticsAreMicroBatchMeansWeightedBySequences.)
  EXPECT_EQ(with_stats.moe_dropped_frac, 0.0);
  // A dense policy reports no router statistics.
  auto dense = TinyModel(3);
  auto dense_trainer =
      Trainer::Create(*dense, nullptr, TinyJob(), kPad).value();
  EXPECT_TRUE(
      dense_trainer->Step(FourGroupsOfFour()).value().moe_expert_load.empty());
}

// Router statistics by hand. With every router weight zero each token's
// router probabilities are uniform (1/4) whatever its hidden state, so per
// layer and forward the load-balancing loss is N * sum_i f_i * (1/N) = 1 and
// the z-loss is logsumexp(0, 0, 0, 0)^2 = (ln 4)^2. Every token picks the
// same two experts (equal rows break their ties alike), so with capacity
// C = ceil(0.75 * M * 2 / 4) over a micro-batch's M real tokens each of the
// two keeps C of its M assignments: 1 - C / M dropped, and the load is 1/2 on
// two experts, 0 on the others. The trainer reports the mean over the
// micro-batches (6, 6 and 4 sequences) weighted by their sequences.
TEST(TrainerTest, MoeStatisticsAreMicroBatchMeansWeightedBySequences) {
  JobConfig c = TinyJob();
  c.model.moe_experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_capacity_factor = 0.75;
  c.optim.micro_batch_size = 6;
  auto model = PolicyModel::Create(c.model, 98, kCpu, 3).value();
  int routers = 0;
  {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : model->named_parameters()) {
      if (name.size() >= 13 &&
          name.compare(name.size() - 13, 13, "router.weight") == 0) {
        p.zero_();
        ++routers;
      }
    }
  }
  ASSERT_EQ(routers, c.model.n_layers);
  auto trainer = Trainer::Create(*model, nullptr, c, kPad).value();
  const std::vector<Sample> samples = FourGroupsOfFour();
  const TrainStats stats = trainer->Step(samples).value();

  double dropped = 0;
  for (size_t start = 0; start < samples.size(); start += 6) {
    const size_t n = std::min<size_t>(6, samples.size() - start);
    int64_t m = 0;  // real tokens of the micro-batch
    for (size_t i = start; i < start + n; ++i) {
      m += static_cast<int64_t>(samples[i].prompt_ids.size() +
                                samples[i].response_ids.size());
    }
    const int64_t cap = (3 * m + 7) / 8;  // ceil(0.75 * m * 2 / 4)
    dropped += (1.0 - static_cast<double>(cap) / m) * n / 16.0;
  }
  const double ln4 = std::log(4.0);
  EXPECT_NEAR(stats.moe_aux_loss, 1.0, 1e-6);
  EXPECT_NEAR(stats.moe_z_loss, ln4 * ln4, 1e-5);
  EXPECT_NEAR(stats.moe_dropped_frac, dropped, 1e-6);
  std::vector<double> load = stats.moe_expert_load;
  std::sort(load.begin(), load.end());
  ASSERT_EQ(load.size(), 4u);
  EXPECT_EQ(load[0], 0.0);
  EXPECT_EQ(load[1], 0.0);
  EXPECT_NEAR(load[2], 0.5, 1e-7);
  EXPECT_NEAR(load[3], 0.5, 1e-7);
}

}  // namespace
}  // namespace fusionrl
