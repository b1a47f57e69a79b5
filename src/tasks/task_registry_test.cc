// Task tests: the rewards (exact, numeric, countdown) and the task and
// reward registries.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "fusionrl/config.h"
#include "fusionrl/task.h"
#include "fusionrl/tokenizer.h"
#include "gtest/gtest.h"
#include "tasks/rewards.h"
#include "tasks/tasks_test_util.h"

namespace fusionrl {
namespace {

using tasks_testing::Config;
using tasks_testing::Correct;
using tasks_testing::HasMessage;
using tasks_testing::MustCreate;
using tasks_testing::Score;

// ------------------------------------------------------------- rewards

TEST(ExactRewardTest, ComparesTrimmedText) {
  const Problem p{"47+385=", "432"};
  EXPECT_TRUE(Correct("exact", p, "432"));
  EXPECT_TRUE(Correct("exact", p, "  432\n"));
  EXPECT_TRUE(Correct("exact", {"q", " 432 "}, "432"));
  EXPECT_FALSE(Correct("exact", p, "4321"));
  EXPECT_FALSE(Correct("exact", p, "43 2"));
  EXPECT_FALSE(Correct("exact", p, "432.0"));
  EXPECT_FALSE(Correct("exact", p, ""));
  EXPECT_FALSE(Correct("exact", {"q", "Abc"}, "abc"));
}

TEST(NumericRewardTest, AcceptsEqualNumbersInAnyNotation) {
  const Problem p{"q", "432"};
  for (const char* r : {"432", "432.0", "+432", " 432 ", "4.32e2", "432.",
                        "432.0000001", "4320e-1"}) {
    EXPECT_TRUE(Correct("numeric", p, r)) << r;
  }
  EXPECT_TRUE(Correct("numeric", {"q", "-0.5"}, "-.5"));
  EXPECT_TRUE(Correct("numeric", {"q", "0.1"}, "0.1000001"));
  EXPECT_TRUE(Correct("numeric", {"q", "1000000"}, "1000000.5"));
}

TEST(NumericRewardTest, RejectsOtherNumbersAndNonNumbers) {
  const Problem p{"q", "432"};
  for (const char* r :
       {"433", "432.01", "-432", "432abc", "abc", "", " ", "4 32", "0x1b0",
        "inf", "nan", "1e999", "432e", ".", "+", "--432", "432,0"}) {
    EXPECT_FALSE(Correct("numeric", p, r)) << r;
  }
  EXPECT_FALSE(Correct("numeric", {"q", "1000000"}, "1000002"));
  EXPECT_FALSE(Correct("numeric", {"q", "0.1"}, "0.100002"));
  EXPECT_FALSE(Correct("numeric", {"q", "n/a"}, "n/a"));
}

TEST(CountdownExpressionTest, EvaluatesWithPrecedence) {
  struct Case {
    const char* expr;
    int64_t value;
  };
  for (const Case& c : std::vector<Case>{{"7", 7},
                                         {"2+3*4", 14},
                                         {"(2+3)*4", 20},
                                         {"10-2-3", 5},
                                         {"10-(2-3)", 11},
                                         {"2*3-4*5", -14},
                                         {" ( 1 + 2 ) * ( 3 ) ", 9},
                                         {"((((5))))", 5}}) {
    std::vector<int64_t> used;
    const auto v = tasks::EvalCountdownExpression(c.expr, &used);
    ASSERT_TRUE(v.ok()) << c.expr << ": " << v.status();
    EXPECT_EQ(*v, c.value) << c.expr;
  }
  std::vector<int64_t> used;
  ASSERT_TRUE(tasks::EvalCountdownExpression("3*(10-4)+3", &used).ok());
  EXPECT_EQ(used, (std::vector<int64_t>{3, 10, 4, 3}));
}

TEST(CountdownExpressionTest, RejectsBadSyntaxAndOverflow) {
  for (const char* expr :
       {"", " ", "-3", "+3", "3+", "3**4", "(3", "3)", "()", "3 4", "3/4", "3x",
        "9223372036854775807+1", "99999999999999999999",
        "3037000500*3037000500", "0-9223372036854775807-2"}) {
    EXPECT_FALSE(tasks::EvalCountdownExpression(expr, nullptr).ok()) << expr;
  }
  const std::string deep =
      std::string(100000, '(') + "1" + std::string(100000, ')');
  EXPECT_FALSE(tasks::EvalCountdownExpression(deep, nullptr).ok());
  const std::string ok = std::string(64, '(') + "1" + std::string(64, ')');
  EXPECT_TRUE(tasks::EvalCountdownExpression(ok, nullptr).ok());
}

TEST(CountdownPromptTest, ParsesOnlyTheExactFormat) {
  const auto p = tasks::ParseCountdownPrompt("3,7,9>30=");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->numbers, (std::vector<int64_t>{3, 7, 9}));
  EXPECT_EQ(p->target, 30);
  for (const char* bad :
       {"", "3,7,9>30", "3,7,9=30=", ",3>4=", "3,,4>5=", "3,>5=", "3>=", ">5=",
        "a>5=", "3>5>6=", "3 >5=", "3>-5=", "="}) {
    EXPECT_FALSE(tasks::ParseCountdownPrompt(bad).ok()) << bad;
  }
}

TEST(CountdownRewardTest, AcceptsAnyCorrectExpression) {
  const Problem p{"3,7,9>30=", "7*3+9"};
  for (const char* r :
       {"7*3+9", "9+3*7", "(7*3)+9", " 3 * 7 + 9 ", "(9+(3*7))", "9+7*3"}) {
    EXPECT_TRUE(Correct("countdown", p, r)) << r;
  }
  EXPECT_TRUE(Correct("countdown", {"5,5,2>12=", ""}, "5+5+2"));
  EXPECT_TRUE(Correct("countdown", {"4,6>2=", ""}, "6-4"));
}

TEST(CountdownRewardTest, RejectsWrongValueOrWrongNumbers) {
  const Problem p{"3,7,9>30=", "7*3+9"};
  for (const char* r : {"7*3-9",      // wrong value
                        "3*7+9+9-9",  // 9 reused
                        "21+9",       // 21 is not given
                        "3*10",       // 7, 9 missing; 10 not given
                        "7*3+9+0",    // extra number
                        "7*3+09*1",   // extra number
                        "30", ""}) {
    EXPECT_FALSE(Correct("countdown", p, r)) << r;
  }
  EXPECT_FALSE(Correct("countdown", {"5,5,2>12=", ""}, "5*2+2"));
  EXPECT_FALSE(Correct("countdown", {"not a prompt", "1"}, "1"));
}

TEST(CountdownRewardTest, SurvivesRandomGarbage) {
  const auto reward = RewardRegistry::Global().Create("countdown");
  ASSERT_TRUE(reward.ok());
  std::mt19937_64 rng(42);
  const std::string charset = "0123456789+-*() ,>=()))((";
  std::string printable;
  for (char c = ' '; c <= '~'; ++c) printable.push_back(c);
  const Problem p{"3,7,9>30=", "7*3+9"};
  // Every 1000th string is a right answer with random spaces between its
  // characters, so the scorer must also keep saying yes amid the garbage.
  const std::vector<std::string> answers = {"7*3+9", "9+3*7", "(7*3)+9",
                                            "(9+(3*7))", "9+7*3"};
  int planted = 0, planted_correct = 0, garbage_correct = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string s;
    const bool plant = i % 1000 == 0;
    if (plant) {
      for (char c : answers[rng() % answers.size()]) {
        s += std::string(rng() % 3, ' ');
        s.push_back(c);
      }
      ++planted;
    } else {
      const std::string& chars = i % 4 == 0 ? printable : charset;
      s.assign(rng() % 24, ' ');
      for (char& c : s) c = chars[rng() % chars.size()];
    }
    const Verdict v = (*reward)->Score(p, s);
    if (plant) {
      EXPECT_TRUE(v.correct) << "'" << s << "'";
      if (v.correct) ++planted_correct;
    } else if (v.correct) {
      // A garbage string may only be right by being a right answer: it
      // evaluates to 30 and uses exactly 3, 7 and 9.
      ++garbage_correct;
      std::vector<int64_t> used;
      EXPECT_EQ(tasks::EvalCountdownExpression(s, &used).value_or(0), 30) << s;
      std::sort(used.begin(), used.end());
      EXPECT_EQ(used, (std::vector<int64_t>{3, 7, 9})) << s;
    }
    // Garbage prompts as well: no such prompt is a valid countdown prompt
    // whose answer is the prompt itself (a prompt has '>' and '=', which no
    // expression has), so none scores.
    EXPECT_FALSE((*reward)->Score({s, s}, s).correct) << s;
    (void)tasks::ParseCountdownPrompt(s);
  }
  EXPECT_EQ(planted, 200);
  EXPECT_EQ(planted_correct, planted);
  std::printf("countdown garbage judged correct: %d of %d\n", garbage_correct,
              200000 - planted);
}

