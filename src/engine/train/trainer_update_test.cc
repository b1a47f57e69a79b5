// Trainer steps beyond the plain update: behaviour weights and rollout
// correction, the overlong rules, mini-batches that take no step, float32
// master weights and data-parallel ranks.
#include <torch/types.h>

#include <cmath>
#include <thread>
#include <vector>

#include "engine/collectives/grad_sync.h"
#include "engine/model/test_util.h"
#include "engine/train/algorithms.h"
#include "engine/train/master_weights.h"
#include "engine/train/trainer.h"
#include "engine/train/trainer_test_util.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using testing_util::TinyModel;
using trainer_testing::FourGroupsOfFour;
using trainer_testing::GradsAfterStep;
using trainer_testing::kCpu;
using trainer_testing::kPad;
using trainer_testing::SetBehaviourLogProbs;
using trainer_testing::TinyJob;

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
    reward_effect +=
        (rewards_changed[i] - masked[i]).abs().sum().item<double>();
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

// Two data-parallel ranks (threads, c10d Gloo) each train on half of the
// groups: their weights stay identical, and their summed gradient is the one
// a single trainer computes on the whole batch.
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
