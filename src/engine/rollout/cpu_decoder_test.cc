// The decode paths against the static reference loop: the fused one
// (CpuDecoder, decode_kernels) and the composite one (the module graph with
// prefix sharing and row compaction). Logits within float tolerance,
// identical samples for a seed; continuous batching, compaction and prefix
// sharing change nothing but speed.
#include "engine/rollout/cpu_decoder.h"

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/kernels/intra_op_threads.h"
#include "engine/model/test_util.h"
#include "engine/rollout/rollout.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

constexpr int kPad = 0, kBos = 1, kEos = 2;

struct Variant {
  std::string name;
  int n_kv_heads = 0;
  bool qk_norm = false;
  bool qkv_bias = false;
  bool tie_embeddings = false;
};

std::unique_ptr<PolicyModel> MakeModel(const Variant& v, uint64_t seed = 7) {
  ModelConfig c = testing_util::TinyModelConfig();
  c.d_model = 48;  // not a multiple of the kernels' 8 lanes per head: tails
  c.n_heads = 4;   // head_dim 12
  c.n_kv_heads = v.n_kv_heads;
  c.qk_norm = v.qk_norm;
  c.qkv_bias = v.qkv_bias;
  c.tie_embeddings = v.tie_embeddings;
  c.d_ff = 72;
  auto m = PolicyModel::Create(c, 98, c10::Device("cpu"), seed).value();
  if (v.qkv_bias) {  // biases start at 0: give them values
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : m->named_parameters()) {
      if (name.find(".bias") != std::string::npos) t.normal_(0, 0.3);
    }
  }
  return m;
}

std::vector<Variant> Variants() {
  return {{"plain"}, {"gqa", 2}, {"qk_norm_bias_tied", 1, true, true, true}};
}

std::vector<std::vector<int>> Prompts() {
  // Different lengths (left padding on the composite path), and repeats of
  // a prompt as a GRPO group has them.
  std::vector<std::vector<int>> p = {{kBos, 20, 21, 22},
                                     {kBos, 40},
                                     {kBos, 50, 51},
                                     {kBos, 60, 61, 62, 63, 64, 65}};
  std::vector<std::vector<int>> out;
  for (const auto& x : p) {
    for (int g = 0; g < 3; ++g) out.push_back(x);
  }
  return out;
}

// Step logits of the decoder equal the uncached forward's, token by token.
TEST(CpuDecoderTest, StepLogitsMatchFullForward) {
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(v.name);
    auto model = MakeModel(v);
    ASSERT_TRUE(CpuDecoder::Supports(*model));
    torch::NoGradGuard no_grad;
    const std::vector<int> prompt = {kBos, 30, 31, 32, 33};
    const std::vector<int64_t> cont = {40, 41, 42, 43, 44, 45};
    const int64_t p = static_cast<int64_t>(prompt.size());
    KvCache prefill = model->NewCache(1, p);
    auto tokens =
        torch::tensor(std::vector<int64_t>(prompt.begin(), prompt.end()))
            .unsqueeze(0);
    auto valid = torch::ones_like(tokens, torch::kBool);
    model->ForwardCached(tokens, PositionsFromValid(valid), valid, prefill,
                         true);
    CpuDecoder decoder(*model, /*slots=*/2, p + 8);
    // Slot 1 holds the sequence; slot 0 another copy (rows independent).
    decoder.LoadPrefill(prefill, 0, 0, p, 0);
    decoder.LoadPrefill(prefill, 0, 0, p, 1);
    std::vector<int64_t> seq(prompt.begin(), prompt.end());
    for (int64_t tok : cont) {
      const int64_t feed[2] = {tok, tok};
      at::Tensor logits = decoder.Step(feed, 2).clone();
      seq.push_back(tok);
      auto all = torch::tensor(seq).unsqueeze(0);
      auto all_valid = torch::ones_like(all, torch::kBool);
      auto ref =
          model->Forward(all, PositionsFromValid(all_valid), all_valid)[0][-1];
      EXPECT_TRUE(torch::allclose(logits[0], ref, 1e-4, 1e-5))
          << "max diff " << (logits[0] - ref).abs().max().item<float>();
      EXPECT_TRUE(torch::equal(logits[0], logits[1]));
      EXPECT_EQ(decoder.length(1), static_cast<int64_t>(seq.size()));
    }
  }
}

