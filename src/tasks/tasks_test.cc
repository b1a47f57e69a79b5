// Task tests: the built-in synthetic tasks (addition, reverse, sort,
// countdown, repeat) and their errors.
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

}  // namespace
}  // namespace fusionrl
