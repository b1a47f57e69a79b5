// AgentLoop: episodes against in-process environments (the calculator, and
// test environments that fail, hang or script their answers).
#include "engine/rollout/agent_loop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/jobs/job_setup.h"

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

// An environment that fails (not as unreachable: those are retried): Step
// returns an error, or never answers in time, or Open refuses.
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
      return absl::InternalError("environment server bug");
    }
    Mode mode_;
  };
  absl::StatusOr<std::unique_ptr<Episode>> Open(const Problem&, uint64_t,
                                                absl::Time,
                                                EpisodeStart*) override {
    if (mode_ == Mode::kOpenError) {
      return absl::InvalidArgumentError("problem refused");
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

// An environment with rewards of its own, below zero for a wrong answer
// (as format penalties are): a turn's trimmed content equal to the answer
// is done with 1.0; a first wrong answer gets the user's "no" (not done),
// a second is done with -0.25. An episode a limit cuts gets -0.75 (turns)
// or -0.5 (tokens). It records, per problem prompt, the reward it gave as
// its last word: the test's reference for what the sample must carry.
class NegativeRewardEnvironment final : public Environment {
 public:
  struct Record {
    double reward = 0;
    std::string how;        // "done", "cut turns", "cut tokens"
    bool cut_turn = false;  // the cut came inside a turn (Cut::turn)
    int verdicts = 0;       // how many last words it gave (1 expected)
  };
  class Ep final : public Episode {
   public:
    Ep(NegativeRewardEnvironment* env, Problem p) : env_(env), p_(p) {}
    absl::StatusOr<Observation> Step(const AssistantTurn& turn,
                                     absl::Time) override {
      Observation obs;
      const bool right = absl::StripAsciiWhitespace(turn.content) == p_.answer;
      if (!right && !told_) {
        told_ = true;
        obs.messages.push_back({"user", "no"});
        return obs;
      }
      obs.done = true;
      obs.reward = right ? 1.0 : -0.25;
      env_->Give(p_.prompt, *obs.reward, "done", false);
      return obs;
    }
    absl::StatusOr<Observation> Truncate(const Cut& cut, absl::Time) override {
      Observation obs;
      const bool turns = cut.reason == CutReason::kMaxTurns;
      obs.reward = turns ? -0.75 : -0.5;
      obs.metrics["cut"] = 1;
      env_->Give(p_.prompt, *obs.reward, turns ? "cut turns" : "cut tokens",
                 cut.turn.has_value());
      return obs;
    }

   private:
    NegativeRewardEnvironment* env_;
    Problem p_;
    bool told_ = false;
  };
  absl::StatusOr<std::unique_ptr<Episode>> Open(const Problem& p, uint64_t,
                                                absl::Time,
                                                EpisodeStart*) override {
    return std::unique_ptr<Episode>(new Ep(this, p));
  }
  void Give(const std::string& prompt, double reward, const std::string& how,
            bool cut_turn) {
    absl::MutexLock lock(&mu_);
    Record& r = records_[prompt];
    r.reward = reward;
    r.how = how;
    r.cut_turn = cut_turn;
    ++r.verdicts;
  }
  std::map<std::string, Record> records() {
    absl::MutexLock lock(&mu_);
    return records_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, Record> records_;
};

// Defect 6 of issue 52: an episode cut by env.max_turns, or by the token
// budget inside a turn, took reward 0 and never reached its environment.
// Each sample must carry the reward its environment gave as its last word.
TEST(AgentLoopTest, AnEpisodeALimitCutsGetsItsEnvironmentsReward) {
  struct Case {
    int max_turns;
    int max_episode_tokens;
    const char* cut;  // the cut every case must produce at least once
  };
  for (const Case& k : {Case{1, 0, "cut turns"}, Case{4, 3, "cut tokens"}}) {
    SCOPED_TRACE(k.cut);
    JobConfig c = CalculatorJob();
    c.env.max_turns = k.max_turns;
    c.env.max_episode_tokens = k.max_episode_tokens;
    JobContext ctx = Prepare(c);
    auto env = std::make_shared<NegativeRewardEnvironment>();
    ctx.environment = env;
    std::vector<Problem> problems;
    std::vector<SequenceKey> keys;
    for (int64_t i = 0; i < 8; ++i) {
      problems.push_back(
          Problem{absl::StrCat(i + 2, "*1="), std::to_string(i + 2)});
      keys.push_back({5, i, 0, 0});
    }
    SamplingParams params;
    params.max_new_tokens = 6;
    absl::StatusOr<EpisodeBatch> out =
        AgentLoop(ctx).Run(*ctx.policy, problems, keys, params);
    ASSERT_TRUE(out.ok()) << out.status();
    const std::map<std::string, NegativeRewardEnvironment::Record> given =
        env->records();
    int cuts = 0;
    for (size_t i = 0; i < problems.size(); ++i) {
      const Sample& s = out->samples[i];
      auto it = given.find(problems[i].prompt);
      ASSERT_NE(it, given.end())
          << "episode " << i << " ('" << Layout(ctx, s)
          << "') ended without its environment's last word; its reward: "
          << s.reward;
      EXPECT_EQ(it->second.verdicts, 1) << i;
      EXPECT_EQ(s.reward, it->second.reward) << i << " " << it->second.how;
      EXPECT_EQ(s.correct, it->second.reward > 0) << i;
      EXPECT_FALSE(s.episode.env_failed) << i;
      if (it->second.how != "done") {
        EXPECT_FALSE(s.finished) << i;
        EXPECT_EQ(s.episode.metrics.at("cut"), 1.0) << i;
        // A cut by turns comes after an answered turn, never inside one.
        if (it->second.how == "cut turns") {
          EXPECT_FALSE(it->second.cut_turn) << i;
        }
      }
      // Case 1: cut by max_turns; case 2: inside the first turn.
      cuts += it->second.how == k.cut &&
              it->second.cut_turn == (k.max_episode_tokens > 0);
    }
    EXPECT_GE(cuts, 1) << "no episode was cut as the case means to";
  }
}

// Unreachable (UNAVAILABLE) until `down_for` has passed since the first
// call, or forever; then every episode is one "7" turn, done with 1.0.
class DownEnvironment final : public Environment {
 public:
  explicit DownEnvironment(absl::Duration down_for) : down_for_(down_for) {}
  class Ep final : public Episode {
   public:
    absl::StatusOr<Observation> Step(const AssistantTurn&,
                                     absl::Time) override {
      Observation obs;
      obs.done = true;
      obs.reward = 1.0;
      return obs;
    }
  };
  absl::StatusOr<std::unique_ptr<Episode>> Open(const Problem&, uint64_t,
                                                absl::Time,
                                                EpisodeStart*) override {
    absl::MutexLock lock(&mu_);
    if (first_ == absl::InfinitePast()) first_ = absl::Now();
    ++opens_;
    if (absl::Now() - first_ < down_for_) {
      return absl::UnavailableError(
          "environment server 127.0.0.1:9: Open: UNAVAILABLE: connection "
          "refused");
    }
    ++served_;
    return std::unique_ptr<Episode>(new Ep());
  }
  int served() {
    absl::MutexLock lock(&mu_);
    return served_;
  }

 private:
  absl::Mutex mu_;
  const absl::Duration down_for_;
  absl::Time first_ = absl::InfinitePast();
  int opens_ = 0;
  int served_ = 0;
};

// Defect 7 of issue 52: an unreachable environment failed every episode
// and the run went on with nothing to train. Now Run waits for it (within
// env.unavailable_seconds) and runs the episodes again once it is back,
// or fails naming why once the budget is spent.
TEST(AgentLoopTest, AnUnreachableEnvironmentIsWaitedForOrFailsTheRun) {
  struct Case {
    absl::Duration down_for;
    double budget;
    bool recovers;
  };
  for (const Case& k : {Case{absl::Seconds(1.5), 10, true},
                        Case{absl::InfiniteDuration(), 2, false},
                        Case{absl::InfiniteDuration(), 0, false}}) {
    SCOPED_TRACE(k.budget);
    JobConfig c = CalculatorJob();
    c.env.unavailable_seconds = k.budget;
    JobContext ctx = Prepare(c);
    auto env = std::make_shared<DownEnvironment>(k.down_for);
    ctx.environment = env;
    std::vector<Problem> problems(4, Problem{"7*1=", "7"});
    std::vector<SequenceKey> keys;
    for (int64_t i = 0; i < 4; ++i) keys.push_back({1, i, 0, 0});
    SamplingParams params;
    params.max_new_tokens = 4;
    const absl::Time t0 = absl::Now();
    absl::StatusOr<EpisodeBatch> out =
        AgentLoop(ctx).Run(*ctx.policy, problems, keys, params);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    if (k.recovers) {
      ASSERT_TRUE(out.ok()) << out.status();
      for (const Sample& s : out->samples) {
        EXPECT_FALSE(s.episode.env_failed);
        EXPECT_EQ(s.reward, 1.0);
        EXPECT_TRUE(s.finished);
      }
      EXPECT_EQ(env->served(), 4);
      EXPECT_GE(seconds, 1.5);
    } else {
      ASSERT_FALSE(out.ok()) << "the run succeeded with the environment away";
      EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable);
      EXPECT_TRUE(absl::StrContains(out.status().message(), "127.0.0.1:9"))
          << out.status();
      EXPECT_TRUE(absl::StrContains(out.status().message(), "unreachable"))
          << out.status();
      EXPECT_GE(seconds, k.budget);
      EXPECT_LT(seconds, k.budget + 2);
    }
  }
}

}  // namespace
}  // namespace fusionrl
