#include "engine/train/algorithms.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace fusionrl::algo {
namespace {

constexpr BehaviourWeightMode kTruncate = BehaviourWeightMode::kTruncate;
constexpr BehaviourWeightMode kMask = BehaviourWeightMode::kMask;

constexpr AggMode kAllModes[] = {
    AggMode::kTokenMean, AggMode::kSeqMeanTokenMean, AggMode::kSeqMeanTokenSum,
    AggMode::kSeqMeanTokenSumNorm};
constexpr at::ScalarType kFloatTypes[] = {at::kFloat, at::kDouble};

// A tensor of `shape` holding `values` (row-major), in dtype `dtype`.
at::Tensor Make(const std::vector<double>& values, at::IntArrayRef shape,
                at::ScalarType dtype = at::kDouble) {
  return at::tensor(values, at::TensorOptions().dtype(at::kDouble))
      .reshape(shape)
      .to(dtype);
}

std::vector<double> ToVector(const at::Tensor& t) {
  const at::Tensor flat = t.detach().to(at::kDouble).contiguous().reshape(-1);
  const double* data = flat.data_ptr<double>();
  return std::vector<double>(data, data + flat.numel());
}

double Scalar(const at::Tensor& t) {
  EXPECT_EQ(t.dim(), 0) << "expected a scalar, got " << t.sizes();
  return t.detach().to(at::kDouble).item<double>();
}

// Tolerance matched to the dtype.
double Tol(at::ScalarType dtype) { return dtype == at::kFloat ? 1e-5 : 1e-10; }

void ExpectTensorNear(const at::Tensor& actual,
                      const std::vector<double>& expected, double tol) {
  const std::vector<double> got = ToVector(actual);
  ASSERT_EQ(got.size(), expected.size()) << "shape " << actual.sizes();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], tol) << "at flat index " << i;
  }
}

void ExpectAllFinite(const at::Tensor& t) {
  for (double v : ToVector(t)) EXPECT_TRUE(std::isfinite(v)) << v;
}

// ---------------------------------------------------------------- AggLoss

// loss = [[1,2,3],[4,5,6],[7,8,9]], mask = [[1,1,1],[1,0,0],[0,0,0]]:
// row sums of loss*mask: 6, 4, 0 (the last row has no valid token).
TEST(AlgorithmsTest, AggLossMatchesHandComputedForEachMode) {
  for (at::ScalarType dtype : kFloatTypes) {
    const at::Tensor loss = Make({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3}, dtype);
    const at::Tensor mask = Make({1, 1, 1, 1, 0, 0, 0, 0, 0}, {3, 3}, dtype);
    const double tol = Tol(dtype);
    // token-mean: (6 + 4) / 4 tokens = 2.5
    const at::Tensor token_mean = AggLoss(loss, mask, AggMode::kTokenMean);
    EXPECT_EQ(token_mean.scalar_type(), dtype);
    EXPECT_NEAR(Scalar(token_mean), 2.5, tol);
    // seq-mean-token-mean: (6/3 + 4/1 + 0) / 3 seqs = 6 / 3 = 2
    EXPECT_NEAR(Scalar(AggLoss(loss, mask, AggMode::kSeqMeanTokenMean)), 2.0,
                tol);
    // seq-mean-token-sum: (6 + 4 + 0) / 3 seqs = 10/3
    EXPECT_NEAR(Scalar(AggLoss(loss, mask, AggMode::kSeqMeanTokenSum)),
                10.0 / 3.0, tol);
    // seq-mean-token-sum-norm: 10 / (3 seqs * 3 max_len) = 10/9
    EXPECT_NEAR(Scalar(AggLoss(loss, mask, AggMode::kSeqMeanTokenSumNorm)),
                10.0 / 9.0, tol);
  }
}

TEST(AlgorithmsTest, AggLossUsesGivenNormInsteadOfMask) {
  const at::Tensor loss = Make({1, 2, 3, 4, 5, 6}, {2, 3});
  const at::Tensor mask = Make({1, 1, 1, 1, 0, 0}, {2, 3});
  // sum(loss*mask) = 6 + 4 = 10; per-seq means 2 and 4.
  const AggNorm norm{/*num_tokens=*/8, /*num_seqs=*/5, /*max_len=*/4};
  EXPECT_NEAR(Scalar(AggLoss(loss, mask, AggMode::kTokenMean, norm)),
              10.0 / 8.0, 1e-12);
  EXPECT_NEAR(Scalar(AggLoss(loss, mask, AggMode::kSeqMeanTokenMean, norm)),
              (2.0 + 4.0) / 5.0, 1e-12);
  EXPECT_NEAR(Scalar(AggLoss(loss, mask, AggMode::kSeqMeanTokenSum, norm)),
              10.0 / 5.0, 1e-12);
  EXPECT_NEAR(Scalar(AggLoss(loss, mask, AggMode::kSeqMeanTokenSumNorm, norm)),
              10.0 / (5.0 * 4.0), 1e-12);
  // Only num_seqs given: num_tokens (4) and max_len (3) come from the call.
  const AggNorm partial{0, 5, 0};
  EXPECT_NEAR(Scalar(AggLoss(loss, mask, AggMode::kTokenMean, partial)),
              10.0 / 4.0, 1e-12);
  EXPECT_NEAR(
      Scalar(AggLoss(loss, mask, AggMode::kSeqMeanTokenSumNorm, partial)),
      10.0 / (5.0 * 3.0), 1e-12);
}

TEST(AlgorithmsTest, AggLossOfFullyMaskedBatchIsZeroWithFiniteGrad) {
  const at::Tensor loss = Make({1, 2, 3, 4}, {2, 2}).requires_grad_();
  const at::Tensor mask = at::zeros({2, 2}, at::kDouble);
  for (AggMode mode : kAllModes) {
    const at::Tensor out = AggLoss(loss, mask, mode);
    EXPECT_EQ(Scalar(out), 0.0) << static_cast<int>(mode);
    const at::Tensor grad = torch::autograd::grad({out}, {loss})[0];
    ExpectTensorNear(grad, {0, 0, 0, 0}, 0.0);
  }
}