void ExpectSame(const std::vector<Completion>& a,
                const std::vector<Completion>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "sequence " << i;
    EXPECT_EQ(a[i].finished, b[i].finished) << "sequence " << i;
    ASSERT_EQ(a[i].logp.size(), b[i].logp.size());
    for (size_t t = 0; t < a[i].logp.size(); ++t) {
      EXPECT_NEAR(a[i].logp[t], b[i].logp[t], tol)
          << "sequence " << i << " token " << t;
    }
  }
}

TEST(CpuDecoderTest, FusedPathSamplesWhatTheStaticPathSamples) {
  for (const Variant& v : Variants()) {
    for (double temperature : {0.0, 1.0, 0.7}) {
      SCOPED_TRACE(v.name + " T=" + std::to_string(temperature));
      auto model = MakeModel(v);
      RolloutEngine fused(*model, kPad, kEos);
      RolloutEngine composite(*model, kPad, kEos);
      composite.set_decode_path(RolloutEngine::DecodePath::kStatic);
      ASSERT_TRUE(fused.fused());
      ASSERT_FALSE(composite.fused());
      SamplingParams p;
      p.temperature = temperature;
      p.max_new_tokens = 12;
      auto a = fused.Generate(Prompts(), p, 5).value();
      auto b = composite.Generate(Prompts(), p, 5).value();
      ExpectSame(a, b, 2e-5);
      EXPECT_TRUE(fused.last_stats().fused);
      // Prefix sharing: 4 distinct prompts prefilled, not 12.
      EXPECT_EQ(fused.last_stats().prefill_rows, 4);
      EXPECT_EQ(composite.last_stats().prefill_rows, 12);
      EXPECT_EQ(fused.last_stats().tokens, composite.last_stats().tokens);
    }
  }
}

TEST(CpuDecoderTest, TopKTopPSamplingAgrees) {
  auto model = MakeModel(Variants()[1]);
  RolloutEngine fused(*model, kPad, kEos);
  RolloutEngine composite(*model, kPad, kEos);
  composite.set_decode_path(RolloutEngine::DecodePath::kStatic);
  SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 5;
  p.top_p = 0.8;
  p.max_new_tokens = 10;
  ExpectSame(fused.Generate(Prompts(), p, 9).value(),
             composite.Generate(Prompts(), p, 9).value(), 2e-5);
}

TEST(CpuDecoderTest, ContinuousBatchingEqualsStaticBatching) {
  auto model = MakeModel(Variants()[0]);
  RolloutEngine all(*model, kPad, kEos);
  SamplingParams p;
  p.temperature = 1.0;
  p.max_new_tokens = 14;
  const auto prompts = Prompts();
  const auto reference = all.Generate(prompts, p, 3).value();
  const DecodeStats one_batch = all.last_stats();
  for (int64_t slots : {1, 3, 5}) {
    SCOPED_TRACE("slots " + std::to_string(slots));
    RolloutEngine continuous(*model, kPad, kEos);
    continuous.set_max_batch(slots);
    // Tokens identical; log-probs to float rounding (a GEMM of fewer rows
    // may sum in another order).
    ExpectSame(continuous.Generate(prompts, p, 3).value(), reference, 1e-5);
    // Never more rows at once than slots.
    EXPECT_LE(continuous.last_stats().rows_computed,
              slots * continuous.last_stats().decode_steps);
  }
  // Sequences of different lengths: compaction computes fewer rows than
  // static batching would (every row for every step).
  int64_t finished = 0;
  for (const auto& c : reference) finished += c.finished;
  ASSERT_GT(finished, 0) << "no sequence stopped early: pick another seed";
  EXPECT_LT(one_batch.rows_computed,
            one_batch.decode_steps * static_cast<int64_t>(prompts.size()));
}

