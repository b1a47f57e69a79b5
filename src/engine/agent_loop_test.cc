// AgentLoop: episodes against in-process environments (the calculator, and
// test environments that fail, hang or script their answers).
#include "engine/agent_loop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "engine/job_common.h"

namespace fusionrl {
namespace {

JobConfig CalculatorJob() {
  JobConfig c;
  c.model.d_model = 32;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.d_ff = 64;
  c.model.max_seq_len = 64;
  c.task.name = "multiply";
  c.task.min_digits = 2;
  c.task.max_digits = 3;
  c.task.eval_size = 8;
  c.rollout.max_new_tokens = 12;
  c.env.name = "calculator";
  c.env.max_turns = 3;
  return c;
}

JobContext Prepare(const JobConfig& c) {
  absl::StatusOr<JobContext> ctx = PrepareJob(c, "");
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  return *std::move(ctx);
}

std::string Decode(const JobContext& ctx, const std::vector<int>& ids) {
  return ctx.tokenizer->Decode(ids);
}

// The response's text with the environment's tokens in [brackets]... as
// plain text: model tokens as they are, eos as '$'.
std::string Layout(const JobContext& ctx, const Sample& s) {
  std::string out;
  for (size_t t = 0; t < s.response_ids.size(); ++t) {
    const int id = s.response_ids[t];
    std::string piece =
        id == ctx.tokenizer->eos_id() ? "$" : ctx.tokenizer->Decode({id});
    out += s.loss_mask[t] ? piece : "{" + piece + "}";
  }
  return out;
}

TEST(AgentLoopTest, ADemonstratedCalculatorEpisodeIsTokenInTokenOut) {
  JobConfig c = CalculatorJob();
  JobContext ctx = Prepare(c);
  Problem p{"347*29=", "10063"};
  absl::StatusOr<Sample> s = DemonstrationSample(ctx, p, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Decode(ctx, s->prompt_ids), "347*29=");
  EXPECT_EQ(s->prompt_ids.front(), ctx.tokenizer->bos_id());
  // The call, the environment's answer (masked), the answer.
  EXPECT_EQ(Layout(ctx, *s), "[calc 347*29]${(}{1}{0}{0}{6}{3}{)}10063$");
  EXPECT_TRUE(s->finished);
  EXPECT_EQ(s->reward, 1.0);
  EXPECT_TRUE(s->correct);
}

std::string TestDataDir() {
  if (const char* env = std::getenv("FUSIONRL_TEST_DATA");
      env != nullptr && *env != '\0') {
    return env;
  }
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/fusionrl/test-data";
}

// `ids` decoded with ChatML's special tokens written out (Decode drops
// them).
std::string DecodeChatML(const JobContext& ctx, const std::vector<int>& ids) {
  std::string out;
  std::vector<int> text;
  for (int id : ids) {
    std::string special;
    for (const char* token : {"<|im_start|>", "<|im_end|>"}) {
      if (id == ctx.tokenizer->TokenToId(token)) special = token;
    }
    if (special.empty()) {
      text.push_back(id);
      continue;
    }
    out += ctx.tokenizer->Decode(text) + special;
    text.clear();
  }
  return out + ctx.tokenizer->Decode(text);
}

// The runs of a sample's response, split where the loss mask changes.
std::vector<std::string> MaskRuns(const JobContext& ctx, const Sample& s) {
  std::vector<std::string> runs;
  std::vector<int> run;
  for (size_t t = 0; t < s.response_ids.size(); ++t) {
    run.push_back(s.response_ids[t]);
    if (t + 1 == s.response_ids.size() ||
        s.loss_mask[t + 1] != s.loss_mask[t]) {
      runs.push_back(DecodeChatML(ctx, run));
      run.clear();
    }
  }
  return runs;
}

// Qwen3's own chat template and tokenizer: the calculator's tool is listed
// in the system prompt, the call is written in Hermes format, the result
// comes back as Qwen3's <tool_response> user turn, and the final answer is
// graded on the text after the (empty) thinking block.
TEST(AgentLoopTest, Qwen3EpisodeIsHermesCallsAndToolResponses) {
  const std::string dir = TestDataDir() + "/qwen3-tokenizer";
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    GTEST_SKIP() << "qwen3 tokenizer not found at " << dir;
  }
  JobConfig c = CalculatorJob();
  c.model.tokenizer = dir;
  c.model.max_seq_len = 512;
  JobContext ctx = Prepare(c);
  ASSERT_EQ(ctx.tool_format, ToolFormat::kHermes);
  absl::StatusOr<Sample> s =
      DemonstrationSample(ctx, Problem{"347*29=", "10063"}, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string prompt = DecodeChatML(ctx, s->prompt_ids);
  EXPECT_NE(prompt.find("<tools>\n{\"type\": \"function\", \"function\": "
                        "{\"name\": \"calc\""),
            std::string::npos)
      << prompt;
  EXPECT_TRUE(absl::EndsWith(prompt,
                             "<|im_start|>user\n347*29=<|im_end|>\n"
                             "<|im_start|>assistant\n"))
      << prompt;
  const std::vector<std::string> runs = MaskRuns(ctx, *s);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0],
            "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"calc\", "
            "\"arguments\": {\"expression\": \"347*29\"}}\n</tool_call>"
            "<|im_end|>");
  EXPECT_EQ(runs[1],
            "\n<|im_start|>user\n<tool_response>\n10063\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(runs[2], "<think>\n\n</think>\n\n10063<|im_end|>");
  EXPECT_EQ(s->loss_mask.front(), 1);
  EXPECT_TRUE(s->finished);
  EXPECT_EQ(s->reward, 1.0);
}

// Scripts its demonstrations (so the rollout's parsing and answering can
// be checked without a trained policy) and records the turns it gets.
class ScriptEnvironment final : public Environment {
 public:
  explicit ScriptEnvironment(std::vector<std::string> turns)
      : turns_(std::move(turns)) {}
  class Ep final : public Episode {
   public:
    explicit Ep(ScriptEnvironment* env) : env_(env) {}
    absl::StatusOr<Observation> Step(const AssistantTurn& turn,
                                     absl::Time) override {
      env_->seen.push_back(turn);
      Observation o;
      o.done = turn.tool_calls.empty() && turn.call_errors.empty();
      if (o.done) o.reward = 0.5;
      for (const ToolCall& call : turn.tool_calls) {
        o.messages.push_back({"tool", "ok " + call.name});
      }
      return o;
    }
    ScriptEnvironment* env_;
  };
  absl::StatusOr<std::unique_ptr<Episode>> Open(const Problem&, uint64_t,
                                                absl::Time,
                                                EpisodeStart* start) override {
    ToolSpec calc;
    calc.name = "calc";
    calc.parameters_json =
        R"({"type":"object","properties":{"expression":{"type":"string"}}})";
    start->tools = {calc};
    return std::unique_ptr<Episode>(new Ep(this));
  }
  std::optional<std::string> Demonstrate(
      const Problem&,
      const std::vector<ChatMessage>& conversation) const override {
    size_t turn = 0;
    for (const auto& m : conversation) turn += m.role == "assistant";
    if (turn >= turns_.size()) return std::nullopt;
    return turns_[turn];
  }
  std::vector<AssistantTurn> seen;

