// EpisodeDecoder: KV continuation across turns, the schedule, the limits.
#include "engine/rollout/episode_decoder.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "engine/collectives/grad_sync.h"
#include "engine/model/expert_parallel.h"
#include "engine/model/test_util.h"
#include "engine/rollout/cpu_decoder.h"

namespace fusionrl {
namespace {

constexpr int kPad = 0;
constexpr int kStop = 2;

// Answers every turn with fixed tokens until `turns` turns, then done;
// records what it was given.
class ScriptedDriver final : public TurnDriver {
 public:
  ScriptedDriver(int turns, std::vector<int> answer)
      : turns_(turns), answer_(std::move(answer)) {}
  void TurnEnded(int64_t i, const std::vector<int>& turn,
                 bool stopped) override {
    ended_[i].push_back(turn);
    stopped_[i].push_back(stopped);
  }
  Answer Await(int64_t i) override {
    ++awaited_[i];
    Answer a;
    a.done = static_cast<int>(ended_[i].size()) >= turns_;
    if (!a.done) a.tokens = answer_;
    return a;
  }
  std::map<int64_t, std::vector<std::vector<int>>> ended_;
  std::map<int64_t, std::vector<bool>> stopped_;
  std::map<int64_t, int> awaited_;

 private:
  int turns_;
  std::vector<int> answer_;
};

ModelConfig EpisodeModelConfig() {
  ModelConfig c = testing_util::TinyModelConfig();
  c.max_seq_len = 64;
  return c;
}

// The same with 4 experts, top-2, in every block.
ModelConfig MoeEpisodeModelConfig() {
  ModelConfig c = EpisodeModelConfig();
  c.moe_experts = 4;
  c.moe_top_k = 2;
  c.moe_d_ff = 32;
  return c;
}

std::unique_ptr<PolicyModel> EpisodeModel() {
  return PolicyModel::Create(EpisodeModelConfig(), 40, c10::Device("cpu"), 11)
      .value();
}

// Log-probs of every position of prompt + tokens from one full forward
// (the trainer's recompute), at temperature 1.
std::vector<float> FullForwardLogp(PolicyModel& model,
                                   const std::vector<int>& prompt,
                                   const std::vector<int>& tokens) {
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), tokens.begin(), tokens.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  auto t = at::tensor(ids, at::kLong).view({1, n});
  auto pos = at::arange(n, at::kLong).view({1, n});
  auto valid = at::ones({1, n}, at::kBool);
  at::NoGradGuard no_grad;
  auto logp = at::log_softmax(model.Forward(t, pos, valid), -1)[0];
  std::vector<float> out;
  for (size_t j = 0; j < tokens.size(); ++j) {
    const int64_t at_pos = static_cast<int64_t>(prompt.size() + j) - 1;
    out.push_back(logp[at_pos][tokens[j]].item<float>());
  }
  return out;
}

// Four episodes (two share a prompt) of three turns, each answered with
// three tokens, in two slots: fewer slots than episodes, so parking and
// refills happen.
const std::vector<std::vector<int>> kScriptedPrompts = {
    {1, 5, 6, 7}, {1, 8, 9}, {1, 5, 6, 7}, {1, 10, 11, 12, 13}};

absl::StatusOr<std::vector<EpisodeTokens>> RunScripted(
    EpisodeDecoder& decoder) {
  std::vector<SequenceKey> keys;
  for (int64_t i = 0; i < 4; ++i) keys.push_back({99, i, 0, 0});
  SamplingParams params;
  params.temperature = 1.0;
  params.max_new_tokens = 5;
  EpisodeLimits limits;
  limits.max_turns = 3;
  limits.max_episode_tokens = 40;
  limits.slots = 2;
  ScriptedDriver driver(3, {20, 21, 22});
  return decoder.Run(kScriptedPrompts, keys, params, limits, driver);
}

void ExpectContinuationMatchesPrefill(bool fused) {
  auto model = EpisodeModel();
  ASSERT_EQ(CpuDecoder::Supports(*model), true);
  EpisodeDecoder decoder(*model, kPad, {kStop});
  decoder.set_fused(fused);
  EXPECT_EQ(decoder.fused(), fused);
  const std::vector<std::vector<int>>& prompts = kScriptedPrompts;
  auto out = RunScripted(decoder);
  ASSERT_TRUE(out.ok()) << out.status();
  int environment_tokens = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const EpisodeTokens& ep = (*out)[i];
    ASSERT_EQ(ep.tokens.size(), ep.logp.size());
    ASSERT_EQ(ep.tokens.size(), ep.model.size());
    EXPECT_TRUE(ep.done) << i;
    EXPECT_EQ(ep.turns, 3) << i;
    // Every model token's log-prob, the ones after an answer included,
    // equals the full re-prefill's.
    const std::vector<float> full =
        FullForwardLogp(*model, prompts[i], ep.tokens);
    for (size_t j = 0; j < ep.tokens.size(); ++j) {
      if (!ep.model[j]) {
        EXPECT_EQ(ep.logp[j], 0.0f);
        ++environment_tokens;
        continue;
      }
      EXPECT_NEAR(ep.logp[j], full[j], 2e-4)
          << "episode " << i << " token " << j;
    }
  }
  // Two answers of three tokens per episode.
  EXPECT_EQ(environment_tokens, 4 * 2 * 3);
  EXPECT_EQ(decoder.last_stats().env_tokens_fed, 4 * 2 * 3);
}