TEST(AlgorithmsTest, AggLossIgnoresNonFiniteValuesOnPadding) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const at::Tensor loss = Make({1, inf, 3, nan}, {2, 2}).requires_grad_();
  const at::Tensor mask = Make({1, 0, 1, 0}, {2, 2});
  for (AggMode mode : kAllModes) {
    const at::Tensor out = AggLoss(loss, mask, mode);
    EXPECT_TRUE(std::isfinite(Scalar(out))) << static_cast<int>(mode);
    ExpectAllFinite(torch::autograd::grad({out}, {loss})[0]);
  }
  // token-mean: (1 + 3) / 2 = 2
  EXPECT_NEAR(Scalar(AggLoss(loss, mask, AggMode::kTokenMean)), 2.0, 1e-12);
}

// Splitting a batch into micro-batches and passing the full batch's norm must
// reproduce the full-batch loss and gradient, for every mode.
TEST(AlgorithmsTest, AggLossMicroBatchesAddUpToFullBatchValuesAndGrads) {
  for (at::ScalarType dtype : kFloatTypes) {
    at::manual_seed(7);
    const at::Tensor base = at::randn({5, 6}, at::TensorOptions().dtype(dtype));
    // Valid lengths 6, 3, 0 (all masked), 1, 5.
    const at::Tensor mask = Make({1, 1, 1, 1, 1, 1,  //
                                  1, 1, 1, 0, 0, 0,  //
                                  0, 0, 0, 0, 0, 0,  //
                                  1, 0, 0, 0, 0, 0,  //
                                  1, 1, 1, 1, 1, 0},
                                 {5, 6}, dtype);
    const AggNorm full_norm{/*num_tokens=*/15, /*num_seqs=*/5, /*max_len=*/6};
    for (AggMode mode : kAllModes) {
      const at::Tensor full_in = base.clone().requires_grad_();
      const at::Tensor full = AggLoss(full_in, mask, mode);
      full.backward();

      const at::Tensor micro_in = base.clone().requires_grad_();
      // Uneven split: rows [0, 2) and [2, 5).
      const at::Tensor micro_sum =
          AggLoss(micro_in.slice(0, 0, 2), mask.slice(0, 0, 2), mode,
                  full_norm) +
          AggLoss(micro_in.slice(0, 2, 5), mask.slice(0, 2, 5), mode,
                  full_norm);
      micro_sum.backward();

      const double tol = Tol(dtype);
      EXPECT_NEAR(Scalar(micro_sum), Scalar(full), tol)
          << "mode " << static_cast<int>(mode);
      ExpectTensorNear(micro_in.grad(), ToVector(full_in.grad()), tol);
      // Not a tautology: a micro-batch with its own norm differs.
      const at::Tensor own_norm =
          AggLoss(base.slice(0, 0, 2), mask.slice(0, 0, 2), mode) +
          AggLoss(base.slice(0, 2, 5), mask.slice(0, 2, 5), mode);
      EXPECT_GT(std::abs(Scalar(own_norm) - Scalar(full)), 1e-3)
          << "mode " << static_cast<int>(mode);
    }
  }
}

// ---------------------------------------------------------------- GRPO

TEST(AlgorithmsTest, GrpoNormalizesByUnbiasedStdPerGroup) {
  for (at::ScalarType dtype : kFloatTypes) {
    const at::Tensor scores = Make({1, 0, 0, 1, 2, 4, 6, 8}, {8}, dtype);
    const at::Tensor adv = GrpoAdvantages(scores, 4, /*norm_by_std=*/true);
    EXPECT_EQ(adv.scalar_type(), dtype);
    // Group {1,0,0,1}: mean 0.5, unbiased std sqrt(4*0.25/3) = 0.57735027;
    //   +-0.5 / (0.57735027 + 1e-6) = +-0.866023904.
    // Group {2,4,6,8}: mean 5, std sqrt((9+1+1+9)/3) = 2.58198890;
    //   -3/(2.58198890+1e-6) = -1.161894554, -1/(..) = -0.387298185.
    ExpectTensorNear(
        adv,
        {0.866023903787, -0.866023903787, -0.866023903787, 0.866023903787,
         -1.16189455386, -0.387298184621, 0.387298184621, 1.16189455386},
        dtype == at::kFloat ? 1e-5 : 1e-9);
  }
}

TEST(AlgorithmsTest, DrGrpoOnlySubtractsGroupMean) {
  const at::Tensor scores = Make({1, 0, 0, 1, 2, 4, 6, 8}, {8});
  // Means 0.5 and 5.
  ExpectTensorNear(GrpoAdvantages(scores, 4, /*norm_by_std=*/false),
                   {0.5, -0.5, -0.5, 0.5, -3, -1, 1, 3}, 1e-12);
}

TEST(AlgorithmsTest, GrpoGroupOfOneUsesMeanZeroStdOne) {
  const at::Tensor scores = Make({0.7, -2}, {2});
  // 0.7 / (1 + 1e-6) = 0.699999300001; -2 / (1 + 1e-6) = -1.999998000002
  ExpectTensorNear(GrpoAdvantages(scores, 1, true),
                   {0.699999300001, -1.999998000002}, 1e-11);
  ExpectTensorNear(GrpoAdvantages(scores, 1, false), {0.7, -2}, 1e-12);
}

TEST(AlgorithmsTest, GrpoEqualScoresInGroupGiveZeroNotNaN) {
  for (at::ScalarType dtype : kFloatTypes) {
    // Group {3,3,3} all equal (std 0); group {0,2,1} (below).
    const at::Tensor scores = Make({3, 3, 3, 0, 2, 1}, {6}, dtype);
    const at::Tensor adv = GrpoAdvantages(scores, 3, true);
    ExpectAllFinite(adv);
    // Group {0,2,1}: mean 1, unbiased std sqrt((1+1+0)/2) = 1;
    //   -1/(1+1e-6) = -0.999999, 1/(1+1e-6) = 0.999999, 0.
    ExpectTensorNear(adv, {0, 0, 0, -0.999999000001, 0.999999000001, 0},
                     Tol(dtype));
  }
}