// ------------------------------------------------------------ registry

// A user task: TrainProblem(i) = {"<i>?", "<i>"}.
class EchoTask final : public Task {
 public:
  std::string name() const override { return "echo"; }
  Problem TrainProblem(uint64_t index) const override {
    return {absl::StrCat(index, "?"), absl::StrCat(index)};
  }
  const std::vector<Problem>& eval_set() const override { return eval_; }
  std::string default_reward() const override { return "exact"; }

 private:
  std::vector<Problem> eval_ = {{"x?", "x"}};
};

TaskFactory EchoFactory() {
  return [](const TaskConfig&) -> absl::StatusOr<std::unique_ptr<Task>> {
    return std::make_unique<EchoTask>();
  };
}

TEST(RegistryTest, GlobalHasTheBuiltins) {
  EXPECT_EQ(
      TaskRegistry::Global().Names(),
      (std::vector<std::string>{"addition", "countdown", "jsonl", "math",
                                "multiply", "repeat", "reverse", "sort"}));
  const std::vector<std::string> rewards = RewardRegistry::Global().Names();
  for (const char* name : {"countdown", "exact", "math", "numeric"}) {
    EXPECT_NE(std::find(rewards.begin(), rewards.end(), name), rewards.end());
  }
}

TEST(RegistryTest, UnknownNamesListTheKnownOnes) {
  absl::Status s = TaskRegistry::Global().Create(Config("nope")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(),
            "task.name: unknown task 'nope' (known: addition, countdown, "
            "jsonl, math, multiply, repeat, reverse, sort)");

  TaskConfig config = Config("addition");
  config.reward = "nope";
  s = TaskRegistry::Global().Create(config).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message().substr(0, 54),
            "task.reward: unknown reward 'nope' (known: char_match,");
  EXPECT_EQ(RewardRegistry::Global().Create("nope").status().code(),
            absl::StatusCode::kNotFound);

  config.reward = "numeric";
  EXPECT_NE(MustCreate(config), nullptr);
}

