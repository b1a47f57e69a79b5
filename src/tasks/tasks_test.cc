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

namespace fusionrl {
namespace {

// ---------------------------------------------------------------- helpers

TaskConfig Config(const std::string& name) {
  TaskConfig c;
  c.name = name;
  return c;
}

std::unique_ptr<Task> MustCreate(const TaskConfig& config) {
  absl::StatusOr<std::unique_ptr<Task>> task =
      TaskRegistry::Global().Create(config);
  EXPECT_TRUE(task.ok()) << task.status();
  return task.ok() ? *std::move(task) : nullptr;
}

Verdict Score(const std::string& reward, const Problem& problem,
              const std::string& response) {
  absl::StatusOr<std::unique_ptr<RewardFn>> fn =
      RewardRegistry::Global().Create(reward);
  EXPECT_TRUE(fn.ok()) << fn.status();
  return fn.ok() ? (*fn)->Score(problem, response) : Verdict{};
}

bool Correct(const std::string& reward, const Problem& problem,
             const std::string& response) {
  const Verdict v = Score(reward, problem, response);
  EXPECT_EQ(v.correct, v.reward == 1.0);
  EXPECT_TRUE(v.reward == 0.0 || v.reward == 1.0);
  return v.correct;
}

testing::AssertionResult HasMessage(const absl::Status& status,
                                    absl::StatusCode code,
                                    const std::string& substring) {
  if (status.code() != code ||
      std::string(status.message()).find(substring) == std::string::npos) {
    return testing::AssertionFailure()
           << "got " << status << ", want code "
           << absl::StatusCodeToString(code) << " and message containing \""
           << substring << "\"";
  }
  return testing::AssertionSuccess();
}

// ------------------------------------------------ synthetic tasks (common)

// A built-in synthetic task and a config with a small problem space, where
// eval prompts make up a large part of it.
struct SyntheticCase {
  std::string name;
  TaskConfig small;
};

std::vector<SyntheticCase> SyntheticCases() {
  TaskConfig addition = Config("addition");  // 100 problems
  addition.min_digits = addition.max_digits = 1;
  addition.eval_size = 50;
  TaskConfig reverse = Config("reverse");  // 676 problems
  reverse.min_digits = reverse.max_digits = 2;
  reverse.eval_size = 300;
  TaskConfig sort = Config("sort");  // 1110 problems
  sort.min_digits = 1;
  sort.max_digits = 3;
  sort.eval_size = 400;
  TaskConfig countdown = Config("countdown");  // < 300 problems
  countdown.num_operands = 2;
  countdown.max_operand = 10;
  countdown.eval_size = 80;
  TaskConfig repeat = Config("repeat");  // 702 problems
  repeat.min_digits = repeat.max_digits = 1;
  repeat.long_fraction = 0.0;
  repeat.eval_size = 300;
  return {{"addition", addition},
          {"reverse", reverse},
          {"sort", sort},
          {"countdown", countdown},
          {"repeat", repeat}};
}

class SyntheticTaskTest : public testing::TestWithParam<SyntheticCase> {};

INSTANTIATE_TEST_SUITE_P(Builtins, SyntheticTaskTest,
                         testing::ValuesIn(SyntheticCases()),
                         [](const testing::TestParamInfo<SyntheticCase>& info) {
                           return info.param.name;
                         });

TEST_P(SyntheticTaskTest, ReportsNameAndDefaultReward) {
  const auto task = MustCreate(Config(GetParam().name));
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->name(), GetParam().name);
  EXPECT_EQ(task->default_reward(),
            GetParam().name == "countdown" ? "countdown" : "exact");
}

TEST_P(SyntheticTaskTest, IsDeterministicInSeedAndIndex) {
  TaskConfig config = Config(GetParam().name);
  const auto a = MustCreate(config);
  const auto b = MustCreate(config);
  config.seed += 1;
  const auto other = MustCreate(config);
  ASSERT_TRUE(a && b && other);
  int differing = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    const Problem pa = a->TrainProblem(i);
    const Problem pb = b->TrainProblem(i);
    EXPECT_EQ(pa.prompt, pb.prompt);
    EXPECT_EQ(pa.answer, pb.answer);
    // Calling again (out of order) gives the same problem.
    EXPECT_EQ(a->TrainProblem(i).prompt, pa.prompt);
    differing += other->TrainProblem(i).prompt != pa.prompt;
  }
  EXPECT_GT(differing, 50);
  ASSERT_EQ(a->eval_set().size(), b->eval_set().size());
  for (size_t i = 0; i < a->eval_set().size(); ++i) {
    EXPECT_EQ(a->eval_set()[i].prompt, b->eval_set()[i].prompt);
  }
  EXPECT_NE(a->eval_set()[0].prompt + a->eval_set()[1].prompt,
            other->eval_set()[0].prompt + other->eval_set()[1].prompt);
}