TEST(AlgorithmsTest, GrpoRejectsBatchNotMultipleOfGroupSize) {
  const at::Tensor scores = Make({1, 2, 3, 4, 5}, {5});
  EXPECT_THROW(GrpoAdvantages(scores, 2, true), c10::Error);
  EXPECT_THROW(RlooAdvantages(scores, 2), c10::Error);
  EXPECT_THROW(GrpoAdvantages(scores, 0, true), c10::Error);
}

// ---------------------------------------------------------------- RLOO

TEST(AlgorithmsTest, RlooSubtractsMeanOfOtherResponses) {
  const at::Tensor scores = Make({1, 0, 0, 1, 2, 4, 6, 8}, {8});
  // Group {1,0,0,1}: 1 - (0+0+1)/3 = 2/3, 0 - (1+0+1)/3 = -2/3.
  // Group {2,4,6,8} (sum 20): 2 - 18/3 = -4, 4 - 16/3 = -4/3,
  //   6 - 14/3 = 4/3, 8 - 12/3 = 4.
  ExpectTensorNear(
      RlooAdvantages(scores, 4),
      {2.0 / 3, -2.0 / 3, -2.0 / 3, 2.0 / 3, -4, -4.0 / 3, 4.0 / 3, 4}, 1e-12);
}

TEST(AlgorithmsTest, RlooGroupOfOneGetsZeroAndGroupOfTwoIsDifference) {
  ExpectTensorNear(RlooAdvantages(Make({5, -1}, {2}), 1), {0, 0}, 0.0);
  // Pairs: a - b and b - a.
  ExpectTensorNear(RlooAdvantages(Make({5, -1, 2, 2}, {4}), 2), {6, -6, 0, 0},
                   1e-12);
}

// ---------------------------------------------------------------- whitening

TEST(AlgorithmsTest, MaskedWhitenMatchesHandComputed) {
  for (at::ScalarType dtype : kFloatTypes) {
    const at::Tensor values = Make({1, 2, 3, 4, 100, -50}, {2, 3}, dtype);
    const at::Tensor mask = Make({1, 1, 1, 1, 0, 0}, {2, 3}, dtype);
    // Valid {1,2,3,4}: mean 2.5, unbiased var (2.25+0.25+0.25+2.25)/3 = 5/3;
    // (x - 2.5) / sqrt(5/3 + 1e-8); padding -> 0.
    ExpectTensorNear(
        MaskedWhiten(values, mask),
        {-1.16189500038, -0.387298333459, 0.387298333459, 1.16189500038, 0, 0},
        dtype == at::kFloat ? 1e-5 : 1e-9);
  }
}

TEST(AlgorithmsTest, MaskedWhitenWithOneOrNoValidEntryIsZero) {
  const at::Tensor values = Make({3, 7}, {1, 2});
  ExpectTensorNear(MaskedWhiten(values, Make({1, 0}, {1, 2})), {0, 0}, 0.0);
  ExpectTensorNear(MaskedWhiten(values, Make({0, 0}, {1, 2})), {0, 0}, 0.0);
}

// ---------------------------------------------------------------- REINFORCE++

// Mean and unbiased variance over the mask, for the documented property.
void ExpectWhitened(const at::Tensor& adv, const at::Tensor& mask) {
  const std::vector<double> a = ToVector(adv);
  const std::vector<double> m = ToVector(mask);
  double n = 0, sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (m[i] == 0) {
      EXPECT_EQ(a[i], 0.0) << "padding at " << i;
      continue;
    }
    n += 1;
    sum += a[i];
  }
  const double mean = sum / n;
  double ss = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (m[i] != 0) ss += (a[i] - mean) * (a[i] - mean);
  }
  EXPECT_NEAR(mean, 0.0, 1e-6);
  EXPECT_NEAR(ss / (n - 1), 1.0, 1e-6);
}

TEST(AlgorithmsTest, ReinforcePlusPlusGammaOneMatchesHandComputed) {
  // Row 0: outcome 1 on the last token; row 1: -1 on its last valid token
  // (index 1) and a stray 5 on padding, which must be ignored.
  const at::Tensor rewards = Make({0, 0, 1, 0, -1, 5}, {2, 3});
  const at::Tensor mask = Make({1, 1, 1, 1, 1, 0}, {2, 3});
  const at::Tensor adv = ReinforcePlusPlusAdvantages(rewards, mask, mask, 1.0);
  // Returns: [[1,1,1],[-1,-1,pad]]; valid mean 0.2, unbiased var
  // (3*0.64 + 2*1.44)/4 = 1.2; 0.8/sqrt(1.2+1e-8) = 0.730296740,
  // -1.2/sqrt(1.2+1e-8) = -1.095445110.
  ExpectTensorNear(adv,
                   {0.730296740297, 0.730296740297, 0.730296740297,
                    -1.09544511045, -1.09544511045, 0},
                   1e-9);
  ExpectWhitened(adv, mask);
  // Same as whitening the hand-written returns.
  ExpectTensorNear(
      adv, ToVector(MaskedWhiten(Make({1, 1, 1, -1, -1, 0}, {2, 3}), mask)),
      1e-12);
}

