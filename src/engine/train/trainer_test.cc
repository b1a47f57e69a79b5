#include "engine/train/trainer.h"

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "engine/train/algorithms.h"
#include "engine/collectives/grad_sync.h"
#include "engine/kernels/intra_op_threads.h"
#include "engine/train/master_weights.h"
#include "engine/rollout/rollout.h"
#include "engine/model/test_util.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using testing_util::TinyModel;

constexpr int kPad = 0, kBos = 1, kEos = 2;
const c10::Device kCpu("cpu");

Sample MakeSample(std::vector<int> prompt, std::vector<int> response,
                  double reward) {
  Sample s;
  s.prompt_ids = std::move(prompt);
  s.response_ids = std::move(response);
  s.behaviour_logp.assign(s.response_ids.size(), -1.0f);
  s.reward = reward;
  return s;
}

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

JobConfig TinyJob() {
  JobConfig c;
  c.model = testing_util::TinyModelConfig();
  c.rollout.group_size = 4;
  c.optim.lr = 1e-2;
  c.optim.grad_clip = 0;
  return c;
}

std::vector<Sample> FourGroupsOfFour() {
  std::vector<Sample> s;
  for (int g = 0; g < 4; ++g) {
    for (int i = 0; i < 4; ++i) {
      std::vector<int> resp;
      for (int t = 0; t <= (g + i) % 5; ++t) resp.push_back(20 + g * 3 + i + t);
      resp.push_back(kEos);
      s.push_back(
          MakeSample({kBos, 40 + g}, resp, (i + g) % 3 == 0 ? 1.0 : 0.0));
    }
  }
  return s;
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

// Sets every sample's behaviour log-probs to `model`'s own log-probs plus
// `shift` (shift 0: the samples are exactly on-policy).
void SetBehaviourLogProbs(PolicyModel& model, std::vector<Sample>& samples,
                          float shift) {
  at::NoGradGuard no_grad;
  const CollatedBatch b = Collate(samples, kPad, kCpu);
  const at::Tensor logp = ResponseLogProbs(model, b, 1.0, nullptr);
  for (size_t i = 0; i < samples.size(); ++i) {
    for (size_t t = 0; t < samples[i].response_ids.size(); ++t) {
      samples[i].behaviour_logp[t] =
          logp[static_cast<int64_t>(i)][static_cast<int64_t>(t)].item<float>() +
          shift;
    }
  }
}

std::vector<at::Tensor> GradsAfterStep(const JobConfig& c,
                                       const std::vector<Sample>& samples,
                                       TrainStats* stats) {
  auto model = TinyModel(3);
  auto trainer = Trainer::Create(*model, nullptr, c, kPad).value();
  *stats = trainer->Step(samples).value();
  std::vector<at::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
  return grads;
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

// A behaviour weight over the cap, truncated or masked (AReaL). Groups 2
// and 3 were sampled by a policy 4x less likely than the proximal one
// (w = 4 > cap 2), groups 0 and 1 on-policy (w = 1). With token-mean over
// all N tokens the on-policy gradient is G01 + G23 (G23 from the stale
// groups' tokens). Truncate trains them with weight 2: G01 + 2 * G23. Mask
// drops them but keeps them in the denominator: G01 alone, i.e. the
// gradient with groups 2 and 3 excluded (normalised by their N01 tokens)
// times N01 / N.
TEST(TrainerTest, BehaviourWeightOverTheCapIsTruncatedOrMasked) {
  JobConfig c = TinyJob();
  c.algorithm.decoupled_loss = true;
  c.algorithm.behaviour_weight_cap = 2.0;
  auto probe = TinyModel(3);
  std::vector<Sample> on_policy = FourGroupsOfFour();
  SetBehaviourLogProbs(*probe, on_policy, 0.0f);
  std::vector<Sample> stale = on_policy, kept = on_policy;
  for (size_t i = 8; i < on_policy.size(); ++i) {
    for (float& lp : stale[i].behaviour_logp) lp -= std::log(4.0f);
    kept[i].excluded = true;
  }
  TrainStats plain_stats, kept_stats, trunc_stats, mask_stats;
  const auto plain = GradsAfterStep(c, on_policy, &plain_stats);
  const auto g01_alone = GradsAfterStep(c, kept, &kept_stats);
  const double n = static_cast<double>(plain_stats.tokens);
  const double n01 = static_cast<double>(kept_stats.tokens);
  ASSERT_GT(n, n01);
  c.algorithm.behaviour_weight_mode = BehaviourWeightMode::kTruncate;
  const auto trunc = GradsAfterStep(c, stale, &trunc_stats);
  c.algorithm.behaviour_weight_mode = BehaviourWeightMode::kMask;
  const auto masked = GradsAfterStep(c, stale, &mask_stats);
  double trunc_vs_mask = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const at::Tensor g01 = g01_alone[i] * (n01 / n);
    const at::Tensor g23 = plain[i] - g01;
    EXPECT_TRUE(torch::allclose(masked[i], g01, 1e-4, 1e-6))
        << i << " max diff " << (masked[i] - g01).abs().max().item<double>();
    EXPECT_TRUE(torch::allclose(trunc[i], g01 + 2 * g23, 1e-4, 1e-6))
        << i << " max diff "
        << (trunc[i] - g01 - 2 * g23).abs().max().item<double>();
    trunc_vs_mask += (trunc[i] - masked[i]).abs().sum().item<double>();
  }
  EXPECT_GT(trunc_vs_mask, 1e-3);
  // Both modes count the same capped tokens; the mean weight is as applied.
  EXPECT_NEAR(trunc_stats.behaviour_weight_truncated, (n - n01) / n, 1e-6);
  EXPECT_NEAR(mask_stats.behaviour_weight_truncated, (n - n01) / n, 1e-6);
  EXPECT_NEAR(trunc_stats.behaviour_weight_mean, (n01 + 2 * (n - n01)) / n,
              1e-5);
  EXPECT_NEAR(mask_stats.behaviour_weight_mean, n01 / n, 1e-5);
  EXPECT_EQ(mask_stats.tokens, trunc_stats.tokens);
}

// The KL penalty of kl_mode reward is taken from the proximal log-probs
// (the trainer's weights at the step's start), not from the behaviour
// log-probs the samples carry. The reference is a frozen copy of the
// policy, so the proximal policy's KL to it is 0: the step must equal one
// without KL, however unevenly stale the behaviour log-probs are. Taken
// from the behaviour log-probs, k1 = behaviour - reference = -0.1 * k per
// token of response k of a group would raise the rewards unevenly and
// change the advantages.
TEST(TrainerTest, RewardKlPenaltyFollowsTheProximalPolicy) {
  JobConfig c = TinyJob();
  c.algorithm.decoupled_loss = true;
  c.algorithm.kl_mode = KlMode::kReward;
  c.algorithm.kl_estimator = KlEstimator::kK1;
  auto probe = TinyModel(3);
  std::vector<Sample> samples = FourGroupsOfFour();
  SetBehaviourLogProbs(*probe, samples, 0.0f);
  for (size_t i = 0; i < samples.size(); ++i) {
    for (float& lp : samples[i].behaviour_logp) lp -= 0.1f * (i % 4);
  }
  auto run = [&](double kl_coef, TrainStats* stats) {
    JobConfig cc = c;
    cc.algorithm.kl_coef = kl_coef;
    auto model = TinyModel(3);
    auto reference = model->CloneFrozen();
    auto trainer =
        Trainer::Create(*model, kl_coef > 0 ? reference.get() : nullptr, cc,
                        kPad)
            .value();
    *stats = trainer->Step(samples).value();
    std::vector<at::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  TrainStats with_kl, without_kl;
  const auto a = run(1.0, &with_kl);
  const auto b = run(0.0, &without_kl);
  EXPECT_NEAR(with_kl.advantage_abs_mean, without_kl.advantage_abs_mean, 1e-9);
  EXPECT_NEAR(with_kl.kl, 0.0, 1e-6);
  EXPECT_GT(with_kl.advantage_abs_mean, 0.1);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-4, 1e-6))
        << i << " max diff " << (a[i] - b[i]).abs().max().item<double>();
  }
}