TEST(CpuDecoderTest, SamplesDoNotDependOnTheBatch) {
  // A sequence's samples depend on (seed, its index), not on its companions.
  auto model = MakeModel(Variants()[0]);
  RolloutEngine engine(*model, kPad, kEos);
  SamplingParams p;
  p.max_new_tokens = 10;
  const auto prompts = Prompts();
  const auto whole = engine.Generate(prompts, p, 21).value();
  std::vector<std::vector<int>> prefix(prompts.begin(), prompts.begin() + 5);
  ExpectSame(engine.Generate(prefix, p, 21).value(),
             std::vector<Completion>(whole.begin(), whole.begin() + 5), 1e-5);
}

TEST(CpuDecoderTest, StepDoesNotDependOnTheThreadCount) {
  ModelConfig c = testing_util::TinyModelConfig();
  c.d_model = 96;
  c.d_ff = 256;
  auto model = PolicyModel::Create(c, 98, c10::Device("cpu"), 3).value();
  const int before = at::get_num_threads();
  std::vector<at::Tensor> out;
  for (int threads : {1, 2}) {
    SetIntraOpThreads(threads);
    CpuDecoder decoder(*model, 40, 16);
    decoder.set_row_blocks(2);
    std::vector<int64_t> tokens(40);
    at::Tensor all;
    for (int t = 0; t < 6; ++t) {
      for (int i = 0; i < 40; ++i) tokens[i] = 3 + (i * 7 + t * 5) % 90;
      at::Tensor l = decoder.Step(tokens.data(), 40).clone();
      all = all.defined() ? at::cat({all, l}) : l;
    }
    out.push_back(all);
  }
  SetIntraOpThreads(before);
  EXPECT_TRUE(at::equal(out[0], out[1]))
      << (out[0] - out[1]).abs().max().item<double>();
}

// RL Fusion lends the rollout the trainer's threads at some decode steps
// and not at others (RolloutEngine::set_step_hook): the samples and their
// log-probs must be the same, bit for bit, whatever the thread count of
// each step, given the decoder's row blocks (set_row_blocks).
TEST(CpuDecoderTest, SamplesDoNotDependOnTheThreadsOfEachStep) {
  ModelConfig c = testing_util::TinyModelConfig();
  c.d_model = 96;
  c.d_ff = 256;
  auto model = PolicyModel::Create(c, 98, c10::Device("cpu"), 3).value();
  SamplingParams p;
  p.temperature = 1.0;
  p.max_new_tokens = 20;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 40; ++i)
    prompts.push_back({kBos, 20 + i % 7, 30 + i % 5});
  const int before = at::get_num_threads();
  auto run = [&](std::function<int(int64_t)> threads_at_step) {
    RolloutEngine engine(*model, kPad, kEos);
    engine.set_row_blocks(2);
    int64_t step = 0;
    engine.set_step_hook([&] { SetIntraOpThreads(threads_at_step(step++)); });
    SetIntraOpThreads(1);
    auto out = engine.Generate(prompts, p, 5).value();
    SetIntraOpThreads(before);
    return out;
  };
  const auto one = run([](int64_t) { return 1; });
  const auto two = run([](int64_t) { return 2; });
  const auto mixed =
      run([](int64_t s) { return 1 + static_cast<int>(s % 3 == 1); });
  {
    SCOPED_TRACE("two threads at every step");
    ExpectSame(two, one, 0.0);
  }
  {
    SCOPED_TRACE("two threads at every third step");
    ExpectSame(mixed, one, 0.0);
  }
}

TEST(CpuDecoderTest, StopIdsAndLengthLimit) {
  auto model = MakeModel(Variants()[0]);
  // Every id is a stop id but one: most sequences end at once.
  std::vector<int> stops;
  for (int i = 0; i < 98; ++i) {
    if (i != 50) stops.push_back(i);
  }
  RolloutEngine engine(*model, kPad, stops);
  SamplingParams p;
  p.temperature = 1.5;
  p.max_new_tokens = 4;
  auto out = engine.Generate(Prompts(), p, 1).value();
  for (const auto& c : out) {
    ASSERT_FALSE(c.tokens.empty());
    ASSERT_LE(c.tokens.size(), 4u);
    for (size_t t = 0; t + 1 < c.tokens.size(); ++t) EXPECT_EQ(c.tokens[t], 50);
    EXPECT_EQ(c.finished, c.tokens.back() != 50);
  }
  RolloutEngine composite(*model, kPad, stops);
  composite.set_decode_path(RolloutEngine::DecodePath::kStatic);
  ExpectSame(out, composite.Generate(Prompts(), p, 1).value(), 2e-5);
}