TEST(AlgorithmsTest, ReinforcePlusPlusGammaHalfMatchesHandComputed) {
  const at::Tensor rewards = Make({0, 0, 1, 0, 2, 0}, {2, 3});
  const at::Tensor mask = Make({1, 1, 1, 1, 1, 0}, {2, 3});
  const at::Tensor adv = ReinforcePlusPlusAdvantages(rewards, mask, mask, 0.5);
  // Returns row 0: G2 = 1, G1 = 0.5, G0 = 0.25; row 1: G1 = 2, G0 = 1.
  // Valid {0.25, 0.5, 1, 1, 2}: mean 0.95, deviations -0.7, -0.45, 0.05,
  // 0.05, 1.05; unbiased var (0.49+0.2025+0.0025+0.0025+1.1025)/4 = 0.45.
  // adv = dev / sqrt(0.45 + 1e-8).
  ExpectTensorNear(adv,
                   {-1.04349837791, -0.670820385796, 0.0745355984218,
                    0.0745355984218, 1.56524756686, 0},
                   1e-9);
  ExpectWhitened(adv, mask);
  ExpectTensorNear(
      adv, ToVector(MaskedWhiten(Make({0.25, 0.5, 1, 1, 2, 0}, {2, 3}), mask)),
      1e-12);
}

TEST(AlgorithmsTest, ReinforcePlusPlusPassesTheReturnThroughEnvironmentTokens) {
  // Row 0 has an environment token at t=1 (a tool's answer, not trained):
  // the outcome at t=2 still reaches the policy's turn at t=0, undiscounted
  // by the environment token; row 1's padding after its episode (t=2)
  // resets the return, so the stray 7 there reaches nothing.
  const at::Tensor rewards = Make({0, 0, 1, 0, 2, 7}, {2, 3});
  const at::Tensor tokens = Make({1, 0, 1, 1, 1, 0}, {2, 3});
  const at::Tensor episode = Make({1, 1, 1, 1, 1, 0}, {2, 3});
  const at::Tensor adv =
      ReinforcePlusPlusAdvantages(rewards, tokens, episode, 1.0);
  // Returns: row 0 {1, (env), 1}; row 1 {2, 2, pad}. Valid {1, 1, 2, 2}:
  // mean 1.5, unbiased var 4 * 0.25 / 3 = 1/3; adv = dev / sqrt(1/3 + 1e-8).
  const double a = 0.5 / std::sqrt(1.0 / 3.0 + 1e-8);
  ExpectTensorNear(adv, {-a, 0, -a, a, a, 0}, 1e-12);
  // With gamma 0.5 the environment token does not discount: row 0 {0.5,
  // (env), 1}, not 0.25.
  const at::Tensor half =
      ReinforcePlusPlusAdvantages(rewards, tokens, episode, 0.5);
  ExpectTensorNear(
      half, ToVector(MaskedWhiten(Make({0.5, 0, 1, 1, 2, 0}, {2, 3}), tokens)),
      1e-12);
}

TEST(AlgorithmsTest, ReinforcePlusPlusIsWhitenedOnRandomBatch) {
  at::manual_seed(3);
  const at::Tensor rewards = at::randn({4, 7}, at::kDouble);
  const at::Tensor mask = Make({1, 1, 1, 1, 1, 1, 1,  //
                                1, 1, 1, 0, 0, 0, 0,  //
                                1, 1, 1, 1, 1, 0, 0,  //
                                1, 0, 0, 0, 0, 0, 0},
                               {4, 7});
  for (double gamma : {1.0, 0.9, 0.0}) {
    ExpectWhitened(ReinforcePlusPlusAdvantages(rewards, mask, mask, gamma),
                   mask);
  }
}

// ---------------------------------------------------------------- KL

TEST(AlgorithmsTest, KlEstimatorsMatchHandComputed) {
  for (at::ScalarType dtype : kFloatTypes) {
    const at::Tensor logp = Make({-1.0, -2.0, -0.5, -3.0}, {1, 4}, dtype);
    const at::Tensor ref = Make({-1.5, -1.0, -0.5, -1.0}, {1, 4}, dtype);
    const double tol = Tol(dtype);
    // k1 = logp - ref
    ExpectTensorNear(KlPenalty(logp, ref, KlEstimator::kK1),
                     {0.5, -1.0, 0.0, -2.0}, tol);
    // k2 = 0.5 * (logp - ref)^2
    ExpectTensorNear(KlPenalty(logp, ref, KlEstimator::kK2),
                     {0.125, 0.5, 0.0, 2.0}, tol);
    // k3 with x = ref - logp = {-0.5, 1, 0, 2}: exp(x) - x - 1 =
    // {e^-0.5 - 0.5 = 0.106530660, e - 2 = 0.718281828, 0, e^2 - 3 = 4.389056}
    ExpectTensorNear(KlPenalty(logp, ref, KlEstimator::kK3),
                     {0.106530659713, 0.718281828459, 0.0, 4.38905609893},
                     tol * 10);
  }
}

TEST(AlgorithmsTest, KlK3ClampsExtremeInputs) {
  const double inf = std::numeric_limits<double>::infinity();
  // x = ref - logp = {3, -11.5, +inf (logp = -inf), -inf (ref = -inf), 1000}.
  const at::Tensor logp = Make({0, 0, -inf, 0, -1000}, {5}).requires_grad_();
  const at::Tensor ref = Make({3, -11.5, 0, -inf, 0}, {5});
  const at::Tensor k3 = KlPenalty(logp, ref, KlEstimator::kK3);
  // e^3 - 4 = 16.09 -> 10; e^-11.5 + 10.5 = 10.50001 -> 10; x clamped to
  // 20: e^20 - 21 -> 10 (not NaN); x clamped to -20: 19.000000002 -> 10.
  ExpectTensorNear(k3, {10, 10, 10, 10, 10}, 0.0);
  // Clamped values carry no gradient, and none is NaN.
  const at::Tensor grad = torch::autograd::grad({k3.sum()}, {logp})[0];
  ExpectTensorNear(grad, {0, 0, 0, 0, 0}, 0.0);
  // Just inside the output clamp the value is unclamped: x = 2.5 ->
  // e^2.5 - 3.5 = 8.682493960703473.
  EXPECT_NEAR(
      Scalar(KlPenalty(Make({0}, {}), Make({2.5}, {}), KlEstimator::kK3)),
      8.682493960703473, 1e-12);
}