std::vector<at::Tensor> CloneParameters(PolicyModel& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool SameParameters(PolicyModel& model, const std::vector<at::Tensor>& ref) {
  const auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!torch::equal(params[i], ref[i])) return false;
  }
  return true;
}

// A mini-batch whose samples are all excluded takes no optimizer step: the
// weights stay bit-identical although weight decay and the Adam moments of
// earlier steps would move them in a step on zero gradients, and the
// warm-up schedule does not advance.
TEST(TrainerTest, MiniBatchWithEverySampleExcludedTakesNoStep) {
  JobConfig c = TinyJob();
  c.optim.weight_decay = 0.1;
  c.optim.warmup_steps = 4;
  c.optim.mini_batch_size = 8;
  auto model = TinyModel(3);
  auto trainer = Trainer::Create(*model, nullptr, c, kPad).value();
  EXPECT_EQ(trainer->Step(FourGroupsOfFour()).value().optimizer_steps, 2);
  const auto before = CloneParameters(*model);
  const std::string optimizer_before = trainer->OptimizerState().value();

  std::vector<Sample> none = FourGroupsOfFour();
  for (Sample& s : none) s.excluded = true;
  const TrainStats skipped = trainer->Step(none).value();
  EXPECT_EQ(skipped.optimizer_steps, 0);
  EXPECT_EQ(skipped.tokens, 0);
  EXPECT_EQ(trainer->version(), 2);  // the version still advances
  EXPECT_TRUE(SameParameters(*model, before));
  EXPECT_EQ(trainer->OptimizerState().value(), optimizer_before);

  // Groups 0 and 1 excluded: the first mini-batch is skipped, the second
  // trains with the learning rate of the third optimizer step.
  std::vector<Sample> half = FourGroupsOfFour();
  for (size_t i = 0; i < 8; ++i) half[i].excluded = true;
  const TrainStats one = trainer->Step(half).value();
  EXPECT_EQ(one.optimizer_steps, 1);
  EXPECT_DOUBLE_EQ(one.lr, LearningRateAt(c.optim, 2));
  EXPECT_FALSE(SameParameters(*model, before));
}

