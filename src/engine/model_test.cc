#include "engine/model.h"

#include <torch/types.h>

#include "engine/test_util.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using testing_util::TinyModel;

TEST(ModelTest, ForwardGivesLogitsForEveryPosition) {
  auto model = TinyModel();
  auto tokens = torch::randint(3, 98, {3, 5}, torch::kLong);
  auto valid = torch::ones({3, 5}, torch::kBool);
  auto logits = model->Forward(tokens, PositionsFromValid(valid), valid);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 5, 98}));
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
}

TEST(ModelTest, LeftPaddingDoesNotChangeLogits) {
  auto model = TinyModel();
  torch::NoGradGuard no_grad;
  auto seq = torch::tensor({{5, 9, 14, 20}}, torch::kLong);
  auto valid = torch::ones({1, 4}, torch::kBool);
  auto plain = model->Forward(seq, PositionsFromValid(valid), valid);
  auto padded_seq = torch::tensor({{0, 0, 5, 9, 14, 20}}, torch::kLong);
  auto padded_valid = torch::tensor({{false, false, true, true, true, true}});
  auto padded = model->Forward(padded_seq, PositionsFromValid(padded_valid),
                               padded_valid);
  EXPECT_TRUE(torch::allclose(padded.narrow(1, 2, 4), plain, 1e-5, 1e-5));
  EXPECT_TRUE(torch::isfinite(padded).all().item<bool>());  // pad rows too
}

TEST(ModelTest, CachedDecodingMatchesFullForward) {
  auto model = TinyModel();
  torch::NoGradGuard no_grad;
  // Two left-padded sequences of different lengths: prefill 4 slots, then
  // decode 5 tokens one at a time.
  auto tokens = torch::tensor(
      {{0, 0, 7, 8, 9, 10, 11, 12, 13}, {4, 5, 6, 7, 30, 31, 32, 33, 34}},
      torch::kLong);
  auto valid = tokens != 0;
  auto full = model->Forward(tokens, PositionsFromValid(valid), valid);

  KvCache cache = model->NewCache(2, 9);
  auto positions = PositionsFromValid(valid);
  auto pre =
      model->ForwardCached(tokens.narrow(1, 0, 4), positions.narrow(1, 0, 4),
                           valid.narrow(1, 0, 4), cache);
  EXPECT_TRUE(
      torch::allclose(pre.narrow(1, 2, 2), full.narrow(1, 2, 2), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(pre.select(0, 1),
                              full.select(0, 1).narrow(0, 0, 4), 1e-5, 1e-5));
  for (int64_t t = 4; t < 9; ++t) {
    auto step =
        model->ForwardCached(tokens.narrow(1, t, 1), positions.narrow(1, t, 1),
                             valid.narrow(1, 0, t + 1), cache);
    EXPECT_TRUE(torch::allclose(step.squeeze(1), full.select(1, t), 1e-5, 1e-5))
        << "slot " << t << " max diff "
        << (step.squeeze(1) - full.select(1, t)).abs().max().item<float>();
  }
  EXPECT_EQ(cache.length, 9);
}

TEST(ModelTest, InitIsDeterministicInSeed) {
  auto a = TinyModel(1), b = TinyModel(1), c = TinyModel(2);
  auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  bool all_equal_ab = true, all_equal_ac = true;
  for (size_t i = 0; i < pa.size(); ++i) {
    all_equal_ab &= torch::equal(pa[i], pb[i]);
    all_equal_ac &= torch::equal(pa[i], pc[i]);
  }
  EXPECT_TRUE(all_equal_ab);
  EXPECT_FALSE(all_equal_ac);
}

TEST(ModelTest, SaveLoadRoundTripsAndRejectsOtherShapes) {
  auto a = TinyModel(1), b = TinyModel(2);
  const std::string path = ::testing::TempDir() + "/model_test.pt";
  ASSERT_TRUE(a->Save(path).ok());
  ASSERT_TRUE(b->Load(path).ok());
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(torch::equal(pa[i], pb[i]));

  ModelConfig wider = testing_util::TinyModelConfig();
  wider.d_model = 64;
  auto c = PolicyModel::Create(wider, 98, c10::Device("cpu"), 3).value();
  absl::Status st = c->Load(path);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("shape"), std::string::npos) << st;

  EXPECT_EQ(b->Load(::testing::TempDir() + "/missing.pt").code(),
            absl::StatusCode::kDataLoss);
}

TEST(ModelTest, CloneFrozenCopiesWeightsWithoutGrad) {
  auto a = TinyModel(1);
  auto frozen = a->CloneFrozen();
  auto pa = a->parameters(), pf = frozen->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i], pf[i]));
    EXPECT_FALSE(pf[i].requires_grad());
  }
  // Independent storage: changing the original leaves the clone alone.
  {
    torch::NoGradGuard no_grad;
    pa[0].add_(1.0);
  }
  EXPECT_FALSE(torch::equal(pa[0], pf[0]));
}

}  // namespace
}  // namespace fusionrl
