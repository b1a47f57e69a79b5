#include "engine/rollout/rollout.h"

#include <torch/types.h>

#include <cmath>

#include "engine/model/test_util.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using testing_util::TinyModel;

constexpr int kPad = 0, kBos = 1, kEos = 2;

std::vector<std::vector<int>> Prompts() {
  return {
      {kBos, 20, 21, 22}, {kBos, 40}, {kBos, 50, 51}, {kBos, 60, 61, 62, 63}};
}

// One key per prompt: {seed, first_index + i}.
std::vector<SequenceKey> Keys(size_t n, uint64_t seed, int64_t first_index) {
  std::vector<SequenceKey> keys;
  for (size_t i = 0; i < n; ++i) {
    keys.push_back({seed, first_index + static_cast<int64_t>(i)});
  }
  return keys;
}

// `got` samples the tokens of `want`, with log-probs within `tolerance`.
void ExpectSameSamples(const std::vector<Completion>& got,
                       const std::vector<Completion>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
    EXPECT_EQ(got[i].finished, want[i].finished) << "sequence " << i;
    ASSERT_EQ(got[i].logp.size(), want[i].logp.size()) << "sequence " << i;
    for (size_t t = 0; t < want[i].logp.size(); ++t) {
      EXPECT_NEAR(got[i].logp[t], want[i].logp[t], tolerance)
          << "sequence " << i << " token " << t;
    }
  }
}

TEST(RolloutTest, SameSeedGivesSameSamples) {
  auto model = TinyModel();
  RolloutEngine engine(*model, kPad, kEos);
  SamplingParams p;
  p.max_new_tokens = 12;
  auto a = engine.Generate(Prompts(), p, 123).value();
  auto b = engine.Generate(Prompts(), p, 123).value();
  auto c = engine.Generate(Prompts(), p, 124).value();
  bool any_diff = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(a[i].logp, b[i].logp);
    any_diff |= a[i].tokens != c[i].tokens;
  }
  EXPECT_TRUE(any_diff);
}

TEST(RolloutTest, GreedyMatchesArgmaxOfUncachedForward) {
  auto model = TinyModel();
  RolloutEngine engine(*model, kPad, kEos);
  SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = 10;
  auto prompts = Prompts();
  auto out = engine.Generate(prompts, p, 0).value();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int64_t> seq(prompts[i].begin(), prompts[i].end());
    for (size_t t = 0; t < out[i].tokens.size(); ++t) {
      auto tokens = torch::tensor(seq, torch::kLong).unsqueeze(0);
      auto valid = torch::ones_like(tokens, torch::kBool);
      auto logits = model->Forward(tokens, PositionsFromValid(valid), valid);
      const int expected = logits[0][-1].argmax().item<int>();
      ASSERT_EQ(out[i].tokens[t], expected) << "prompt " << i << " token " << t;
      seq.push_back(expected);
    }
  }
}

TEST(RolloutTest, StopsAtEosAndMarksFinished) {
  auto model = TinyModel();
  RolloutEngine engine(*model, kPad, kEos);
  SamplingParams p;
  p.max_new_tokens = 20;
  // Make eos likely at every step so some sequences stop early.
  {
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    // The last parameter is lm_head.weight [V, D]; add a bias direction.
    params.back()[kEos].add_(params.back().mean(0) * 0 + 0.6);
  }
  std::vector<std::vector<int>> prompts(32, {kBos, 30, 31});
  auto out = engine.Generate(prompts, p, 5).value();
  int finished = 0;
  for (const auto& c : out) {
    ASSERT_FALSE(c.tokens.empty());
    ASSERT_EQ(c.tokens.size(), c.logp.size());
    for (size_t t = 0; t + 1 < c.tokens.size(); ++t) {
      EXPECT_NE(c.tokens[t], kEos);
    }
    EXPECT_EQ(c.finished, c.tokens.back() == kEos);
    if (!c.finished) {
      EXPECT_EQ(c.tokens.size(), 20u);
    }
    finished += c.finished;
  }
  EXPECT_GT(finished, 0);
}

TEST(RolloutTest, BehaviourLogProbsMatchTrainerRecomputation) {
  auto model = TinyModel();
  RolloutEngine engine(*model, kPad, kEos);
  SamplingParams p;
  p.temperature = 0.7;
  p.max_new_tokens = 12;
  auto prompts = Prompts();
  auto out = engine.Generate(prompts, p, 99).value();
  std::vector<Sample> samples(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    samples[i].prompt_ids = prompts[i];
    samples[i].response_ids = out[i].tokens;
    samples[i].behaviour_logp = out[i].logp;
  }
  auto batch = Collate(samples, kPad, c10::Device("cpu"));
  torch::NoGradGuard no_grad;
  auto logp = ResponseLogProbs(*model, batch, 0.7, nullptr);
  auto diff = ((logp - batch.behaviour_logp) * batch.response_mask).abs().max();
  EXPECT_LT(diff.item<float>(), 1e-4);
}