// A GradientSync whose sums stay local, as a super node's under StaleSync
// clock skew, and whose gradient exchange adds `peer_update` to every
// gradient (a peer's update arriving), in the spirit of hier_sync.
class FakeSkewedSync : public GradientSync {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status AllReduceSum(std::vector<at::Tensor>&) override {
    return absl::OkStatus();
  }
  bool ExchangesGradients() const override { return true; }
  absl::Status ReduceGradients(std::vector<at::Tensor>& grads) override {
    ++exchanges;
    for (at::Tensor& g : grads) g.add_(peer_update);
    return absl::OkStatus();
  }
  double peer_update = 0;
  int exchanges = 0;
};

// With gradients exchanged an all-excluded mini-batch still joins the
// exchange (the peers' protocol counts on it) and steps only if a peer's
// update arrived.
TEST(TrainerTest, ExcludedMiniBatchStillJoinsTheGradientExchange) {
  JobConfig c = TinyJob();
  c.optim.weight_decay = 0.1;
  FakeSkewedSync sync;
  auto model = TinyModel(3);
  auto trainer = Trainer::Create(*model, nullptr, c, kPad, &sync).value();
  std::vector<Sample> none = FourGroupsOfFour();
  for (Sample& s : none) s.excluded = true;
  const auto before = CloneParameters(*model);
  EXPECT_EQ(trainer->Step(none).value().optimizer_steps, 0);
  EXPECT_EQ(sync.exchanges, 1);
  EXPECT_TRUE(SameParameters(*model, before));
  sync.peer_update = 1e-3;
  EXPECT_EQ(trainer->Step(none).value().optimizer_steps, 1);
  EXPECT_EQ(sync.exchanges, 2);
  EXPECT_FALSE(SameParameters(*model, before));
}

}  // namespace
}  // namespace fusionrl

