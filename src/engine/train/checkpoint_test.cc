#include "engine/train/checkpoint.h"

#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <filesystem>
#include <vector>

#include "engine/model/test_util.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using testing_util::TinyModel;

TEST(CheckpointTest, WriteThenReadRestoresWeightsAndMeta) {
  const std::string dir = ::testing::TempDir() + "/ckpt_roundtrip";
  auto a = TinyModel(1);
  JobConfig c;
  c.model = testing_util::TinyModelConfig();
  auto trainer = Trainer::Create(*a, nullptr, c, 0).value();
  CheckpointMeta meta{"rl", "unit", 12, 12, 345};
  ASSERT_TRUE(WriteCheckpoint(dir, *a, trainer.get(), meta).ok());
  // Writing again replaces the old checkpoint and leaves no temp dirs.
  ASSERT_TRUE(WriteCheckpoint(dir, *a, trainer.get(), meta).ok());
  EXPECT_FALSE(std::filesystem::exists(dir + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir + ".old"));

  auto b = TinyModel(2);
  auto trainer_b = Trainer::Create(*b, nullptr, c, 0).value();
  auto read = ReadCheckpoint(dir, *b, trainer_b.get());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->kind, "rl");
  EXPECT_EQ(read->job_name, "unit");
  EXPECT_EQ(read->step, 12);
  EXPECT_EQ(read->policy_version, 12);
  EXPECT_EQ(read->data_cursor, 345u);
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(torch::equal(pa[i], pb[i]));
}

// Resuming (a trainer to restore) from a checkpoint without optimizer state
// is refused, naming the file, instead of silently restarting AdamW and the
// warm-up; the weights alone still load as an init checkpoint.
TEST(CheckpointTest, ResumeWithoutOptimizerStateIsRefused) {
  const std::string dir = ::testing::TempDir() + "/ckpt_no_optim";
  auto a = TinyModel(1);
  ASSERT_TRUE(
      WriteCheckpoint(dir, *a, nullptr, CheckpointMeta{"rl", "u", 3}).ok());
  JobConfig c;
  c.model = testing_util::TinyModelConfig();
  auto b = TinyModel(2);
  auto trainer_b = Trainer::Create(*b, nullptr, c, 0).value();
  auto read = ReadCheckpoint(dir, *b, trainer_b.get());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(read.status().message().find("optim.pt"), std::string::npos)
      << read.status();
  EXPECT_TRUE(ReadCheckpoint(dir, *b, nullptr).ok());
}

// Four groups of four samples of varied lengths and rewards; `salt` shifts
// the token ids so successive batches differ.
std::vector<Sample> Batch(int salt) {
  std::vector<Sample> out;
  for (int g = 0; g < 4; ++g) {
    for (int i = 0; i < 4; ++i) {
      Sample s;
      s.prompt_ids = {1, 40 + g + salt};
      for (int t = 0; t <= (g + i + salt) % 5; ++t) {
        s.response_ids.push_back(20 + g * 3 + i + t + salt);
      }
      s.response_ids.push_back(2);
      s.behaviour_logp.assign(s.response_ids.size(), -1.0f);
      s.reward = (i + g + salt) % 3 == 0 ? 1.0 : 0.0;
      out.push_back(std::move(s));
    }
  }
  return out;
}

// AdamW's per-parameter state: every parameter has one, with `steps` steps.
void ExpectAdamState(const Trainer& trainer, const PolicyModel& model,
                     int64_t steps) {
  const auto& state = trainer.optimizer().state();
  ASSERT_EQ(state.size(), model.parameters().size());
  for (const auto& entry : state) {
    const auto& s =
        static_cast<const torch::optim::AdamWParamState&>(*entry.second);
    EXPECT_EQ(s.step(), steps);
    EXPECT_GT(s.exp_avg().abs().sum().item<double>(), 0);
    EXPECT_GT(s.exp_avg_sq().abs().sum().item<double>(), 0);
  }
}

// A trainer that has stepped (Adam moments, step counts, the warm-up
// schedule's position) is checkpointed and restored into a fresh model and
// trainer: the restored pair's next step is the original's, bit for bit.
// Weights alone (a fresh optimizer) take a different step: Adam's first
// step from empty moments, at the first warm-up learning rate.
TEST(CheckpointTest, RestoredTrainerTakesTheOriginalsNextStepBitForBit) {
  const std::string dir = ::testing::TempDir() + "/ckpt_adam";
  JobConfig c;
  c.model = testing_util::TinyModelConfig();
  c.rollout.group_size = 4;
  c.optim.lr = 1e-2;
  c.optim.weight_decay = 0.1;
  c.optim.warmup_steps = 4;
  c.optim.grad_clip = 1.0;
  auto a = TinyModel(1);
  auto trainer_a = Trainer::Create(*a, nullptr, c, 0).value();
  ASSERT_TRUE(trainer_a->Step(Batch(0)).ok());
  ASSERT_TRUE(trainer_a->Step(Batch(1)).ok());
  ExpectAdamState(*trainer_a, *a, 2);
  ASSERT_TRUE(
      WriteCheckpoint(dir, *a, trainer_a.get(), CheckpointMeta{"rl", "u", 2})
          .ok());

  auto b = TinyModel(2);
  auto trainer_b = Trainer::Create(*b, nullptr, c, 0).value();
  auto read = ReadCheckpoint(dir, *b, trainer_b.get());
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectAdamState(*trainer_b, *b, 2);

  // The same checkpoint's weights with a fresh optimizer.
  auto w = TinyModel(3);
  auto trainer_w = Trainer::Create(*w, nullptr, c, 0).value();
  ASSERT_TRUE(ReadCheckpoint(dir, *w, nullptr).ok());

  const std::vector<Sample> next = Batch(2);
  const TrainStats sa = trainer_a->Step(next).value();
  const TrainStats sb = trainer_b->Step(next).value();
  const TrainStats sw = trainer_w->Step(next).value();
  EXPECT_EQ(sb.lr, sa.lr);
  EXPECT_EQ(sb.loss, sa.loss);
  EXPECT_EQ(sa.lr, LearningRateAt(c.optim, 2));
  EXPECT_NE(sw.lr, sa.lr);
  const auto pa = a->parameters(), pb = b->parameters(), pw = w->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  int weights_only_differs = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i], pb[i]))
        << "parameter " << i << " max diff "
        << (pa[i] - pb[i]).abs().max().item<double>();
    if (!torch::equal(pa[i], pw[i])) ++weights_only_differs;
  }
  EXPECT_EQ(weights_only_differs, static_cast<int>(pa.size()));
}

TEST(CheckpointTest, ReportsMismatchingModelConfigByKey) {
  const std::string dir = ::testing::TempDir() + "/ckpt_mismatch";
  auto a = TinyModel(1);
  ASSERT_TRUE(
      WriteCheckpoint(dir, *a, nullptr, CheckpointMeta{"sft", "unit"}).ok());
  ModelConfig other = testing_util::TinyModelConfig();
  other.n_layers = 3;
  auto b = PolicyModel::Create(other, 98, c10::Device("cpu"), 1).value();
  auto st = ReadCheckpoint(dir, *b, nullptr).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("model.n_layers is 2 in the checkpoint but 3"),
            std::string::npos)
      << st;
}

TEST(CheckpointTest, MissingDirectoryIsNotFound) {
  auto a = TinyModel(1);
  auto st = ReadCheckpoint(::testing::TempDir() + "/no_such_ckpt", *a, nullptr)
                .status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("no_such_ckpt"), std::string::npos);
}

}  // namespace
}  // namespace fusionrl