TEST(RewardTest, CharMatchGivesPartialCreditAndExactCorrectness) {
  auto reward = RewardRegistry::Global().Create("char_match").value();
  const Problem p{"rev:abcd=", "dcba"};
  Verdict exact = reward->Score(p, " dcba ");
  EXPECT_DOUBLE_EQ(exact.reward, 1.0);
  EXPECT_TRUE(exact.correct);
  Verdict half = reward->Score(p, "dcxx");  // 2 of 4 positions
  EXPECT_DOUBLE_EQ(half.reward, 0.5);
  EXPECT_FALSE(half.correct);
  Verdict longer = reward->Score(p, "dcbaaa");  // 4 of max(6, 4)
  EXPECT_DOUBLE_EQ(longer.reward, 4.0 / 6.0);
  EXPECT_FALSE(longer.correct);
  EXPECT_DOUBLE_EQ(reward->Score(p, "").reward, 0.0);
}

TEST(RegistryTest, DuplicateRegistrationIsAlreadyExists) {
  EXPECT_EQ(TaskRegistry::Global().Register("addition", EchoFactory()).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(
      RewardRegistry::Global().Register("exact", tasks::MakeExactReward).code(),
      absl::StatusCode::kAlreadyExists);
  TaskRegistry registry;
  EXPECT_TRUE(registry.Register("echo", EchoFactory()).ok());
  EXPECT_EQ(registry.Register("echo", EchoFactory()).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(RegistryTest, RejectsEmptyNameOrFactory) {
  TaskRegistry tasks;
  EXPECT_EQ(tasks.Register("", EchoFactory()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tasks.Register("x", nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  RewardRegistry rewards;
  EXPECT_EQ(rewards.Register("x", nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(tasks.Names().empty());
  EXPECT_TRUE(rewards.Names().empty());
}

TEST(RegistryTest, UserRegisteredTaskAndRewardWork) {
  TaskRegistry registry;
  ASSERT_TRUE(registry.Register("echo", EchoFactory()).ok());
  EXPECT_EQ(registry.Names(), std::vector<std::string>{"echo"});
  absl::StatusOr<std::unique_ptr<Task>> task = registry.Create(Config("echo"));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ((*task)->TrainProblem(12).prompt, "12?");
  EXPECT_EQ((*task)->Solution((*task)->TrainProblem(12)), "12");
  EXPECT_EQ(registry.Create(Config("addition")).status().message(),
            "task.name: unknown task 'addition' (known: echo)");

  // A reward registered in the global registry can be named in task.reward.
  class AlwaysOne final : public RewardFn {
   public:
    Verdict Score(const Problem&, std::string_view) const override {
      return {1.0, true};
    }
  };
  const absl::Status status = RewardRegistry::Global().Register(
      "registry_test_always_one", [] { return std::make_unique<AlwaysOne>(); });
  EXPECT_TRUE(status.ok() || absl::IsAlreadyExists(status)) << status;
  TaskConfig config = Config("echo");
  config.reward = "registry_test_always_one";
  ASSERT_TRUE(registry.Create(config).ok());
  EXPECT_TRUE(Correct("registry_test_always_one", {"q", "a"}, "b"));
}

TEST(RegistryTest, ConcurrentUseIsSafe) {
  TaskRegistry registry;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&registry, t] {
      for (int i = 0; i < 50; ++i) {
        EXPECT_TRUE(
            registry.Register(absl::StrCat("t", t, "_", i), EchoFactory())
                .ok());
        EXPECT_TRUE(registry.Create(Config(absl::StrCat("t", t, "_", i))).ok());
        (void)registry.Names();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(registry.Names().size(), 200u);
}

}  // namespace
}  // namespace fusionrl
