#include "worker/step/step_totals.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/train/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/step/group_sampler.h"
#include "worker/step/step_record.h"

namespace fusionrl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Sample MakeSample(uint64_t group, int64_t version, int tokens) {
  Sample s;
  s.group_id = group;
  s.behaviour_version = version;
  s.response_ids.assign(static_cast<size_t>(tokens), 7);
  return s;
}

// Four samples of groups 3, 3, 5 and 8 at trainer version 10 with lag 2;
// group 8's sample is dropped (excluded), one of group 3's spans versions
// 8..9 (partial rollout).
RolloutBatch MakeBatch() {
  RolloutBatch b;
  b.samples = {MakeSample(3, 10, 4), MakeSample(3, 8, 6), MakeSample(5, 9, 2),
               MakeSample(8, 6, 1)};
  b.samples[1].token_versions = {8, 8, 9, 9, 9, 9};
  b.samples[3].excluded = true;
  b.Recount();
  b.reward_sum = 1.5;
  b.correct = 2;
  b.finished = 3;
  return b;
}

TEST(StepTotalsTest, CountsWhatTheCardTrained) {
  absl::StatusOr<StepTotals> t =
      StepTotals::Of(MakeBatch(), /*trainer_version=*/10, /*max_lag=*/2,
                     /*thread_samples=*/4, /*over_stale=*/4);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->reward_sum, 1.5);
  EXPECT_EQ(t->correct, 2);
  EXPECT_EQ(t->finished, 3);
  EXPECT_EQ(t->samples, 4);
  EXPECT_EQ(t->thread_samples, 4);
  EXPECT_EQ(t->over_stale, 4);
  // Groups 3 and 5 (8's only sample was dropped).
  EXPECT_EQ(t->trained_groups, 2);
  EXPECT_EQ(t->trained_group_id_sum, 3 + 5);
  EXPECT_EQ(t->trained_group_id_sq_sum, 9 + 25);
  // Staleness 0, 2 and 1 for the three trained samples.
  EXPECT_THAT(t->staleness, ElementsAre(1, 1, 1));
  EXPECT_EQ(t->partial_samples, 1);
  EXPECT_EQ(t->partial_newer_tokens, 4);
}

TEST(StepTotalsTest, RefusesASampleOutsideTheLag) {
  RolloutBatch b = MakeBatch();
  b.samples[2].behaviour_version = 7;  // staleness 3 > 2
  absl::StatusOr<StepTotals> t = StepTotals::Of(b, 10, 2, 0, 0);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("group 5 has staleness 3"));
  b.samples[2].behaviour_version = 11;  // newer than the trainer
  EXPECT_FALSE(StepTotals::Of(b, 10, 2, 0, 0).ok());
  b.samples[2].excluded = true;  // dropped samples are not counted
  EXPECT_TRUE(StepTotals::Of(b, 10, 2, 0, 0).ok());
}

// SumAcrossRanks adds the packed vectors element by element: that must be
// the packed sum of the totals, for every field.
TEST(StepTotalsTest, PackedSumIsTheSumOfTheTotals) {
  StepTotals a = *StepTotals::Of(MakeBatch(), 10, 2, 4, 0);
  RolloutBatch other = MakeBatch();
  other.samples[0].group_id = 11;
  other.reward_sum = 0.25;
  StepTotals b = *StepTotals::Of(other, 10, 2, 0, 8);
  std::vector<double> flat = a.Pack();
  const std::vector<double> fb = b.Pack();
  ASSERT_EQ(flat.size(), fb.size());
  for (size_t i = 0; i < flat.size(); ++i) flat[i] += fb[i];
  absl::StatusOr<StepTotals> summed = StepTotals::Unpack(flat, 2);
  ASSERT_TRUE(summed.ok()) << summed.status();
  StepTotals expected = a;
  expected += b;
  EXPECT_EQ(summed->Pack(), expected.Pack());
  EXPECT_EQ(summed->reward_sum, 1.75);
  EXPECT_EQ(summed->over_stale, 8);
  EXPECT_EQ(summed->trained_groups, 2 + 3);  // {3, 5} and {11, 3, 5}
  EXPECT_EQ(summed->trained_group_id_sum, 3 + 5 + 11 + 3 + 5);
  EXPECT_THAT(summed->staleness, ElementsAre(2, 2, 2));
  // Every field is in the packed form: changing any one changes it.
  for (size_t i = 0; i < flat.size(); ++i) {
    std::vector<double> changed = flat;
    changed[i] += 1;
    EXPECT_NE(StepTotals::Unpack(changed, 2)->Pack(), flat) << i;
  }
}

TEST(StepTotalsTest, UnpackRefusesAnotherLagsLayout) {
  const std::vector<double> flat =
      StepTotals::Of(MakeBatch(), 10, 2, 0, 0)->Pack();
  absl::StatusOr<StepTotals> t = StepTotals::Unpack(flat, 1);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("policy lag 1"));
}

TEST(StepRecordTest, FieldsComeFromTheNamedParts) {
  const StepTotals totals = *StepTotals::Of(MakeBatch(), 10, 2, 4, 0);
  TrainStats ts;
  ts.loss = 0.5;
  ts.moe_expert_load = {0.25, 0.75};
  StepRecordParts p;
  p.step = 11;
  p.policy_version = 11;
  p.totals = &totals;
  p.train = &ts;
  p.times.train = 2.5;
  p.split.both = 1.25;
  p.exchange.cross_node_bytes = 64;
  auto fields = [](const MetricFields& rec) {
    std::map<std::string, double> m;
    for (const auto& [k, v] : rec) EXPECT_TRUE(m.emplace(k, v).second) << k;
    return m;
  };
  std::map<std::string, double> m = fields(StepRecord(p));
  EXPECT_EQ(m.at("step"), 11);
  EXPECT_EQ(m.at("reward_mean"), 1.5 / 4);
  EXPECT_EQ(m.at("train_accuracy"), 2.0 / 4);
  EXPECT_EQ(m.at("response_len_mean"), totals.tokens / 4);
  EXPECT_EQ(m.at("rollout_tokens"), totals.tokens);
  EXPECT_EQ(m.at("loss"), 0.5);
  EXPECT_EQ(m.at("train_seconds"), 2.5);
  EXPECT_EQ(m.at("card_both_seconds"), 1.25);
  EXPECT_EQ(m.at("cross_node_bytes"), 64);
  EXPECT_EQ(m.at("trained_groups"), 2);
  EXPECT_EQ(m.at("staleness_2"), 1);
  EXPECT_EQ(m.count("staleness_3"), 0u);
  EXPECT_EQ(m.count("moe_load_0"), 0u);
  p.moe = true;
  m = fields(StepRecord(p));
  EXPECT_EQ(m.at("moe_load_1"), 0.75);
}

}  // namespace
}  // namespace fusionrl