TEST_P(SyntheticTaskTest, ConsecutiveIndicesVary) {
  const auto task = MustCreate(Config(GetParam().name));
  ASSERT_NE(task, nullptr);
  std::set<std::string> prompts;
  for (uint64_t i = 0; i < 100; ++i) {
    prompts.insert(task->TrainProblem(i).prompt);
  }
  EXPECT_GT(prompts.size(), 80u);
}

TEST_P(SyntheticTaskTest, SolutionScoresOneUnderDefaultReward) {
  for (const TaskConfig& config : {Config(GetParam().name), GetParam().small}) {
    const auto task = MustCreate(config);
    ASSERT_NE(task, nullptr);
    auto reward = RewardRegistry::Global().Create(task->default_reward());
    ASSERT_TRUE(reward.ok()) << reward.status();
    std::vector<Problem> problems = task->eval_set();
    for (uint64_t i = 0; i < 300; ++i) {
      problems.push_back(task->TrainProblem(i));
    }
    for (const Problem& p : problems) {
      const Verdict v = (*reward)->Score(p, task->Solution(p));
      EXPECT_EQ(v.reward, 1.0) << p.prompt << " " << p.answer;
      EXPECT_TRUE(v.correct);
      EXPECT_FALSE((*reward)->Score(p, task->Solution(p) + "1").correct)
          << p.prompt;
    }
  }
}

TEST_P(SyntheticTaskTest, EvalSetHasEvalSizeDistinctPrompts) {
  for (int eval_size : {0, 1, 37, 200}) {
    TaskConfig config = Config(GetParam().name);
    config.eval_size = eval_size;
    const auto task = MustCreate(config);
    ASSERT_NE(task, nullptr);
    std::set<std::string> prompts;
    for (const Problem& p : task->eval_set()) prompts.insert(p.prompt);
    EXPECT_EQ(task->eval_set().size(), static_cast<size_t>(eval_size));
    EXPECT_EQ(prompts.size(), static_cast<size_t>(eval_size));
  }
}

TEST_P(SyntheticTaskTest, TrainingNeverUsesEvalPrompts) {
  const auto task = MustCreate(GetParam().small);
  ASSERT_NE(task, nullptr);
  absl::flat_hash_set<std::string> eval;
  for (const Problem& p : task->eval_set()) eval.insert(p.prompt);
  ASSERT_EQ(eval.size(), static_cast<size_t>(GetParam().small.eval_size));
  std::set<std::string> seen;
  for (uint64_t i = 0; i < 20000; ++i) {
    const Problem p = task->TrainProblem(i);
    ASSERT_FALSE(eval.contains(p.prompt)) << "index " << i << ": " << p.prompt;
    seen.insert(p.prompt);
  }
  // The rest of the (small) space is still visited.
  EXPECT_GT(seen.size(), eval.size() / 2);
}

TEST_P(SyntheticTaskTest, DefaultPromptsAreEncodableAndShort) {
  const auto task = MustCreate(Config(GetParam().name));
  const auto tokenizer = MakeCharTokenizer();
  ASSERT_NE(task, nullptr);
  for (uint64_t i = 0; i < 2000; ++i) {
    const Problem p = task->TrainProblem(i);
    const auto ids = tokenizer->Encode(p.prompt + task->Solution(p));
    ASSERT_TRUE(ids.ok()) << ids.status();
    // bos + prompt + response + eos within the default max_seq_len.
    EXPECT_LE(ids->size() + 2, static_cast<size_t>(ModelConfig{}.max_seq_len));
  }
}