// ---------------------------------------------------------------- entropy

TEST(AlgorithmsTest, EntropyOfUniformLogitsIsLogV) {
  for (at::ScalarType dtype : kFloatTypes) {
    // Any constant row is uniform; log(5) = 1.6094379124341003.
    const at::Tensor logits =
        at::cat({at::zeros({1, 3, 5}, dtype), at::full({1, 3, 5}, 7.0, dtype)});
    const at::Tensor h = EntropyFromLogits(logits);
    ASSERT_EQ(h.sizes(), (std::vector<int64_t>{2, 3}));
    ExpectTensorNear(h, std::vector<double>(6, 1.6094379124341003), Tol(dtype));
  }
}

TEST(AlgorithmsTest, EntropyOfPeakedAndTwoPointDistributions) {
  // p = softmax(0, ln 3) = {0.25, 0.75}:
  // -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335144619.
  EXPECT_NEAR(Scalar(EntropyFromLogits(Make({0, std::log(3.0)}, {2}))),
              0.562335144619, 1e-11);
  // One-hot-ish: logits {100, 0, 0, 0} -> entropy ~ 3 * 101 * e^-100 ~ 0.
  const at::Tensor peaked = EntropyFromLogits(Make({100, 0, 0, 0}, {1, 4}));
  ExpectTensorNear(peaked, {0.0}, 1e-12);
  ExpectAllFinite(peaked);
}

// ---------------------------------------------------------------- PPO

struct PpoInputs {
  at::Tensor logp;  // requires grad
  at::Tensor old_logp;
  at::Tensor adv;
  at::Tensor mask;
};

// One row per call: ratio r_i = exp(logp - old_logp) is set by
// logp = old_logp + log(r_i).
PpoInputs MakePpoInputs(const std::vector<double>& ratios,
                        const std::vector<double>& advs,
                        const std::vector<double>& mask,
                        at::ScalarType dtype = at::kDouble) {
  const int64_t n = static_cast<int64_t>(ratios.size());
  std::vector<double> old(ratios.size()), cur(ratios.size());
  for (size_t i = 0; i < ratios.size(); ++i) {
    old[i] = -1.0 - 0.1 * static_cast<double>(i);
    cur[i] = old[i] + std::log(ratios[i]);
  }
  PpoInputs in;
  in.old_logp = Make(old, {1, n}, dtype);
  in.logp = Make(cur, {1, n}, dtype).requires_grad_();
  in.adv = Make(advs, {1, n}, dtype);
  in.mask = Make(mask, {1, n}, dtype);
  return in;
}

TEST(AlgorithmsTest, PpoLossInsideClipRangeIsMinusAdvTimesRatio) {
  for (at::ScalarType dtype : kFloatTypes) {
    // Ratios 1.1 and 0.9 are inside [0.8, 1.2].
    const PpoInputs in = MakePpoInputs({1.1, 0.9}, {2.0, -3.0}, {1, 1}, dtype);
    const PolicyLossResult r =
        PpoClipLoss(in.logp, in.old_logp, in.adv, in.mask, 0.2, 0.2, 3.0,
                    AggMode::kTokenMean);
    const double tol = Tol(dtype);
    // (-2 * 1.1 + 3 * 0.9) / 2 = (-2.2 + 2.7) / 2 = 0.25
    EXPECT_NEAR(Scalar(r.loss), 0.25, tol);
    EXPECT_EQ(r.loss.scalar_type(), dtype);
    EXPECT_NEAR(Scalar(r.clip_frac), 0.0, tol);
    EXPECT_NEAR(Scalar(r.dual_clip_frac), 0.0, tol);
    // d/dlogp = -A * ratio / num_tokens: -2.2/2 = -1.1, 2.7/2 = 1.35.
    const at::Tensor grad = torch::autograd::grad({r.loss}, {in.logp})[0];
    ExpectTensorNear(grad, {-1.1, 1.35}, tol);
  }
}

// Five valid tokens plus one padded (clip 0.2/0.2, clip_c 3):
//  t0 ratio 1.1, A=+2: inside        -> -2.2, grad -A*r/5 = -0.44
//  t1 ratio 1.5, A=+1: above 1.2     -> max(-1.5, -1.2) = -1.2 clipped, grad 0
//  t2 ratio 0.5, A=-1: below 0.8     -> max(0.5, 0.8) = 0.8 clipped, grad 0
//                      dual bound 3 > 0.8, inactive
//  t3 ratio 0.5, A=+1: below, A>0    -> max(-0.5, -0.8) = -0.5, grad -0.1
//  t4 ratio 10,  A=-1: l_clip = max(10, 1.2) = 10 (not clipped);
//                      dual: min(3, 10) = 3 active, grad 0
//  t5 padding (ratio 50, A=-7): ignored.
// loss = (-2.2 - 1.2 + 0.8 - 0.5 + 3) / 5 = -0.1 / 5 = -0.02
// clip_frac = 2/5, dual_clip_frac = 1/5,
// approx_kl = -(ln1.1 + ln1.5 + 2 ln0.5 + ln10)/5 = -0.283413203957
TEST(AlgorithmsTest, PpoLossClipsDualClipsAndReportsFractions) {
  for (at::ScalarType dtype : kFloatTypes) {
    const PpoInputs in =
        MakePpoInputs({1.1, 1.5, 0.5, 0.5, 10, 50}, {2, 1, -1, 1, -1, -7},
                      {1, 1, 1, 1, 1, 0}, dtype);
    const PolicyLossResult r =
        PpoClipLoss(in.logp, in.old_logp, in.adv, in.mask, 0.2, 0.2, 3.0,
                    AggMode::kTokenMean);
    const double tol = Tol(dtype);
    EXPECT_NEAR(Scalar(r.loss), -0.02, tol);
    EXPECT_NEAR(Scalar(r.clip_frac), 0.4, tol);
    EXPECT_NEAR(Scalar(r.dual_clip_frac), 0.2, tol);
    EXPECT_NEAR(Scalar(r.approx_kl), -0.283413203957, tol);
    EXPECT_FALSE(r.clip_frac.requires_grad());
    EXPECT_FALSE(r.dual_clip_frac.requires_grad());
    EXPECT_FALSE(r.approx_kl.requires_grad());
    const at::Tensor grad = torch::autograd::grad({r.loss}, {in.logp})[0];
    ExpectTensorNear(grad, {-0.44, 0, 0, -0.1, 0, 0}, tol);
  }
}