 private:
  std::vector<std::string> turns_;
};

TEST(AgentLoopTest, MalformedAndUnknownToolCallsBecomeErrorsTheModelReads) {
  JobConfig c = CalculatorJob();
  JobContext ctx = Prepare(c);
  auto env = std::make_shared<ScriptEnvironment>(
      std::vector<std::string>{"[search cats]", "[calc 1+1] [calc", "7"});
  ctx.environment = env;
  absl::StatusOr<Sample> s = DemonstrationSample(ctx, Problem{"1+1=", "2"}, 3);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(env->seen.size(), 3u);
  EXPECT_TRUE(env->seen[0].tool_calls.empty());
  ASSERT_EQ(env->seen[0].call_errors.size(), 1u);
  EXPECT_NE(env->seen[0].call_errors[0].find("unknown tool 'search'"),
            std::string::npos)
      << env->seen[0].call_errors[0];
  EXPECT_EQ(env->seen[1].tool_calls.size(), 1u);
  EXPECT_EQ(env->seen[1].call_errors.size(), 1u);
  const std::string layout = Layout(ctx, *s);
  // The error reaches the model as an environment message.
  EXPECT_NE(layout.find("{(}{e}{r}{r}{o}{r}{:}"), std::string::npos) << layout;
  EXPECT_NE(layout.find("{(}{o}{k}{ }{c}{a}{l}{c}{)}"), std::string::npos)
      << layout;
  EXPECT_EQ(s->reward, 0.5);
}

// An environment that fails: Step returns an error, or never answers in
// time.
class FailingEnvironment final : public Environment {
 public:
  enum class Mode { kError, kHang, kOpenError };
  explicit FailingEnvironment(Mode mode) : mode_(mode) {}
  class Ep final : public Episode {
   public:
    explicit Ep(Mode mode) : mode_(mode) {}
    absl::StatusOr<Observation> Step(const AssistantTurn&,
                                     absl::Time) override {
      if (mode_ == Mode::kHang) {
        std::this_thread::sleep_for(std::chrono::milliseconds(3500));
      }
      return absl::UnavailableError("environment server gone");
    }
    Mode mode_;
  };
  absl::StatusOr<std::unique_ptr<Episode>> Open(const Problem&, uint64_t,
                                                absl::Time,
                                                EpisodeStart*) override {
    if (mode_ == Mode::kOpenError) {
      return absl::UnavailableError("connection refused");
    }
    return std::unique_ptr<Episode>(new Ep(mode_));
  }