namespace fusionrl {
namespace {

// Two data-parallel ranks (threads, c10d Gloo) each train on half of the
// groups: their weights stay identical, and their summed gradient is the one
// a single trainer computes on the whole batch.
// algorithm.rollout_correction weighs each token by pi_trainer / pi_rollout
// against the trainer's recomputed log-probs: groups 0-1 on-policy (weight
// 1), groups 2-3 with rollout log-probs log(4) off (weight 4, or 1/4).
//   tis (cap 2): weight 4 -> 2, weight 1/4 stays 1/4;
//   mis (cap 2): both 4 and 1/4 leave [1/2, 2] and are masked.
// The per-token mismatch is reported as |delta log p|.
TEST(TrainerTest, RolloutCorrectionTruncatesOrMasksBothTails) {
  JobConfig c = TinyJob();
  auto probe = TinyModel(3);
  std::vector<Sample> on_policy = FourGroupsOfFour();
  SetBehaviourLogProbs(*probe, on_policy, 0.0f);
  std::vector<Sample> kept = on_policy, over = on_policy, under = on_policy;
  for (size_t i = 8; i < on_policy.size(); ++i) {
    for (float& lp : over[i].behaviour_logp) lp -= std::log(4.0f);
    for (float& lp : under[i].behaviour_logp) lp += std::log(4.0f);
    kept[i].excluded = true;
  }
  TrainStats plain_stats, kept_stats, st;
  const auto plain = GradsAfterStep(c, on_policy, &plain_stats);
  EXPECT_NEAR(plain_stats.logp_diff_max, 0.0, 1e-5);
  const auto g01_alone = GradsAfterStep(c, kept, &kept_stats);
  const double n = static_cast<double>(plain_stats.tokens);
  const double n01 = static_cast<double>(kept_stats.tokens);
  ASSERT_GT(n, n01);
  auto expect_grads = [&](const std::vector<at::Tensor>& got, double w23,
                          const char* what) {
    for (size_t i = 0; i < plain.size(); ++i) {
      const at::Tensor g01 = g01_alone[i] * (n01 / n);
      const at::Tensor want = g01 + w23 * (plain[i] - g01);
      EXPECT_TRUE(torch::allclose(got[i], want, 1e-4, 1e-6))
          << what << " parameter " << i << " max diff "
          << (got[i] - want).abs().max().item<double>();
    }
  };
  c.algorithm.rollout_correction_cap = 2.0;
  c.algorithm.rollout_correction = RolloutCorrection::kTis;
  expect_grads(GradsAfterStep(c, over, &st), 2.0, "tis over");
  EXPECT_NEAR(st.behaviour_weight_truncated, (n - n01) / n, 1e-6);
  EXPECT_NEAR(st.logp_diff_mean, std::log(4.0) * (n - n01) / n, 1e-4);
  EXPECT_NEAR(st.logp_diff_max, std::log(4.0), 1e-4);
  expect_grads(GradsAfterStep(c, under, &st), 0.25, "tis under");
  EXPECT_EQ(st.behaviour_weight_truncated, 0.0);
  c.algorithm.rollout_correction = RolloutCorrection::kMis;
  expect_grads(GradsAfterStep(c, over, &st), 0.0, "mis over");
  EXPECT_NEAR(st.behaviour_weight_truncated, (n - n01) / n, 1e-6);
  expect_grads(GradsAfterStep(c, under, &st), 0.0, "mis under");
  EXPECT_NEAR(st.behaviour_weight_truncated, (n - n01) / n, 1e-6);
  // Without a correction the PPO ratio is taken against the rollout's
  // log-probs: none of the above.
  c.algorithm.rollout_correction = RolloutCorrection::kNone;
  const auto uncorrected = GradsAfterStep(c, over, &st);
  double diff = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const at::Tensor g01 = g01_alone[i] * (n01 / n);
    diff += (uncorrected[i] - (g01 + 2.0 * (plain[i] - g01)))
                .abs()
                .sum()
                .item<double>();
  }
  EXPECT_GT(diff, 1e-3);
}

// Samples 8..15 marked cut at the cap (finished = false), the others
// finished.
std::vector<Sample> HalfCutAtTheCap() {
  std::vector<Sample> s = FourGroupsOfFour();
  for (size_t i = 0; i < s.size(); ++i) s[i].finished = i < 8 || i % 2 == 0;
  return s;
}

// rollout.overlong mask: a cut response leaves the loss (its tokens and
// log-probs change nothing) but keeps its reward in its group's baseline
// (its reward changes every other member's advantage). The old rule, which
// scored masked samples 0 in their group, passed the first half and failed
// the second.
TEST(TrainerTest, OverlongMaskDropsCutResponsesFromTheLossOnly) {
  JobConfig c = TinyJob();
  std::vector<Sample> samples = HalfCutAtTheCap();
  TrainStats keep_stats, mask_stats, other_stats;
  const auto keep = GradsAfterStep(c, samples, &keep_stats);
  EXPECT_DOUBLE_EQ(keep_stats.overlong_frac, 0.25);
  c.rollout.overlong = OverlongMode::kMask;
  const auto masked = GradsAfterStep(c, samples, &mask_stats);
  EXPECT_LT(mask_stats.tokens, keep_stats.tokens);
  std::vector<Sample> other_tokens = samples, other_rewards = samples;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].finished) continue;
    for (float& lp : other_tokens[i].behaviour_logp) lp -= 0.7f;
    other_rewards[i].reward += 1.0;
  }
  const auto tokens_changed = GradsAfterStep(c, other_tokens, &other_stats);
  const auto rewards_changed = GradsAfterStep(c, other_rewards, &other_stats);
  double keep_vs_mask = 0, reward_effect = 0;
  for (size_t i = 0; i < keep.size(); ++i) {
    EXPECT_TRUE(torch::allclose(masked[i], tokens_changed[i], 1e-5, 1e-7))
        << "parameter " << i;
    keep_vs_mask += (keep[i] - masked[i]).abs().sum().item<double>();
    reward_effect += (rewards_changed[i] - masked[i]).abs().sum().item<double>();
  }
  EXPECT_GT(keep_vs_mask, 1e-4);
  EXPECT_GT(reward_effect, 1e-4)
      << "a masked sample's reward must count in its group's baseline";
}