TEST_P(SyntheticTaskTest, ConcurrentCallsAgreeWithSequentialOnes) {
  const auto task = MustCreate(GetParam().small);
  ASSERT_NE(task, nullptr);
  std::vector<std::string> want(400);
  for (uint64_t i = 0; i < want.size(); ++i) {
    want[i] = task->TrainProblem(i).prompt;
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = t; i < want.size(); i += 3) {
        mismatches[t] += task->TrainProblem(i).prompt != want[i];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

// ------------------------------------------------------- task formats

TEST(AdditionTaskTest, MatchesFormat) {
  TaskConfig config = Config("addition");
  config.min_digits = 2;
  config.max_digits = 4;
  const auto task = MustCreate(config);
  ASSERT_NE(task, nullptr);
  const std::regex re("(0|[1-9][0-9]*)\\+(0|[1-9][0-9]*)=");
  std::set<size_t> lengths;
  for (uint64_t i = 0; i < 2000; ++i) {
    const Problem p = task->TrainProblem(i);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(p.prompt, m, re)) << p.prompt;
    for (int k : {1, 2}) {
      EXPECT_GE(m[k].length(), 2);
      EXPECT_LE(m[k].length(), 4);
      lengths.insert(m[k].length());
    }
    EXPECT_EQ(p.answer,
              std::to_string(std::stoll(m[1].str()) + std::stoll(m[2].str())));
  }
  EXPECT_EQ(lengths, (std::set<size_t>{2, 3, 4}));
}

TEST(AdditionTaskTest, OneDigitOperandsIncludeZero) {
  TaskConfig config = Config("addition");
  config.min_digits = config.max_digits = 1;
  config.eval_size = 10;
  const auto task = MustCreate(config);
  ASSERT_NE(task, nullptr);
  bool zero = false;
  for (uint64_t i = 0; i < 2000; ++i) {
    const Problem p = task->TrainProblem(i);
    ASSERT_TRUE(std::regex_match(p.prompt, std::regex("[0-9]\\+[0-9]=")));
    zero |= p.prompt[0] == '0' || p.prompt[2] == '0';
  }
  EXPECT_TRUE(zero);
}

TEST(ReverseTaskTest, MatchesFormat) {
  TaskConfig config = Config("reverse");
  config.min_digits = 3;
  config.max_digits = 6;
  const auto task = MustCreate(config);
  ASSERT_NE(task, nullptr);
  const std::regex re("rev:([a-z]{3,6})=");
  std::set<char> letters;
  for (uint64_t i = 0; i < 2000; ++i) {
    const Problem p = task->TrainProblem(i);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(p.prompt, m, re)) << p.prompt;
    const std::string s = m[1].str();
    EXPECT_EQ(p.answer, std::string(s.rbegin(), s.rend()));
    letters.insert(s.begin(), s.end());
  }
  EXPECT_EQ(letters.size(), 26u);
}

TEST(SortTaskTest, MatchesFormat) {
  TaskConfig config = Config("sort");
  config.min_digits = 2;
  config.max_digits = 5;
  const auto task = MustCreate(config);
  ASSERT_NE(task, nullptr);
  const std::regex re("sort:([0-9]{2,5})=");
  for (uint64_t i = 0; i < 2000; ++i) {
    const Problem p = task->TrainProblem(i);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(p.prompt, m, re)) << p.prompt;
    std::string s = m[1].str();
    std::sort(s.begin(), s.end());
    EXPECT_EQ(p.answer, s);
  }
}

TEST(CountdownTaskTest, MatchesFormat) {
  for (const auto& [operands, max_operand] :
       std::vector<std::pair<int, int>>{{1, 20}, {3, 20}, {4, 50}, {8, 9999}}) {
    TaskConfig config = Config("countdown");
    config.num_operands = operands;
    config.max_operand = max_operand;
    config.eval_size = operands == 1 ? 5 : 200;
    const auto task = MustCreate(config);
    ASSERT_NE(task, nullptr);
    const std::regex re(
        absl::StrCat("[0-9]+(,[0-9]+){", operands - 1, "}>[0-9]+="));
    std::set<char> ops;
    for (uint64_t i = 0; i < 500; ++i) {
      const Problem p = task->TrainProblem(i);
      ASSERT_TRUE(std::regex_match(p.prompt, re)) << p.prompt;
      const auto prompt = tasks::ParseCountdownPrompt(p.prompt);
      ASSERT_TRUE(prompt.ok()) << prompt.status();
      ASSERT_EQ(prompt->numbers.size(), static_cast<size_t>(operands));
      for (int64_t n : prompt->numbers) {
        EXPECT_GE(n, 1);
        EXPECT_LE(n, max_operand);
      }
      EXPECT_GE(prompt->target, 1);
      EXPECT_LE(prompt->target, 9999);
      // The answer is the drawn expression: every number once, no parens.
      EXPECT_TRUE(
          std::regex_match(p.answer, std::regex("[0-9]+([-+*][0-9]+)*")))
          << p.answer;
      std::vector<int64_t> used;
      const auto value = tasks::EvalCountdownExpression(p.answer, &used);
      ASSERT_TRUE(value.ok()) << p.answer;
      EXPECT_EQ(*value, prompt->target);
      std::vector<int64_t> given = prompt->numbers;
      std::sort(given.begin(), given.end());
      std::sort(used.begin(), used.end());
      EXPECT_EQ(used, given);
      for (char c : p.answer) {
        if (c == '+' || c == '-' || c == '*') ops.insert(c);
      }
    }
    if (operands >= 3) {
      EXPECT_EQ(ops.size(), 3u);
    }
  }
}