 private:
  Mode mode_;
};

TEST(AgentLoopTest, AFailedOrHungEnvironmentFailsItsEpisodesAndTheRunGoesOn) {
  for (auto mode :
       {FailingEnvironment::Mode::kError, FailingEnvironment::Mode::kHang,
        FailingEnvironment::Mode::kOpenError}) {
    JobConfig c = CalculatorJob();
    c.env.call_deadline_seconds = 0.3;
    JobContext ctx = Prepare(c);
    ctx.env = c.env;
    ctx.environment = std::make_shared<FailingEnvironment>(mode);
    std::vector<Problem> problems(4, Problem{"12*34=", "408"});
    std::vector<SequenceKey> keys;
    for (int64_t i = 0; i < 4; ++i) keys.push_back({1, i, 0, 0});
    SamplingParams params;
    params.max_new_tokens = 6;
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<EpisodeBatch> out =
        AgentLoop(ctx).Run(*ctx.policy, problems, keys, params);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->samples.size(), 4u);
    for (const Sample& s : out->samples) {
      EXPECT_TRUE(s.episode.env_failed);
      EXPECT_EQ(s.reward, 0.0);
      EXPECT_FALSE(s.finished);
      ASSERT_EQ(s.loss_mask.size(), s.response_ids.size());
    }
    EXPECT_EQ(
        std::count_if(out->samples.begin(), out->samples.end(),
                      [](const Sample& s) { return s.episode.env_failed; }),
        4);
    // The hung calls are abandoned at their deadline (+ the grace), the
    // pool then waits for them to return (3.5 s).
    EXPECT_LT(seconds, 10.0);
  }
}

// Opens with a user turn too long for the model for one problem.
class LongOpeningEnvironment final : public Environment {
 public:
  absl::StatusOr<std::unique_ptr<Episode>> Open(const Problem& problem,
                                                uint64_t seed, absl::Time t,
                                                EpisodeStart* start) override {
    auto episode = calculator_->Open(problem, seed, t, start);
    if (problem.answer == "long") {
      start->messages = {{"user", std::string(100, 'x')}};
    }
    return episode;
  }
  static EnvConfig Calculator() {
    EnvConfig c;
    c.name = "calculator";
    return c;
  }
  std::unique_ptr<Environment> calculator_ =
      EnvironmentRegistry::Global().Create(Calculator()).value();
};

TEST(AgentLoopTest, AnOpeningTooLongForTheModelFailsItsEpisodeOnly) {
  JobConfig c = CalculatorJob();
  JobContext ctx = Prepare(c);
  ctx.environment = std::make_shared<LongOpeningEnvironment>();
  std::vector<Problem> problems = {Problem{"12*34=", "408"},
                                   Problem{"1*1=", "long"}};
  std::vector<SequenceKey> keys = {{1, 0, 0, 0}, {1, 1, 0, 0}};
  SamplingParams params;
  params.max_new_tokens = 6;
  absl::StatusOr<EpisodeBatch> out =
      AgentLoop(ctx).Run(*ctx.policy, problems, keys, params);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->samples[0].episode.env_failed);
  EXPECT_GE(out->samples[0].episode.turns, 1);
  const Sample& failed = out->samples[1];
  EXPECT_TRUE(failed.episode.env_failed);
  // Within the model, every token masked.
  EXPECT_LE(failed.prompt_ids.size() + failed.response_ids.size(), 64u);
  EXPECT_EQ(failed.loss_mask, std::vector<uint8_t>{0});
}

TEST(AgentLoopTest, CalculatorEpisodesAreReproducibleAndMaskedRight) {
  JobConfig c = CalculatorJob();
  JobContext ctx = Prepare(c);
  std::vector<Problem> problems;
  for (uint64_t i = 0; i < 6; ++i) {
    problems.push_back(ctx.task->TrainProblem(i));
  }
  std::vector<SequenceKey> keys;
  for (int64_t i = 0; i < 6; ++i) keys.push_back({17, i, 0, 0});
  SamplingParams params;
  params.max_new_tokens = 12;
  auto a = AgentLoop(ctx).Run(*ctx.policy, problems, keys, params, 2);
  auto b = AgentLoop(ctx).Run(*ctx.policy, problems, keys, params, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  for (size_t i = 0; i < problems.size(); ++i) {
    const Sample& x = a->samples[i];
    const Sample& y = b->samples[i];
    EXPECT_EQ(x.response_ids, y.response_ids) << i;
    EXPECT_EQ(x.loss_mask, y.loss_mask) << i;
    EXPECT_EQ(x.reward, y.reward) << i;
    ASSERT_EQ(x.loss_mask.size(), x.response_ids.size());
    ASSERT_EQ(x.behaviour_logp.size(), x.response_ids.size());
    for (size_t t = 0; t < x.loss_mask.size(); ++t) {
      if (!x.loss_mask[t]) {
        EXPECT_EQ(x.behaviour_logp[t], 0.0f);
      }
    }
    EXPECT_GE(x.episode.turns, 1);
    EXPECT_LE(x.episode.turns, c.env.max_turns);
  }
}

}  // namespace
}  // namespace fusionrl
