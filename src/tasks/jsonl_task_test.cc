// Task tests: the jsonl task (records, held-out eval lines, epochs, errors).
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

}  // namespace
}  // namespace fusionrl