TEST(AlgorithmsTest, PpoLossAsymmetricClipUsesSeparateBounds) {
  // clip_low 0.2, clip_high 0.28: range [0.8, 1.28].
  //  ratio 1.25, A=+1: inside (would be clipped at 1.2)   -> -1.25
  //  ratio 1.3,  A=+1: above 1.28                         -> -1.28 clipped
  //  ratio 0.75, A=-1: below 0.8                          -> 0.8 clipped
  // loss = (-1.25 - 1.28 + 0.8) / 3 = -1.73/3 = -0.576666..., clip_frac 2/3.
  const PpoInputs in = MakePpoInputs({1.25, 1.3, 0.75}, {1, 1, -1}, {1, 1, 1});
  const PolicyLossResult r = PpoClipLoss(in.logp, in.old_logp, in.adv, in.mask,
                                         0.2, 0.28, 3.0, AggMode::kTokenMean);
  EXPECT_NEAR(Scalar(r.loss), -1.73 / 3.0, 1e-12);
  EXPECT_NEAR(Scalar(r.clip_frac), 2.0 / 3.0, 1e-12);
  const at::Tensor grad = torch::autograd::grad({r.loss}, {in.logp})[0];
  // Only the inside token has gradient: -1 * 1.25 / 3.
  ExpectTensorNear(grad, {-1.25 / 3.0, 0, 0}, 1e-12);

  // Swapped bounds (low 0.3, high 0.2): range [0.7, 1.2]:
  //  1.25 -> -1.2 clipped; 1.3 -> -1.2 clipped; 0.75 inside -> 0.75.
  // loss = (-1.2 - 1.2 + 0.75) / 3 = -0.55, clip_frac 2/3.
  const PolicyLossResult swapped =
      PpoClipLoss(in.logp, in.old_logp, in.adv, in.mask, 0.3, 0.2, 3.0,
                  AggMode::kTokenMean);
  EXPECT_NEAR(Scalar(swapped.loss), -0.55, 1e-12);
  EXPECT_NEAR(Scalar(swapped.clip_frac), 2.0 / 3.0, 1e-12);
}

TEST(AlgorithmsTest, PpoDualClipBoundsNegativeAdvantageWithHugeRatio) {
  // ratio 10, A = -2: l1 = 20, l2 = 2 * 1.2 = 2.4, l_clip = 20;
  // dual: min(-A * clip_c, 20) = min(6, 20) = 6.
  const PpoInputs in = MakePpoInputs({10}, {-2}, {1});
  const PolicyLossResult dual =
      PpoClipLoss(in.logp, in.old_logp, in.adv, in.mask, 0.2, 0.2, 3.0,
                  AggMode::kTokenMean);
  EXPECT_NEAR(Scalar(dual.loss), 6.0, 1e-12);
  EXPECT_NEAR(Scalar(dual.dual_clip_frac), 1.0, 1e-12);
  EXPECT_NEAR(Scalar(dual.clip_frac), 0.0, 1e-12);
  ExpectTensorNear(torch::autograd::grad({dual.loss}, {in.logp})[0], {0.0},
                   1e-12);

  // clip_c <= 1 disables the dual clip: loss = l_clip = 20, gradient
  // -A * ratio = 20.
  for (double clip_c : {1.0, 0.5, 0.0}) {
    const PolicyLossResult off =
        PpoClipLoss(in.logp, in.old_logp, in.adv, in.mask, 0.2, 0.2, clip_c,
                    AggMode::kTokenMean);
    EXPECT_NEAR(Scalar(off.loss), 20.0, 1e-10) << clip_c;
    EXPECT_EQ(Scalar(off.dual_clip_frac), 0.0) << clip_c;
    ExpectTensorNear(torch::autograd::grad({off.loss}, {in.logp})[0], {20.0},
                     1e-10);
  }

  // A positive advantage is never dual-clipped: ratio 10, A = +2 ->
  // max(-20, -2.4) = -2.4 (ordinary clip).
  const PpoInputs pos = MakePpoInputs({10}, {2}, {1});
  const PolicyLossResult p =
      PpoClipLoss(pos.logp, pos.old_logp, pos.adv, pos.mask, 0.2, 0.2, 3.0,
                  AggMode::kTokenMean);
  EXPECT_NEAR(Scalar(p.loss), -2.4, 1e-12);
  EXPECT_EQ(Scalar(p.dual_clip_frac), 0.0);
  EXPECT_NEAR(Scalar(p.clip_frac), 1.0, 1e-12);
}