TEST(RolloutTest, RejectsPromptsThatDoNotFit) {
  auto model = TinyModel();  // max_seq_len 32
  RolloutEngine engine(*model, kPad, kEos);
  SamplingParams p;
  p.max_new_tokens = 30;
  auto st = engine.Generate(Prompts(), p, 1).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("max_seq_len"), std::string::npos);
  EXPECT_EQ(engine.Generate({{}}, SamplingParams{}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RolloutTest, FilterLogitsTopK) {
  auto logits = torch::tensor({{1.0, 3.0, 2.0, 0.5}});
  auto f = FilterLogits(logits, 2, 1.0);
  EXPECT_TRUE(std::isinf(f[0][0].item<float>()));
  EXPECT_FLOAT_EQ(f[0][1].item<float>(), 3.0f);
  EXPECT_FLOAT_EQ(f[0][2].item<float>(), 2.0f);
  EXPECT_TRUE(std::isinf(f[0][3].item<float>()));
}

TEST(RolloutTest, FilterLogitsTopPKeepsSmallestSetReachingP) {
  // probs = {0.5, 0.3, 0.15, 0.05}
  auto logits = torch::log(torch::tensor({{0.5, 0.3, 0.15, 0.05}}));
  auto keep = [&](double top_p) {
    auto f = FilterLogits(logits, 0, top_p);
    return torch::isfinite(f).sum().item<int>();
  };
  EXPECT_EQ(keep(0.4), 1);  // 0.5 already reaches 0.4
  EXPECT_EQ(keep(0.5), 1);
  EXPECT_EQ(keep(0.75), 2);  // 0.5 + 0.3
  EXPECT_EQ(keep(0.9), 3);
  EXPECT_EQ(keep(0.99), 4);
}

TEST(RolloutTest, TopKOneSamplingIsGreedy) {
  auto model = TinyModel();
  RolloutEngine engine(*model, kPad, kEos);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 8;
  SamplingParams top1 = greedy;
  top1.temperature = 1.0;
  top1.top_k = 1;
  auto a = engine.Generate(Prompts(), greedy, 3).value();
  auto b = engine.Generate(Prompts(), top1, 4).value();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].tokens, b[i].tokens);
}

// With top-k / top-p the recorded behaviour log-prob is that of the
// distribution sampled from: log softmax of the truncated, temperature-
// scaled logits, recomputed here from an uncached forward. (With the full
// distribution's log-prob instead, every entry differs by the log of the
// kept mass.)
TEST(RolloutTest, TruncatedSamplingRecordsTheSampledDistributionsLogProbs) {
  auto model = TinyModel();
  RolloutEngine engine(*model, kPad, kEos);
  for (auto [top_k, top_p] : {std::pair{3, 1.0}, std::pair{0, 0.6}}) {
    SamplingParams p;
    p.temperature = 0.8;
    p.top_k = top_k;
    p.top_p = top_p;
    p.max_new_tokens = 6;
    auto prompts = Prompts();
    auto out = engine.Generate(prompts, p, 17).value();
    torch::NoGradGuard no_grad;
    double truncated_mass_gap = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int64_t> seq(prompts[i].begin(), prompts[i].end());
      for (size_t t = 0; t < out[i].tokens.size(); ++t) {
        auto tokens = torch::tensor(seq, torch::kLong).unsqueeze(0);
        auto valid = torch::ones_like(tokens, torch::kBool);
        auto logits =
            model->Forward(tokens, PositionsFromValid(valid), valid)[0][-1] /
            0.8;
        auto want = torch::log_softmax(FilterLogits(logits, top_k, top_p), -1);
        auto full = torch::log_softmax(logits, -1);
        const int tok = out[i].tokens[t];
        EXPECT_NEAR(out[i].logp[t], want[tok].item<double>(), 1e-4)
            << "top_k " << top_k << " top_p " << top_p << " sequence " << i
            << " token " << t;
        truncated_mass_gap +=
            want[tok].item<double>() - full[tok].item<double>();
        seq.push_back(tok);
      }
    }
    // The check above can tell the two apart: truncation removed mass.
    EXPECT_GT(truncated_mass_gap, 0.1) << "top_k " << top_k;
  }
}

TEST(RolloutTest, SampledTokenFrequenciesFollowTheDistribution) {
  // One decode step from many identical prompts: the empirical frequency of
  // each token should match softmax(logits / T).
  auto model = TinyModel();
  RolloutEngine engine(*model, kPad, kEos);
  SamplingParams p;
  p.temperature = 1.5;
  p.max_new_tokens = 1;
  const int n = 4000;
  std::vector<std::vector<int>> prompts(n, {kBos, 33});
  auto out = engine.Generate(prompts, p, 11).value();
  torch::NoGradGuard no_grad;
  auto tokens = torch::tensor({{kBos, 33}}, torch::kLong);
  auto valid = torch::ones_like(tokens, torch::kBool);
  auto probs = torch::softmax(
      model->Forward(tokens, PositionsFromValid(valid), valid)[0][-1] / 1.5,
      -1);
  std::vector<int> counts(98, 0);
  for (const auto& c : out) counts[c.tokens[0]]++;
  for (int v = 0; v < 98; ++v) {
    const double pv = probs[v].item<double>();
    const double sd = std::sqrt(pv * (1 - pv) / n);
    EXPECT_NEAR(counts[v] / static_cast<double>(n), pv, 5 * sd + 1e-3)
        << "token " << v;
  }
}