// Parses "rep:<pattern>*<n>=" into pattern and n; false if malformed.
bool ParseRepeatPrompt(const std::string& prompt, std::string* pattern,
                       int* n) {
  static const std::regex re("rep:([a-z]{1,2})\\*([1-9][0-9]*)=");
  std::smatch m;
  if (!std::regex_match(prompt, m, re)) return false;
  *pattern = m[1].str();
  *n = std::stoi(m[2].str());
  return true;
}

std::string Repeated(const std::string& pattern, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += pattern;
  return s;
}

TEST(RepeatTaskTest, AnswerIsThePatternRepeatedNTimes) {
  const auto task = MustCreate(Config("repeat"));
  ASSERT_NE(task, nullptr);
  std::set<char> letters;
  std::set<int> counts;
  std::set<size_t> pattern_lengths;
  std::vector<Problem> problems = task->eval_set();
  for (uint64_t i = 0; i < 2000; ++i) problems.push_back(task->TrainProblem(i));
  for (const Problem& p : problems) {
    std::string pattern;
    int n = 0;
    ASSERT_TRUE(ParseRepeatPrompt(p.prompt, &pattern, &n)) << p.prompt;
    EXPECT_EQ(p.answer, Repeated(pattern, n)) << p.prompt;
    EXPECT_EQ(p.answer.size(), pattern.size() * n);
    // Short counts are 1..max_digits (3), long ones 12..long_max (24).
    EXPECT_TRUE((n >= 1 && n <= 3) || (n >= 12 && n <= 24)) << p.prompt;
    letters.insert(pattern.begin(), pattern.end());
    counts.insert(n);
    pattern_lengths.insert(pattern.size());
  }
  EXPECT_EQ(letters.size(), 26u);
  EXPECT_EQ(counts.size(), 3u + 13u);
  EXPECT_EQ(pattern_lengths, (std::set<size_t>{1, 2}));
}

TEST(RepeatTaskTest, AnswerLengthsHaveALongTail) {
  const TaskConfig config = Config("repeat");
  ASSERT_EQ(config.long_fraction, 0.125);
  ASSERT_EQ(config.long_max, 24);
  const auto task = MustCreate(config);
  ASSERT_NE(task, nullptr);
  constexpr int kProblems = 2000;
  std::vector<size_t> lengths;
  for (uint64_t i = 0; i < kProblems; ++i) {
    lengths.push_back(task->TrainProblem(i).answer.size());
  }
  std::sort(lengths.begin(), lengths.end());
  // Short answers are at most 2 * 3 = 6 chars, long ones at least 12.
  const auto long_count =
      std::count_if(lengths.begin(), lengths.end(),
                    [](size_t length) { return length >= 12; });
  const double long_share = static_cast<double>(long_count) / kProblems;
  EXPECT_GT(long_share, 0.08);
  EXPECT_LT(long_share, 0.17);
  EXPECT_LE(lengths[kProblems / 2], 6u);  // median
  EXPECT_GE(lengths.back(), 44u);
  EXPECT_LE(lengths.back(), 48u);  // 2 * long_max
  // Nothing between the short and the long ranges.
  for (size_t length : lengths) {
    EXPECT_TRUE(length <= 6 || length >= 12) << length;
  }
}