// rollout.overlong penalize: the step is the keep step on rewards lowered by
// DAPO's length ramp (max_new_tokens 6, buffer 3: lengths 4, 5, 6 lose 1/3,
// 2/3, 1 of overlong_penalty).
TEST(TrainerTest, OverlongPenaltyLowersRewardsOnTheLengthRamp) {
  EXPECT_DOUBLE_EQ(algo::OverlongPenalty(3, 6, 3, 0.9), 0.0);
  EXPECT_DOUBLE_EQ(algo::OverlongPenalty(4, 6, 3, 0.9), 0.3);
  EXPECT_DOUBLE_EQ(algo::OverlongPenalty(6, 6, 3, 0.9), 0.9);
  EXPECT_EQ(algo::OverlongBuffer(20480, 0), 4096);
  EXPECT_EQ(algo::OverlongBuffer(3, 0), 1);
  EXPECT_EQ(algo::OverlongBuffer(64, 7), 7);
  JobConfig c = TinyJob();
  c.rollout.max_new_tokens = 6;
  c.rollout.overlong_buffer = 3;
  c.rollout.overlong_penalty = 0.9;
  std::vector<Sample> samples = FourGroupsOfFour();
  std::vector<Sample> lowered = samples;
  double penalty_sum = 0;
  for (Sample& s : lowered) {
    const double p = algo::OverlongPenalty(
        static_cast<int64_t>(s.response_ids.size()), 6, 3, 0.9);
    s.reward -= p;
    penalty_sum += p;
  }
  ASSERT_GT(penalty_sum, 0.5);
  TrainStats penalized_stats, lowered_stats, keep_stats;
  const auto keep = GradsAfterStep(c, samples, &keep_stats);
  c.rollout.overlong = OverlongMode::kPenalize;
  const auto penalized = GradsAfterStep(c, samples, &penalized_stats);
  EXPECT_NEAR(penalized_stats.overlong_penalty_mean, penalty_sum / 16, 1e-12);
  c.rollout.overlong = OverlongMode::kKeep;
  const auto by_hand = GradsAfterStep(c, lowered, &lowered_stats);
  double keep_vs_penalized = 0;
  for (size_t i = 0; i < keep.size(); ++i) {
    EXPECT_TRUE(torch::allclose(penalized[i], by_hand[i], 1e-5, 1e-7))
        << "parameter " << i;
    keep_vs_penalized += (keep[i] - penalized[i]).abs().sum().item<double>();
  }
  EXPECT_GT(keep_vs_penalized, 1e-4);
}