TEST(AlgorithmsTest, PpoLossUsesAggModeAndNorm) {
  // Two rows, ratios inside the range so per-token loss = -A * ratio:
  // row 0: ratios {1.0, 1.1}, A {1, 1}   -> {-1, -1.1}, sum -2.1
  // row 1: ratios {0.9, pad}, A {2, 9}  -> {-1.8, pad}, sum -1.8
  std::vector<double> old = {-1, -2, -1.5, -3};
  std::vector<double> cur = {-1, -2 + std::log(1.1), -1.5 + std::log(0.9), 0};
  const at::Tensor old_logp = Make(old, {2, 2});
  const at::Tensor logp = Make(cur, {2, 2});
  const at::Tensor adv = Make({1, 1, 2, 9}, {2, 2});
  const at::Tensor mask = Make({1, 1, 1, 0}, {2, 2});
  // seq-mean-token-mean: (-2.1/2 + -1.8/1) / 2 = (-1.05 - 1.8) / 2 = -1.425
  EXPECT_NEAR(Scalar(PpoClipLoss(logp, old_logp, adv, mask, 0.2, 0.2, 3.0,
                                 AggMode::kSeqMeanTokenMean)
                         .loss),
              -1.425, 1e-12);
  // seq-mean-token-sum-norm with norm {num_seqs 4, max_len 5}:
  // (-2.1 - 1.8) / 20 = -0.195
  EXPECT_NEAR(Scalar(PpoClipLoss(logp, old_logp, adv, mask, 0.2, 0.2, 3.0,
                                 AggMode::kSeqMeanTokenSumNorm, {0, 4, 5})
                         .loss),
              -0.195, 1e-12);
}

TEST(AlgorithmsTest, PpoLossOfFullyMaskedBatchIsZero) {
  const PpoInputs in = MakePpoInputs({1.5, 0.2}, {1, -1}, {0, 0});
  const PolicyLossResult r = PpoClipLoss(in.logp, in.old_logp, in.adv, in.mask,
                                         0.2, 0.2, 3.0, AggMode::kTokenMean);
  EXPECT_EQ(Scalar(r.loss), 0.0);
  EXPECT_EQ(Scalar(r.clip_frac), 0.0);
  EXPECT_EQ(Scalar(r.dual_clip_frac), 0.0);
  EXPECT_EQ(Scalar(r.approx_kl), 0.0);
  ExpectTensorNear(torch::autograd::grad({r.loss}, {in.logp})[0], {0, 0}, 0.0);
}

// Behaviour weights by hand: d = prox - behaviour per token.
// row 0: d = {log 2, log 3} (both valid); row 1: d = {log 0.5, pad}.
TEST(AlgorithmsTest, BehaviourWeightsPerTokenAndPerSequenceWithTruncation) {
  const at::Tensor behaviour = Make({-2, -1, -3, -4}, {2, 2});
  const at::Tensor prox = Make(
      {-2 + std::log(2.0), -1 + std::log(3.0), -3 + std::log(0.5), -9}, {2, 2});
  const at::Tensor mask = Make({1, 1, 1, 0}, {2, 2});
  double truncated = -1;
  // Token level, cap 2.5: {2, min(3, 2.5)}, {0.5, 0 (pad)}; 1 of 3 capped.
  ExpectTensorNear(
      BehaviourWeights(prox, behaviour, mask,
                       {WeightLevel::kToken, 2.5, 0.0, kTruncate}, &truncated),
      {2, 2.5, 0.5, 0}, 1e-12);
  EXPECT_NEAR(truncated, 1.0 / 3, 1e-12);
  // Sequence level: row 0 exp(log 2 + log 3) = 6 -> capped at 5 on both
  // tokens; row 1 exp(log 0.5) = 0.5 (the padding's d is ignored).
  ExpectTensorNear(
      BehaviourWeights(prox, behaviour, mask,
                       {WeightLevel::kSequence, 5.0, 0.0, kTruncate},
                       &truncated),
      {5, 5, 0.5, 0}, 1e-12);
  EXPECT_NEAR(truncated, 2.0 / 3, 1e-12);
  // No staleness: every valid weight is exactly 1.
  ExpectTensorNear(
      BehaviourWeights(behaviour, behaviour, mask,
                       {WeightLevel::kSequence, 5.0, 0.0, kTruncate}),
      {1, 1, 1, 0}, 0.0);
}

// The same weights in mask mode (AReaL's behav_imp_weight_cap): a weight
// over the cap becomes 0 instead of the cap; with sequence level the whole
// sequence goes. The capped fraction counts the same tokens as truncation.
TEST(AlgorithmsTest, BehaviourWeightsMaskDropsWeightsOverTheCap) {
  const at::Tensor behaviour = Make({-2, -1, -3, -4}, {2, 2});
  const at::Tensor prox = Make(
      {-2 + std::log(2.0), -1 + std::log(3.0), -3 + std::log(0.5), -9}, {2, 2});
  const at::Tensor mask = Make({1, 1, 1, 0}, {2, 2});
  double capped = -1;
  // Token level, cap 2.5: {2, 3 -> dropped}, {0.5, 0 (pad)}; 1 of 3 capped.
  ExpectTensorNear(
      BehaviourWeights(prox, behaviour, mask,
                       {WeightLevel::kToken, 2.5, 0.0, kMask}, &capped),
      {2, 0, 0.5, 0}, 1e-12);
  EXPECT_NEAR(capped, 1.0 / 3, 1e-12);
  // Sequence level, cap 5: row 0's weight 6 drops both of its tokens.
  ExpectTensorNear(
      BehaviourWeights(prox, behaviour, mask,
                       {WeightLevel::kSequence, 5.0, 0.0, kMask}, &capped),
      {0, 0, 0.5, 0}, 1e-12);
  EXPECT_NEAR(capped, 2.0 / 3, 1e-12);
  // A cap above every weight changes nothing in either mode.
  for (BehaviourWeightMode mode : {kTruncate, kMask}) {
    ExpectTensorNear(
        BehaviourWeights(prox, behaviour, mask,
                         {WeightLevel::kToken, 10.0, 0.0, mode}, &capped),
        {2, 3, 0.5, 0}, 1e-12);
    EXPECT_EQ(capped, 0.0);
  }
  // A weight equal to the cap is not over it: with no staleness and cap 1,
  // nothing is truncated or masked.
  for (BehaviourWeightMode mode : {kTruncate, kMask}) {
    ExpectTensorNear(
        BehaviourWeights(behaviour, behaviour, mask,
                         {WeightLevel::kToken, 1.0, 0.0, mode}, &capped),
        {1, 1, 1, 0}, 0.0);
    EXPECT_EQ(capped, 0.0);
  }
  // MIS's floor (rollout_correction: mis, cap 2.5 -> floor 0.4) masks the
  // lower tail too: {2, 3 -> dropped}, {0.5, pad}, and 0.5 survives the
  // floor 0.4 but not 0.6. Truncation ignores the floor.
  ExpectTensorNear(
      BehaviourWeights(prox, behaviour, mask,
                       {WeightLevel::kToken, 2.5, 0.6, kMask}, &capped),
      {2, 0, 0, 0}, 1e-12);
  EXPECT_NEAR(capped, 2.0 / 3, 1e-12);
  ExpectTensorNear(
      BehaviourWeights(prox, behaviour, mask,
                       {WeightLevel::kToken, 2.5, 0.4, kMask}, &capped),
      {2, 0, 0.5, 0}, 1e-12);
  ExpectTensorNear(
      BehaviourWeights(prox, behaviour, mask,
                       {WeightLevel::kToken, 2.5, 0.6, kTruncate}, &capped),
      {2, 2.5, 0.5, 0}, 1e-12);
  EXPECT_NEAR(capped, 1.0 / 3, 1e-12);
}