TEST(RepeatTaskTest, LongFractionAndLongMaxAreHonored) {
  TaskConfig config = Config("repeat");
  config.long_fraction = 0.0;
  const auto short_only = MustCreate(config);
  config.long_fraction = 1.0;
  config.long_max = 9;  // counts 5..9
  const auto long_only = MustCreate(config);
  ASSERT_TRUE(short_only && long_only);
  std::set<int> short_counts;
  std::set<int> long_counts;
  for (uint64_t i = 0; i < 1000; ++i) {
    std::string pattern;
    int n = 0;
    ASSERT_TRUE(
        ParseRepeatPrompt(short_only->TrainProblem(i).prompt, &pattern, &n));
    short_counts.insert(n);
    ASSERT_TRUE(
        ParseRepeatPrompt(long_only->TrainProblem(i).prompt, &pattern, &n));
    long_counts.insert(n);
  }
  EXPECT_EQ(short_counts, (std::set<int>{1, 2, 3}));
  EXPECT_EQ(long_counts, (std::set<int>{5, 6, 7, 8, 9}));
}

TEST(RepeatTaskTest, CharMatchGivesPartialCreditForATruncatedAnswer) {
  const Problem p{"rep:ab*4=", "abababab"};
  EXPECT_TRUE(Correct("exact", p, "abababab"));
  EXPECT_FALSE(Correct("exact", p, "abab"));
  const Verdict half = Score("char_match", p, "abab");
  EXPECT_DOUBLE_EQ(half.reward, 0.5);
  EXPECT_FALSE(half.correct);
}

// ------------------------------------------------- construction errors

TEST(SyntheticTaskErrorsTest, EvalSizeLargerThanProblemSpace) {
  TaskConfig config = Config("addition");
  config.min_digits = config.max_digits = 1;  // 10 * 10 problems
  config.eval_size = 150;
  auto task = TaskRegistry::Global().Create(config);
  ASSERT_FALSE(task.ok());
  EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(task.status().message(),
            "task.eval_size: only 100 distinct addition problems could be "
            "drawn; lower task.eval_size or widen the task");

  config = Config("reverse");
  config.min_digits = config.max_digits = 1;
  config.eval_size = 27;
  EXPECT_TRUE(HasMessage(TaskRegistry::Global().Create(config).status(),
                         absl::StatusCode::kInvalidArgument,
                         "only 26 distinct reverse problems"));
}

TEST(SyntheticTaskErrorsTest, EvalSplitCoveringTheWholeSpace) {
  TaskConfig config = Config("addition");
  config.min_digits = config.max_digits = 1;
  config.eval_size = 100;
  EXPECT_TRUE(HasMessage(TaskRegistry::Global().Create(config).status(),
                         absl::StatusCode::kInvalidArgument,
                         "task.eval_size: the eval split (100 prompts) covers "
                         "(nearly) the whole addition problem space"));
  config = Config("sort");
  config.min_digits = config.max_digits = 1;
  config.eval_size = 10;
  EXPECT_TRUE(HasMessage(TaskRegistry::Global().Create(config).status(),
                         absl::StatusCode::kInvalidArgument,
                         "covers (nearly) the whole sort problem space"));
}

TEST(SyntheticTaskErrorsTest, RejectsBadRanges) {
  struct Case {
    std::string task;
    void (*edit)(TaskConfig*);
    std::string key;
  };
  const Case cases[] = {
      {"addition", [](TaskConfig* c) { c->min_digits = 0; }, "task.min_digits"},
      {"addition", [](TaskConfig* c) { c->max_digits = 19; },
       "task.max_digits"},
      {"reverse", [](TaskConfig* c) { c->max_digits = 0; }, "task.min_digits"},
      {"sort", [](TaskConfig* c) { c->min_digits = 4; }, "task.max_digits"},
      {"countdown", [](TaskConfig* c) { c->num_operands = 0; },
       "task.num_operands"},
      {"countdown", [](TaskConfig* c) { c->max_operand = 0; },
       "task.max_operand"},
      {"repeat", [](TaskConfig* c) { c->min_digits = 0; }, "task.min_digits"},
      {"repeat", [](TaskConfig* c) { c->long_fraction = 1.5; },
       "task.long_fraction: must be in [0, 1] for the repeat task (got 1.5)"},
      {"repeat", [](TaskConfig* c) { c->long_fraction = -0.1; },
       "task.long_fraction"},
      {"repeat",
       [](TaskConfig* c) {
         c->long_fraction = std::numeric_limits<double>::quiet_NaN();
       },
       "task.long_fraction"},
      {"repeat", [](TaskConfig* c) { c->long_max = 0; },
       "task.long_max: must be in [1, 500] for the repeat task (got 0)"},
      {"repeat", [](TaskConfig* c) { c->long_max = 501; }, "task.long_max"},
      {"addition", [](TaskConfig* c) { c->eval_size = -1; },
       "task.eval_size: must be >= 0"},
      {"jsonl", [](TaskConfig* c) {}, "task.train_path"},
  };
  for (const Case& c : cases) {
    TaskConfig config = Config(c.task);
    c.edit(&config);
    EXPECT_TRUE(HasMessage(TaskRegistry::Global().Create(config).status(),
                           absl::StatusCode::kInvalidArgument, c.key))
        << c.task;
  }
}

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