TEST(CpuDecoderTest, UnsupportedModelsTakeTheCompositePath) {
  ModelConfig c = testing_util::TinyModelConfig();
  c.moe_experts = 4;
  c.moe_top_k = 2;
  auto moe = PolicyModel::Create(c, 98, c10::Device("cpu"), 1).value();
  EXPECT_FALSE(CpuDecoder::Supports(*moe));
  RolloutEngine engine(*moe, kPad, kEos);
  EXPECT_FALSE(engine.fused());
  auto out = engine.Generate(Prompts(), SamplingParams{}, 1);
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(engine.last_stats().fused);
}

// A stop-id set that ends about one sequence in ten at every token: lengths
// spread from 1 to max_new_tokens, as a real task's do.
std::vector<int> SomeStopIds() {
  std::vector<int> stops;
  for (int id = 2; id < 12; ++id) stops.push_back(id);
  return stops;
}

// Two calls' sequences merged into one, each with its call's key: the
// merged call samples what the two did, and with one call's worth of slots
// the second call's sequences take the slots the first's free (continuous
// batching across calls: fewer decode steps than the two calls took).
TEST(CpuDecoderTest, SequencesOfSeveralCallsShareTheSlots) {
  auto model = MakeModel(Variants()[1]);
  SamplingParams p;
  p.temperature = 1.0;
  p.max_new_tokens = 14;
  const auto a_prompts = Prompts();
  auto b_prompts = Prompts();
  std::reverse(b_prompts.begin(), b_prompts.end());
  RolloutEngine alone(*model, kPad, SomeStopIds());
  const auto a = alone.Generate(a_prompts, p, 3).value();
  const int64_t a_steps = alone.last_stats().decode_steps;
  const auto b = alone.Generate(b_prompts, p, 4).value();
  const int64_t b_steps = alone.last_stats().decode_steps;

  std::vector<std::vector<int>> prompts = a_prompts;
  prompts.insert(prompts.end(), b_prompts.begin(), b_prompts.end());
  std::vector<SequenceKey> keys;
  for (size_t i = 0; i < a_prompts.size(); ++i) {
    keys.push_back({3, static_cast<int64_t>(i)});
  }
  for (size_t i = 0; i < b_prompts.size(); ++i) {
    keys.push_back({4, static_cast<int64_t>(i)});
  }
  RolloutEngine merged(*model, kPad, SomeStopIds());
  merged.set_max_batch(static_cast<int64_t>(a_prompts.size()));
  std::vector<Completion> reported(prompts.size());
  std::vector<int> calls(prompts.size(), 0);
  std::vector<int64_t> order;
  const auto out = merged
                       .Generate(prompts, p, keys,
                                 [&](int64_t i, const Completion& c) {
                                   ++calls[i];
                                   reported[i] = c;
                                   order.push_back(i);
                                 })
                       .value();
  std::vector<Completion> want = a;
  want.insert(want.end(), b.begin(), b.end());
  ExpectSame(out, want, 1e-5);
  ExpectSame(reported, out, 0);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i], 1) << "sequence " << i;
  }
  EXPECT_LE(merged.last_stats().rows_computed,
            merged.last_stats().decode_steps *
                static_cast<int64_t>(a_prompts.size()));
  EXPECT_LT(merged.last_stats().decode_steps, a_steps + b_steps);
  // Some sequence of the second call finished before the first call's
  // last one: the calls' sequences were decoded side by side.
  const auto first_b = std::find_if(order.begin(), order.end(), [&](int64_t i) {
    return i >= static_cast<int64_t>(a_prompts.size());
  });
  const auto last_a = std::find_if(
      order.rbegin(), order.rend(),
      [&](int64_t i) { return i < static_cast<int64_t>(a_prompts.size()); });
  ASSERT_NE(first_b, order.end());
  EXPECT_LT(first_b - order.begin(), order.rend() - last_a - 1);
}