// bf16 training keeps float32 master weights: at a learning rate of 1e-6 a
// bf16 policy's weights move as a float32 policy's do (stepping the bf16
// parameters directly, every update below half a bf16 ulp, ~1e-4 here,
// would vanish), and the bf16 parameters are the masters rounded.
TEST(TrainerTest, Bf16PolicyTrainsFloat32MasterWeights) {
  JobConfig c = TinyJob();
  c.optim.lr = 1e-6;
  std::vector<Sample> samples = FourGroupsOfFour();
  auto delta_after_steps = [&](const std::string& dtype,
                               std::vector<at::Tensor>* params_out) {
    JobConfig job = c;
    job.model.dtype = dtype;
    auto model = PolicyModel::Create(job.model, 98, kCpu, 3).value();
    std::vector<at::Tensor> before;
    for (const auto& p : model->parameters()) {
      before.push_back(p.detach().to(at::kFloat).clone());
    }
    auto trainer = Trainer::Create(*model, nullptr, job, kPad).value();
    for (int step = 0; step < 3; ++step) {
      EXPECT_TRUE(trainer->Step(samples).ok());
    }
    const auto& stepped = trainer->master_weights().stepped();
    std::vector<at::Tensor> delta;
    for (size_t i = 0; i < before.size(); ++i) {
      delta.push_back((stepped[i].detach() - before[i]).flatten());
    }
    if (params_out != nullptr) *params_out = model->parameters();
    for (size_t i = 0; i < stepped.size(); ++i) {
      EXPECT_EQ(stepped[i].scalar_type(), at::kFloat);
    }
    return at::cat(delta);
  };
  std::vector<at::Tensor> bf16_params;
  const at::Tensor d32 = delta_after_steps("float32", nullptr);
  const at::Tensor d16 = delta_after_steps("bfloat16", &bf16_params);
  const double n32 = d32.norm().item<double>();
  const double n16 = d16.norm().item<double>();
  const double cosine = (d32 * d16).sum().item<double>() / (n32 * n16 + 1e-30);
  ASSERT_GT(n32, 0.0);
  RecordProperty("update_norm_ratio", std::to_string(n16 / n32));
  RecordProperty("update_cosine", std::to_string(cosine));
  EXPECT_NEAR(n16 / n32, 1.0, 0.1) << "float32 " << n32 << " bf16 " << n16;
  EXPECT_GT(cosine, 0.9);
  for (const at::Tensor& p : bf16_params) {
    EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  }
}