// --------------------------------------------------------------- jsonl

class JsonlTaskTest : public testing::Test {
 protected:
  ~JsonlTaskTest() override {
    for (const std::string& path : paths_) std::remove(path.c_str());
  }

  std::string WriteFile(const std::string& name, const std::string& content) {
    const std::string path = absl::StrCat(
        testing::TempDir(), "fusionrl_tasks_test_", getpid(), "_",
        testing::UnitTest::GetInstance()->current_test_info()->name(), "_",
        name);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr) << path;
    if (f != nullptr) {
      std::fwrite(content.data(), 1, content.size(), f);
      std::fclose(f);
    }
    paths_.push_back(path);
    return path;
  }

  // n lines {"prompt": "<prefix>i", "answer": "a<i>"}.
  static std::string Lines(int n, const std::string& prefix = "q") {
    std::string s;
    for (int i = 0; i < n; ++i) {
      absl::StrAppend(&s, "{\"prompt\": \"", prefix, i, "\", \"answer\": \"a",
                      i, "\"}\n");
    }
    return s;
  }

  static TaskConfig JsonlConfig(const std::string& train,
                                const std::string& eval, int eval_size) {
    TaskConfig c = Config("jsonl");
    c.train_path = train;
    c.eval_path = eval;
    c.eval_size = eval_size;
    return c;
  }

  absl::Status CreateError(const TaskConfig& config) {
    return TaskRegistry::Global().Create(config).status();
  }

  // Prompts of TrainProblem(begin..end-1).
  static std::vector<std::string> Prompts(const Task& task, uint64_t begin,
                                          uint64_t end) {
    std::vector<std::string> out;
    for (uint64_t i = begin; i < end; ++i) {
      out.push_back(task.TrainProblem(i).prompt);
    }
    return out;
  }

 private:
  std::vector<std::string> paths_;
};

TEST_F(JsonlTaskTest, LoadsRecordsAndHoldsOutTheLastLines) {
  const std::string path = WriteFile(
      "train.jsonl",
      "\n{\"prompt\": \"what is 6*7?\", \"answer\": 42, \"id\": 1}\r\n"
      "   \n" +
          Lines(6) + "{\"prompt\": \"half\", \"answer\": 0.5}\n\n");
  const auto task = MustCreate(JsonlConfig(path, "", 3));
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->name(), "jsonl");
  EXPECT_EQ(task->default_reward(), "exact");
  ASSERT_EQ(task->eval_set().size(), 3u);
  EXPECT_EQ(task->eval_set()[0].prompt, "q4");
  EXPECT_EQ(task->eval_set()[0].answer, "a4");
  EXPECT_EQ(task->eval_set()[1].prompt, "q5");
  EXPECT_EQ(task->eval_set()[2].prompt, "half");
  EXPECT_EQ(task->eval_set()[2].answer, "0.5");
  // Training: the first 5 records, each once per epoch.
  std::vector<std::string> epoch0 = Prompts(*task, 0, 5);
  std::sort(epoch0.begin(), epoch0.end());
  EXPECT_EQ(epoch0,
            (std::vector<std::string>{"q0", "q1", "q2", "q3", "what is 6*7?"}));
  for (uint64_t i = 0; i < 5; ++i) {
    const Problem p = task->TrainProblem(i);
    if (p.prompt == "what is 6*7?") {
      EXPECT_EQ(p.answer, "42");
    } else if (p.prompt == "q2") {
      EXPECT_EQ(p.answer, "a2");
    }
  }
}