TEST(CompositePathTest, EqualsTheStaticReference) {
  ModelConfig moe = testing_util::TinyModelConfig();
  moe.moe_experts = 4;
  moe.moe_top_k = 2;
  moe.moe_shared_expert = true;
  struct Case {
    std::string name;
    std::unique_ptr<PolicyModel> model;
  };
  std::vector<Case> cases;
  cases.push_back({"dense", MakeModel(Variants()[0])});
  cases.push_back({"dense_gqa_qk_norm_bias_tied", MakeModel(Variants()[2])});
  cases.push_back(
      {"moe", PolicyModel::Create(moe, 98, c10::Device("cpu"), 3).value()});
  for (Case& c : cases) {
    // Compaction at every finish (a CPU's default) and once a quarter of
    // the rows have finished (other devices').
    for (const auto& [temperature, fraction] :
         std::vector<std::pair<double, double>>{
             {0.0, 0.0}, {1.0, 0.0}, {1.0, 0.25}}) {
      SCOPED_TRACE(c.name + " T=" + std::to_string(temperature) +
                   " compaction " + std::to_string(fraction));
      RolloutEngine composite(*c.model, kPad, SomeStopIds());
      RolloutEngine reference(*c.model, kPad, SomeStopIds());
      composite.set_decode_path(RolloutEngine::DecodePath::kComposite);
      composite.set_compaction_fraction(fraction);
      reference.set_decode_path(RolloutEngine::DecodePath::kStatic);
      ASSERT_FALSE(composite.fused());
      SamplingParams p;
      p.temperature = temperature;
      p.max_new_tokens = 14;
      const auto a = composite.Generate(Prompts(), p, 11).value();
      const auto b = reference.Generate(Prompts(), p, 11).value();
      // Tokens identical; log-probs to float rounding (a GEMM of fewer rows
      // may sum in another order).
      ExpectSame(a, b, 1e-5);
      // Prefix sharing: 4 distinct prompts prefilled, not 12.
      EXPECT_EQ(composite.last_stats().prefill_rows, 4);
      EXPECT_EQ(reference.last_stats().prefill_rows, 12);
      // Compaction: finished rows stop being computed.
      int64_t finished = 0;
      size_t longest = 0, shortest = p.max_new_tokens;
      for (const Completion& x : b) {
        finished += x.finished;
        longest = std::max(longest, x.tokens.size());
        shortest = std::min(shortest, x.tokens.size());
      }
      if (temperature > 0) {
        ASSERT_GT(finished, 3) << "too few early stops: pick another seed";
        ASSERT_GT(longest, shortest + 4) << "lengths do not spread";
        EXPECT_LT(composite.last_stats().rows_computed,
                  reference.last_stats().rows_computed);
      }
      EXPECT_EQ(reference.last_stats().rows_computed,
                reference.last_stats().decode_steps * 12);
      EXPECT_EQ(composite.last_stats().decode_steps,
                reference.last_stats().decode_steps);
    }
  }
}

TEST(CompositePathTest, SamplesDoNotDependOnTheBatch) {
  ModelConfig moe = testing_util::TinyModelConfig();
  moe.moe_experts = 4;
  moe.moe_top_k = 2;
  auto model = PolicyModel::Create(moe, 98, c10::Device("cpu"), 5).value();
  RolloutEngine engine(*model, kPad, SomeStopIds());
  engine.set_decode_path(RolloutEngine::DecodePath::kComposite);
  SamplingParams p;
  p.max_new_tokens = 12;
  const auto prompts = Prompts();
  const auto whole = engine.Generate(prompts, p, 21).value();
  std::vector<std::vector<int>> prefix(prompts.begin(), prompts.begin() + 5);
  ExpectSame(engine.Generate(prefix, p, 21).value(),
             std::vector<Completion>(whole.begin(), whole.begin() + 5), 1e-5);
}

}  // namespace
}  // namespace fusionrl