TEST(EpisodeDecoderTest, FusedContinuationGivesTheLogitsOfAFullPrefill) {
  ExpectContinuationMatchesPrefill(/*fused=*/true);
}

TEST(EpisodeDecoderTest, CompositeContinuationGivesTheLogitsOfAFullPrefill) {
  ExpectContinuationMatchesPrefill(/*fused=*/false);
}

TEST(EpisodeDecoderTest, TurnsEndAtTheStopOrTheTurnBudgetAndAnswersFollow) {
  auto model = EpisodeModel();
  EpisodeDecoder decoder(*model, kPad, {kStop});
  SamplingParams params;
  params.temperature = 1.0;
  params.max_new_tokens = 4;
  EpisodeLimits limits;
  limits.max_turns = 2;
  limits.max_episode_tokens = 30;
  ScriptedDriver driver(2, {30, 31});
  auto out = decoder.Run({{1, 3, 4}}, {{5, 0, 0, 0}}, params, limits, driver);
  ASSERT_TRUE(out.ok()) << out.status();
  const EpisodeTokens& ep = (*out)[0];
  ASSERT_EQ(driver.ended_[0].size(), 2u);
  // The sequence is turn 1, the answer, turn 2, each turn as the driver saw
  // it (ending at the stop id, or 4 tokens long without one).
  std::vector<int> expected = driver.ended_[0][0];
  expected.push_back(30);
  expected.push_back(31);
  expected.insert(expected.end(), driver.ended_[0][1].begin(),
                  driver.ended_[0][1].end());
  EXPECT_EQ(ep.tokens, expected);
  for (size_t t = 0; t < 2; ++t) {
    const auto& turn = driver.ended_[0][t];
    EXPECT_EQ(driver.stopped_[0][t], turn.back() == kStop);
    if (turn.back() != kStop) {
      EXPECT_EQ(turn.size(), 4u);
    }
  }
}

TEST(EpisodeDecoderTest, SamplesDoNotDependOnTheSlotCount) {
  // The same episodes with all slots and with one slot: each episode's
  // tokens are the same (its uniforms are its own; rows are independent up
  // to float rounding, which a tiny model does not reach at these
  // margins).
  auto model = EpisodeModel();
  std::vector<std::vector<int>> prompts = {{1, 5}, {1, 6, 7}, {1, 8}};
  std::vector<SequenceKey> keys;
  for (int64_t i = 0; i < 3; ++i) keys.push_back({4, i, 0, 0});
  SamplingParams params;
  params.max_new_tokens = 4;
  EpisodeLimits limits;
  limits.max_turns = 3;
  limits.max_episode_tokens = 30;
  std::vector<std::vector<int>> a, b;
  for (int64_t slots : {0, 1}) {
    limits.slots = slots;
    EpisodeDecoder decoder(*model, kPad, {kStop});
    ScriptedDriver driver(3, {25});
    auto out = decoder.Run(prompts, keys, params, limits, driver);
    ASSERT_TRUE(out.ok()) << out.status();
    auto& dst = slots == 0 ? a : b;
    for (const auto& ep : *out) dst.push_back(ep.tokens);
  }
  EXPECT_EQ(a, b);
}

TEST(EpisodeDecoderTest, TheTokenLimitEndsAnEpisodeNotDone) {
  auto model = EpisodeModel();
  EpisodeDecoder decoder(*model, kPad, {kStop});
  SamplingParams params;
  params.max_new_tokens = 6;
  EpisodeLimits limits;
  limits.max_turns = 10;
  limits.max_episode_tokens = 9;
  // Answers of 5 tokens: at most one fits after a turn.
  ScriptedDriver driver(10, {20, 21, 22, 23, 24});
  auto out = decoder.Run({{1, 3}}, {{8, 0, 0, 0}}, params, limits, driver);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE((*out)[0].done);
  EXPECT_LE((*out)[0].tokens.size(), 9u);
}

TEST(EpisodeDecoderTest, APromptThatLeavesNoRoomIsAnError) {
  auto model = EpisodeModel();
  EpisodeDecoder decoder(*model, kPad, {kStop});
  EpisodeLimits limits;
  limits.max_episode_tokens = 60;
  ScriptedDriver driver(1, {});
  auto out = decoder.Run({std::vector<int>(10, 3)}, {{1, 0, 0, 0}},
                         SamplingParams{}, limits, driver);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("max_seq_len"), std::string::npos)
      << out.status();
}