TEST_F(JsonlTaskTest, EvalSizeZeroTrainsOnEverything) {
  const auto task = MustCreate(JsonlConfig(WriteFile("t", Lines(4)), "", 0));
  ASSERT_NE(task, nullptr);
  EXPECT_TRUE(task->eval_set().empty());
  std::vector<std::string> all = Prompts(*task, 0, 4);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<std::string>{"q0", "q1", "q2", "q3"}));
}

TEST_F(JsonlTaskTest, ReadsEvalPath) {
  const std::string train = WriteFile("train", Lines(10));
  const std::string eval = WriteFile("eval", Lines(5, "e"));
  auto task = MustCreate(JsonlConfig(train, eval, 3));
  ASSERT_NE(task, nullptr);
  ASSERT_EQ(task->eval_set().size(), 3u);  // the first eval_size records
  EXPECT_EQ(task->eval_set()[0].prompt, "e0");
  EXPECT_EQ(task->eval_set()[2].prompt, "e2");
  std::set<std::string> train_prompts;
  for (const std::string& p : Prompts(*task, 0, 10)) train_prompts.insert(p);
  EXPECT_EQ(train_prompts.size(), 10u);  // nothing held out of train

  task = MustCreate(JsonlConfig(train, eval, 200));  // larger than the file
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->eval_set().size(), 5u);
}

TEST_F(JsonlTaskTest, DropsTrainingRecordsWithEvalPrompts) {
  const std::string train = WriteFile(
      "train", Lines(6) + "{\"prompt\": \"q1\", \"answer\": \"other\"}\n");
  const std::string eval =
      WriteFile("eval",
                "{\"prompt\": \"q1\", \"answer\": \"a1\"}\n"
                "{\"prompt\": \"q4\", \"answer\": \"a4\"}\n");
  const auto task = MustCreate(JsonlConfig(train, eval, 2));
  ASSERT_NE(task, nullptr);
  std::set<std::string> seen;
  for (const std::string& p : Prompts(*task, 0, 400)) seen.insert(p);
  EXPECT_EQ(seen, (std::set<std::string>{"q0", "q2", "q3", "q5"}));

  // Held-out lines duplicated earlier in the train file are dropped too.
  const std::string dup =
      WriteFile("dup", Lines(5) + "{\"prompt\": \"q0\", \"answer\": \"a0\"}\n");
  const auto held = MustCreate(JsonlConfig(dup, "", 1));
  ASSERT_NE(held, nullptr);
  seen.clear();
  for (const std::string& p : Prompts(*held, 0, 400)) seen.insert(p);
  EXPECT_EQ(seen, (std::set<std::string>{"q1", "q2", "q3", "q4"}));
}