// The masters are part of the optimizer state (checkpoints, step
// snapshots), and a parameter written from outside between steps (a weight
// sync) is re-read into its master instead of being undone.
TEST(TrainerTest, MasterWeightsTravelWithTheOptimizerStateAndFollowWrites) {
  JobConfig c = TinyJob();
  c.optim.lr = 1e-6;
  c.model.dtype = "bfloat16";
  std::vector<Sample> samples = FourGroupsOfFour();
  auto model = PolicyModel::Create(c.model, 98, kCpu, 3).value();
  auto trainer = Trainer::Create(*model, nullptr, c, kPad).value();
  ASSERT_TRUE(trainer->master_weights().has_masters());
  ASSERT_TRUE(trainer->Step(samples).ok());
  const std::string state = trainer->OptimizerState().value();
  std::vector<at::Tensor> masters;
  for (const auto& m : trainer->master_weights().stepped()) {
    masters.push_back(m.detach().clone());
  }
  auto twin = PolicyModel::Create(c.model, 98, kCpu, 3).value();
  {
    at::NoGradGuard no_grad;
    auto src = model->parameters();
    auto dst = twin->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  auto restored = Trainer::Create(*twin, nullptr, c, kPad).value();
  ASSERT_TRUE(restored->RestoreOptimizerState(state).ok());
  const auto& got = restored->master_weights().stepped();
  bool some_master_below_bf16 = false;
  for (size_t i = 0; i < masters.size(); ++i) {
    EXPECT_TRUE(at::equal(got[i].detach(), masters[i])) << "master " << i;
    some_master_below_bf16 =
        some_master_below_bf16 ||
        !at::equal(masters[i], masters[i].to(at::kBFloat16).to(at::kFloat));
  }
  EXPECT_TRUE(some_master_below_bf16);  // the restore carried real bits
  // A weight sync writes the parameters: the next step starts from them.
  {
    at::NoGradGuard no_grad;
    for (auto& p : twin->parameters()) p.fill_(0.5);
  }
  restored->master_weights().GradientsToMasters();
  for (const auto& m : restored->master_weights().stepped()) {
    EXPECT_TRUE(at::equal(m.detach(), at::full_like(m.detach(), 0.5)));
  }
}

TEST(TrainerDataParallelTest, RanksMatchOneTrainerOnTheWholeBatch) {
  JobConfig c = TinyJob();
  c.algorithm.loss_agg_mode = LossAggMode::kSeqMeanTokenSumNorm;
  c.optim.grad_clip = 1.0;
  const std::vector<Sample> all = FourGroupsOfFour();
  const std::vector<Sample> shard0(all.begin(), all.begin() + 8);
  const std::vector<Sample> shard1(all.begin() + 8, all.end());

  auto single_model = TinyModel(3);
  auto single = Trainer::Create(*single_model, nullptr, c, kPad).value();
  ASSERT_TRUE(single->Step(all).ok());

  auto group = MakeLocalGlooGroup(2, absl::Seconds(60));
  ASSERT_TRUE(group.ok()) << group.status();
  std::vector<std::unique_ptr<PolicyModel>> models;
  models.push_back(TinyModel(3));
  models.push_back(TinyModel(3));
  std::vector<absl::Status> results(2);
  std::vector<std::vector<torch::Tensor>> first_grads(2);
  auto run_rank = [&](int r) {
    auto trainer =
        Trainer::Create(*models[r], nullptr, c, kPad, (*group)[r].get())
            .value();
    const auto& shard = r == 0 ? shard0 : shard1;
    results[r] = trainer->Step(shard).status();
    if (!results[r].ok()) return;
    for (auto& p : models[r]->parameters()) {
      first_grads[r].push_back(p.grad().clone());
    }
    results[r] = trainer->Step(shard).status();  // a second step: Adam state
  };
  std::thread t0(run_rank, 0), t1(run_rank, 1);
  t0.join();
  t1.join();
  ASSERT_TRUE(results[0].ok()) << results[0];
  ASSERT_TRUE(results[1].ok()) << results[1];

  auto p0 = models[0]->parameters(), p1 = models[1]->parameters();
  auto ps = single_model->parameters();
  for (size_t i = 0; i < p0.size(); ++i) {
    EXPECT_TRUE(torch::equal(p0[i], p1[i])) << "ranks diverged at param " << i;
    EXPECT_TRUE(torch::allclose(first_grads[0][i], ps[i].grad(), 1e-4, 1e-7))
        << "param " << i << " max diff "
        << (first_grads[0][i] - ps[i].grad()).abs().max().item<double>();
  }
}

TEST(TrainerDataParallelTest, UnequalShardsAreRefusedOnEveryRank) {
  JobConfig c = TinyJob();
  auto group = MakeLocalGlooGroup(2, absl::Seconds(60)).value();
  auto all = FourGroupsOfFour();
  std::vector<absl::StatusCode> codes(2);
  auto run_rank = [&](int r) {
    auto model = TinyModel(3);
    auto trainer =
        Trainer::Create(*model, nullptr, c, kPad, group[r].get()).value();
    std::vector<Sample> shard(all.begin(), all.begin() + (r == 0 ? 4 : 12));
    codes[r] = trainer->Step(shard).status().code();
  };
  std::thread t0(run_rank, 0), t1(run_rank, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(codes[0], absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(codes[1], absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fusionrl