// A MoE policy's episodes (the composite backend) record the experts of
// every token they fed, the environment's included, in sequence order:
// the experts a full forward of prompt + episode routes them to.
TEST(EpisodeDecoderTest, MoeEpisodesRecordTheRoutesOfEveryFedToken) {
  const ModelConfig c = MoeEpisodeModelConfig();
  auto model = PolicyModel::Create(c, 40, c10::Device("cpu"), 11).value();
  EpisodeDecoder decoder(*model, kPad, {kStop});
  const std::vector<std::vector<int>>& prompts = kScriptedPrompts;
  auto out = RunScripted(decoder);
  ASSERT_TRUE(out.ok()) << out.status();
  const int64_t width = c.n_layers * c.moe_top_k;
  model->set_record_routes(true);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const EpisodeTokens& ep = (*out)[i];
    std::vector<int64_t> ids(prompts[i].begin(), prompts[i].end());
    ids.insert(ids.end(), ep.tokens.begin(), ep.tokens.end());
    const int64_t fed = static_cast<int64_t>(ids.size()) - 1;
    ASSERT_EQ(static_cast<int64_t>(ep.routes.size()), fed * width) << i;
    at::NoGradGuard no_grad;
    const int64_t n = static_cast<int64_t>(ids.size());
    model->Forward(at::tensor(ids, at::kLong).view({1, n}),
                   at::arange(n, at::kLong).view({1, n}),
                   at::ones({1, n}, at::kBool));
    const at::Tensor full =
        model->last_routes().narrow(1, 0, fed).reshape({-1}).to(at::kChar);
    const at::Tensor got = at::tensor(
        std::vector<int64_t>(ep.routes.begin(), ep.routes.end()), at::kLong);
    EXPECT_TRUE(at::equal(got.to(at::kChar), full)) << "episode " << i;
  }
}

// Multi-turn episodes from expert shards in lockstep: rank 0 runs the four
// scripted episodes of three turns in two slots, rank 1 one episode of one
// turn, so rank 1 joins most of rank 0's forwards with no tokens. Each
// rank's episodes are the whole model's, bit for bit.
TEST(EpisodeDecoderTest, ExpertShardsRunEpisodesInLockstepAsTheWholeModel) {
  const ModelConfig c = MoeEpisodeModelConfig();
  auto whole = PolicyModel::Create(c, 40, c10::Device("cpu"), 11).value();
  auto group = MakeLocalGlooGroup(2, absl::Seconds(20)).value();
  const std::vector<std::vector<int>> prompts[2] = {kScriptedPrompts,
                                                    {{1, 14, 15}}};
  const int turns[2] = {3, 1};
  auto run = [&](PolicyModel& model, GradientSync* lockstep, int r,
                 EpisodeDecodeStats* stats) {
    EpisodeDecoder decoder(model, kPad, {kStop});
    decoder.set_expert_lockstep(lockstep);
    std::vector<SequenceKey> keys;
    for (size_t i = 0; i < prompts[r].size(); ++i) {
      keys.push_back(
          {99 + static_cast<uint64_t>(r), static_cast<int64_t>(i), 0, 0});
    }
    SamplingParams params;
    params.max_new_tokens = 5;
    EpisodeLimits limits;
    limits.max_turns = turns[r];
    limits.max_episode_tokens = 40;
    limits.slots = 2;
    ScriptedDriver driver(turns[r], {20, 21, 22});
    auto out = decoder.Run(prompts[r], keys, params, limits, driver);
    if (stats != nullptr) *stats = decoder.last_stats();
    return out;
  };
  std::vector<std::unique_ptr<PolicyModel>> shards;
  for (int r = 0; r < 2; ++r) {
    shards.push_back(whole->ExpertShardOf(ExpertShard{r, 2}).value());
    shards[r]->set_expert_group(group[r].get());
  }
  std::vector<absl::StatusOr<std::vector<EpisodeTokens>>> got(
      2, absl::UnknownError("not run"));
  EpisodeDecodeStats stats[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        got[r] = run(*shards[r], group[r].get(), r, &stats[r]);
      } catch (const c10::Error& e) {  // an exchange timed out
        got[r] = absl::InternalError(e.what_without_backtrace());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
    const auto want = run(*whole, nullptr, r, nullptr);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(got[r]->size(), want->size());
    for (size_t i = 0; i < want->size(); ++i) {
      const EpisodeTokens &a = (*got[r])[i], &b = (*want)[i];
      EXPECT_EQ(a.tokens, b.tokens) << "rank " << r << " episode " << i;
      EXPECT_EQ(a.logp, b.logp) << "rank " << r << " episode " << i;
      EXPECT_EQ(a.model, b.model) << "rank " << r << " episode " << i;
      EXPECT_EQ(a.routes, b.routes) << "rank " << r << " episode " << i;
      EXPECT_FALSE(a.routes.empty());
    }
  }
  EXPECT_EQ(stats[0].expert_joins, 0);
  EXPECT_GT(stats[1].expert_joins, 0);
}

}  // namespace
}  // namespace fusionrl