// Truncate vs mask through the decoupled loss. Two valid tokens, A = 1,
// ratio logp / prox = 1.1 on both (inside the clip range); behaviour
// weights pi_prox / pi_behaviour = {2, 4}, cap 3.
//   truncate: w = {2, 3}: loss (-1.1 * 2 - 1.1 * 3) / 2 = -2.75,
//             d loss / d logp = -A * ratio * w / 2 = {-1.1, -1.65};
//   mask:     w = {2, 0}: loss (-1.1 * 2 + 0) / 2 = -1.1, and the masked
//             token gets exactly zero gradient. The masked token still
//             counts in the token-mean denominator (2, not 1), as in AReaL,
//             which divides by the count of the loss mask.
TEST(AlgorithmsTest, DecoupledLossTruncatesOrMasksTokensOverTheCap) {
  const at::Tensor prox = Make({-1, -2}, {1, 2});
  const at::Tensor behaviour =
      Make({-1 - std::log(2.0), -2 - std::log(4.0)}, {1, 2});
  const at::Tensor adv = Make({1, 1}, {1, 2});
  const at::Tensor mask = Make({1, 1}, {1, 2});
  struct Case {
    BehaviourWeightMode mode;
    double loss;
    std::vector<double> grad;
  };
  for (const Case& c : {Case{kTruncate, -2.75, {-1.1, -1.65}},
                        Case{kMask, -1.1, {-1.1, 0.0}}}) {
    SCOPED_TRACE(static_cast<int>(c.mode));
    const at::Tensor logp =
        Make({-1 + std::log(1.1), -2 + std::log(1.1)}, {1, 2}).requires_grad_();
    double capped = -1;
    const at::Tensor w =
        BehaviourWeights(prox, behaviour, mask,
                         {WeightLevel::kToken, 3.0, 0.0, c.mode}, &capped);
    EXPECT_NEAR(capped, 0.5, 1e-12);
    const PolicyLossResult r = PpoClipLoss(logp, prox, adv, mask, 0.2, 0.2, 3.0,
                                           AggMode::kTokenMean, {}, w);
    EXPECT_NEAR(Scalar(r.loss), c.loss, 1e-12);
    const at::Tensor grad = torch::autograd::grad({r.loss}, {logp})[0];
    ExpectTensorNear(grad, c.grad, 1e-12);
    if (c.mode == kMask) {
      EXPECT_EQ(ToVector(grad)[1], 0.0);  // exactly nothing from that token
    }
  }
}

// The decoupled loss by hand: ratio against the proximal log-probs, each
// token's clipped surrogate times its (constant) behaviour weight.
TEST(AlgorithmsTest, DecoupledPpoLossWeightsTheClippedSurrogate) {
  // Two valid tokens, A = {1, -1}; ratios logp/prox = {1.1, 1.5}.
  const at::Tensor prox = Make({-1, -2}, {1, 2});
  const at::Tensor logp =
      Make({-1 + std::log(1.1), -2 + std::log(1.5)}, {1, 2}).requires_grad_();
  const at::Tensor adv = Make({1, -1}, {1, 2});
  const at::Tensor mask = Make({1, 1}, {1, 2});
  const at::Tensor w = Make({2, 0.5}, {1, 2});
  // token 0: max(-1.1, -1.1) = -1.1 (ratio inside [0.8, 1.2]) -> * 2 = -2.2
  // token 1: A < 0, ratio 1.5: l1 = 1.5, l2 = 1.2 -> 1.5; dual min(3, 1.5)
  //          = 1.5 -> * 0.5 = 0.75.  token-mean: (-2.2 + 0.75) / 2 = -0.725
  const PolicyLossResult r = PpoClipLoss(logp, prox, adv, mask, 0.2, 0.2, 3.0,
                                         AggMode::kTokenMean, {}, w);
  EXPECT_NEAR(Scalar(r.loss), -0.725, 1e-12);
  // d loss / d logp_t = w_t * (-A_t * ratio_t) / 2 where unclipped:
  // token 0: 2 * -1.1 / 2 = -1.1; token 1: 0.5 * 1.5 / 2 = 0.375.
  ExpectTensorNear(torch::autograd::grad({r.loss}, {logp})[0], {-1.1, 0.375},
                   1e-12);
  // Weights of 1 give the plain PPO loss.
  const PolicyLossResult plain =
      PpoClipLoss(logp, prox, adv, mask, 0.2, 0.2, 3.0, AggMode::kTokenMean);
  const PolicyLossResult ones =
      PpoClipLoss(logp, prox, adv, mask, 0.2, 0.2, 3.0, AggMode::kTokenMean, {},
                  at::ones_like(w));
  EXPECT_EQ(Scalar(plain.loss), Scalar(ones.loss));
}

}  // namespace
}  // namespace fusionrl::algo