// Partial rollout: a sequence stopped after k tokens and continued from its
// prompt + those tokens (first_token = k) samples what the uninterrupted
// sequence samples, on every decode path; the continuation's prefill
// computes the first k tokens' cache in one pass instead of k decode steps,
// so log-probs agree to float rounding.
TEST(RolloutTest, InterruptedAndContinuedSequenceEqualsTheUninterruptedOne) {
  for (auto path : {RolloutEngine::DecodePath::kFused,
                    RolloutEngine::DecodePath::kComposite,
                    RolloutEngine::DecodePath::kStatic}) {
    SCOPED_TRACE(static_cast<int>(path));
    auto model = TinyModel();
    RolloutEngine engine(*model, kPad, kEos);
    engine.set_decode_path(path);
    SamplingParams p;
    p.max_new_tokens = 14;
    const auto prompts = Prompts();
    const std::vector<SequenceKey> keys = Keys(prompts.size(), 77, 3);
    const auto whole = engine.Generate(prompts, p, keys).value();
    // Caps differ per sequence (one runs to the end).
    std::vector<SequenceKey> capped = keys;
    const int64_t caps[] = {5, 1, 9, 0};
    for (size_t i = 0; i < capped.size(); ++i) capped[i].max_tokens = caps[i];
    const auto head = engine.Generate(prompts, p, capped).value();
    std::vector<std::vector<int>> rest_prompts;
    std::vector<SequenceKey> rest_keys;
    std::vector<size_t> rest_of;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t cap = caps[i] > 0 ? caps[i] : p.max_new_tokens;
      ASSERT_LE(static_cast<int64_t>(head[i].tokens.size()), cap);
      if (head[i].finished) continue;
      ASSERT_EQ(static_cast<int64_t>(head[i].tokens.size()), cap);
      if (cap == p.max_new_tokens) continue;
      std::vector<int> prompt = prompts[i];
      prompt.insert(prompt.end(), head[i].tokens.begin(), head[i].tokens.end());
      rest_prompts.push_back(prompt);
      SequenceKey key = keys[i];
      key.first_token = cap;
      key.max_tokens = p.max_new_tokens - cap;  // the response's budget
      rest_keys.push_back(key);
      rest_of.push_back(i);
    }
    ASSERT_GE(rest_of.size(), 2u);
    const auto rest = engine.Generate(rest_prompts, p, rest_keys).value();
    std::vector<Completion> joined = head;
    for (size_t r = 0; r < rest.size(); ++r) {
      Completion& c = joined[rest_of[r]];
      c.tokens.insert(c.tokens.end(), rest[r].tokens.begin(),
                      rest[r].tokens.end());
      c.logp.insert(c.logp.end(), rest[r].logp.begin(), rest[r].logp.end());
      c.finished = rest[r].finished;
    }
    ExpectSameSamples(joined, whole, 1e-4);
  }
}

// A continued (longer) prompt beside fresh ones changes nothing of theirs
// but float rounding: a product over a different number of rows may round
// differently in the last bits (so a partial rollout's exact resume needs
// the same rounds as the uninterrupted run, docs/stalesync.md).
TEST(RolloutTest, SequenceDoesNotDependOnContinuedPromptsBesideIt) {
  auto model = TinyModel();
  RolloutEngine engine(*model, kPad, kEos);
  SamplingParams p;
  p.max_new_tokens = 12;
  const auto prompts = Prompts();
  const std::vector<SequenceKey> keys = Keys(prompts.size(), 5, 0);
  const auto alone = engine.Generate(prompts, p, keys).value();
  auto mixed_prompts = prompts;
  auto mixed_keys = keys;
  std::vector<int> longer = {kBos, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79};
  mixed_prompts.insert(mixed_prompts.begin(), longer);
  mixed_keys.insert(mixed_keys.begin(), SequenceKey{9, 0, 6, 4});
  const auto mixed = engine.Generate(mixed_prompts, p, mixed_keys).value();
  ASSERT_LE(mixed[0].tokens.size(), 4u);
  ExpectSameSamples({mixed.begin() + 1, mixed.end()}, alone, 1e-5);
}

TEST(RolloutTest, RejectsATokenCapAboveMaxNewTokens) {
  auto model = TinyModel();
  RolloutEngine engine(*model, kPad, kEos);
  SamplingParams p;
  p.max_new_tokens = 4;
  auto out = engine.Generate({{kBos, 3}}, p, {SequenceKey{1, 0, 0, 5}});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("max_tokens 5"), std::string::npos)
      << out.status();
}

}  // namespace
}  // namespace fusionrl
