#include "engine/checkpoint.h"

#include <torch/types.h>

#include <filesystem>

#include "engine/test_util.h"
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