TEST_F(JsonlTaskTest, ReshufflesEachEpochDeterministically) {
  const std::string train = WriteFile("train", Lines(20));
  TaskConfig config = JsonlConfig(train, "", 0);
  const auto a = MustCreate(config);
  const auto b = MustCreate(config);
  config.seed += 1;
  const auto other = MustCreate(config);
  ASSERT_TRUE(a && b && other);
  std::vector<std::vector<std::string>> epochs;
  for (uint64_t e = 0; e < 3; ++e) {
    std::vector<std::string> epoch = Prompts(*a, 20 * e, 20 * (e + 1));
    std::vector<std::string> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::string> want;
    for (int i = 0; i < 20; ++i) want.push_back(absl::StrCat("q", i));
    std::sort(want.begin(), want.end());
    EXPECT_EQ(sorted, want) << "epoch " << e << " is not a permutation";
    epochs.push_back(epoch);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  // Pure function of (seed, index), whatever the call order.
  EXPECT_EQ(Prompts(*b, 0, 60), Prompts(*a, 0, 60));
  EXPECT_EQ(Prompts(*b, 40, 60), epochs[2]);
  EXPECT_EQ(Prompts(*b, 0, 20), epochs[0]);
  EXPECT_EQ(a->TrainProblem(1000 * 20 + 7).prompt,
            b->TrainProblem(1000 * 20 + 7).prompt);
  EXPECT_NE(Prompts(*other, 0, 20), epochs[0]);
}

TEST_F(JsonlTaskTest, ConcurrentCallsAcrossEpochsAgreeWithSequentialOnes) {
  const auto task = MustCreate(JsonlConfig(WriteFile("t", Lines(7)), "", 0));
  ASSERT_NE(task, nullptr);
  const std::vector<std::string> want = Prompts(*task, 0, 700);
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (uint64_t i = t; i < want.size(); i += 4 + t) {
          mismatches[t] += task->TrainProblem(i).prompt != want[i];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST_F(JsonlTaskTest, MissingFilesAreNotFound) {
  const std::string missing =
      testing::TempDir() + "fusionrl_tasks_test_no_such_file.jsonl";
  absl::Status s = CreateError(JsonlConfig(missing, "", 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), missing + ": cannot open (No such file or directory)");

  s = CreateError(JsonlConfig(WriteFile("t", Lines(3)), missing, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), missing + ": cannot open (No such file or directory)");
}

TEST_F(JsonlTaskTest, BadLinesNameFileLineAndReason) {
  struct Case {
    std::string content;
    std::string message;  // after "<path>:"
  };
  const std::string good = "{\"prompt\": \"p\", \"answer\": \"a\"}\n";
  const std::vector<Case> cases = {
      {good + "\n{\"prompt\": \"x\", \"answer\": }\n",
       "3: invalid JSON at column "},
      {good + "{\"prompt\": \"x\"\n", "2: invalid JSON at column "},
      {"{\"answer\": \"a\"}\n", "1: missing \"prompt\""},
      {good + good + "{\"prompt\": 5, \"answer\": \"a\"}\n",
       "3: \"prompt\" must be a string, got number"},
      {"{\"prompt\": \"x\"}\n", "1: missing \"answer\""},
      {"{\"prompt\": \"x\", \"answer\": true}\n",
       "1: \"answer\" must be a string or a number, got boolean"},
      {"{\"prompt\": \"x\", \"answer\": null}\n",
       "1: \"answer\" must be a string or a number, got null"},
      {"[1, 2]\n", "1: expected a JSON object, got array"},
      {"{\"prompt\": \"\", \"answer\": \"a\"}\n", "1: \"prompt\" is empty"},
      {"{\"prompt\": \"x\", \"answer\": \"a\"} trailing\n",
       "1: invalid JSON at column "},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string path = WriteFile(absl::StrCat("bad", n++), c.content);
    const absl::Status s = CreateError(JsonlConfig(path, "", 0));
    EXPECT_TRUE(HasMessage(s, absl::StatusCode::kInvalidArgument,
                           path + ":" + c.message));
    // Also as the eval file.
    const absl::Status e = CreateError(
        JsonlConfig(WriteFile("train" + std::to_string(n), good), path, 1));
    EXPECT_TRUE(HasMessage(e, absl::StatusCode::kInvalidArgument,
                           path + ":" + c.message));
  }
  // The parser's reason is kept.
  const std::string path = WriteFile("reason", "{\"prompt\": \"x\", }\n");
  const std::string message(CreateError(JsonlConfig(path, "", 0)).message());
  EXPECT_EQ(message.rfind(path + ":1: invalid JSON at column 17: ", 0), 0u)
      << message;
}

TEST_F(JsonlTaskTest, TooFewRecordsToHoldOut) {
  const std::string path = WriteFile("t", Lines(3) + "\n\n");
  EXPECT_TRUE(HasMessage(CreateError(JsonlConfig(path, "", 3)),
                         absl::StatusCode::kInvalidArgument,
                         path + ": 3 records, but task.eval_size=3"));
  EXPECT_NE(MustCreate(JsonlConfig(path, "", 2)), nullptr);
}

TEST_F(JsonlTaskTest, EmptyOrFullyOverlappingFilesAreRejected) {
  const std::string empty = WriteFile("empty", "\n  \n");
  const std::string train = WriteFile("train", Lines(3));
  EXPECT_TRUE(HasMessage(CreateError(JsonlConfig(empty, train, 1)),
                         absl::StatusCode::kInvalidArgument,
                         empty + ": no records"));
  EXPECT_TRUE(HasMessage(CreateError(JsonlConfig(train, empty, 1)),
                         absl::StatusCode::kInvalidArgument,
                         empty + ": no records"));
  EXPECT_TRUE(HasMessage(CreateError(JsonlConfig(train, train, 5)),
                         absl::StatusCode::kInvalidArgument,
                         "all 3 training records have eval prompts"));
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
