// Tests of the math task (jsonl_task.h) and the math reward (rewards.h).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "fusionrl/config.h"
#include "fusionrl/task.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tasks/jsonl_task.h"
#include "tasks/rewards.h"
#include "template/chat_format.h"

namespace fusionrl::tasks {
namespace {

using ::testing::HasSubstr;

const std::string kSample =
    std::string(FUSIONRL_SOURCE_DIR) + "/tests/data/math_sample.jsonl";

// ---------------------------------------------------------------- reward

bool Correct(std::string_view response, const std::string& answer) {
  Problem p;
  p.prompt = "q";
  p.answer = answer;
  const std::unique_ptr<RewardFn> reward = MakeMathReward();
  const Verdict v = reward->Score(p, response);
  EXPECT_EQ(v.reward, v.correct ? 1.0 : 0.0);
  return v.correct;
}

std::string Extract(std::string_view response) {
  return ExtractMathAnswer(response).value_or("<none>");
}

TEST(MathRewardTest, ExtractsBoxedFirst) {
  EXPECT_EQ(Extract("so \\boxed{72}."), "72");
  EXPECT_EQ(Extract("\\boxed{1} then \\boxed{2} #### 3"), "2");  // last boxed
  EXPECT_EQ(Extract("\\boxed{\\frac{3}{4}}"), "\\frac{3}{4}");   // nested
  EXPECT_EQ(Extract("\\boxed{\\text{{a}} b}"), "\\text{{a}} b");
  EXPECT_EQ(Extract("\\fbox{ 5 }"), "5");
  EXPECT_EQ(Extract("\\boxed {9}"), "9");
  EXPECT_EQ(Extract("\\boxed{\\{1, 2\\}}"), "\\{1, 2\\}");  // literal braces
  // An unterminated box (cut off by max_new_tokens) does not count.
  EXPECT_EQ(Extract("\\boxed{4} and \\boxed{5"), "4");
  EXPECT_EQ(Extract("it is 6, \\boxed{"), "6");
  EXPECT_EQ(Extract("\\boxed{} 8"), "8");  // empty box ignored
}

TEST(MathRewardTest, ExtractsAfterHashesThenLastNumber) {
  EXPECT_EQ(Extract("3 + 4 = 7\n#### 7"), "7");
  EXPECT_EQ(Extract("#### 1 and #### 2 apples, 9 more"), "2");
  EXPECT_EQ(Extract("#### $1,234.50 total"), "$1,234.50");
  EXPECT_EQ(Extract("#### x + y\nrest"), "x + y");
  EXPECT_EQ(Extract("She has 3 cats and 12 dogs, so 15 pets."), "15");
  EXPECT_EQ(Extract("The answer is -3"), "-3");
  EXPECT_EQ(Extract("10-3=7"), "7");
  EXPECT_EQ(Extract("5-3"), "3");  // '-' after a digit is not a sign
  EXPECT_EQ(Extract("about 3/4 of it"), "3/4");
  EXPECT_EQ(Extract("value: .5"), ".5");
  EXPECT_EQ(Extract("1,2,3"), "3");  // commas group thousands only
  EXPECT_EQ(Extract("it is 72."), "72");
  EXPECT_EQ(Extract("it costs \\$5"), "\\$5");
  EXPECT_EQ(Extract("ratio \\dfrac{1}{2} here"), "\\dfrac{1}{2}");
  EXPECT_EQ(Extract("2e3 grams"), "2e3");
  EXPECT_EQ(Extract("3eggs"), "3");
}

TEST(MathRewardTest, ExtractsNothingFromTextWithoutNumbers) {
  EXPECT_FALSE(ExtractMathAnswer("").has_value());
  EXPECT_FALSE(ExtractMathAnswer("I don't know.").has_value());
  EXPECT_FALSE(ExtractMathAnswer("####").has_value());
  EXPECT_FALSE(ExtractMathAnswer("\\boxed{").has_value());
}

TEST(MathRewardTest, SearchesOnlyAfterThinking) {
  EXPECT_EQ(Extract("<think>maybe 5</think>It is 6."), "6");
  EXPECT_FALSE(ExtractMathAnswer("<think>maybe 5</think>no idea").has_value());
  // Still thinking (no </think>): no answer, whatever the thoughts name.
  EXPECT_FALSE(ExtractMathAnswer("<think>maybe 5 ...").has_value());
  EXPECT_FALSE(
      ExtractMathAnswer("<think>a</think>so <think>maybe 5").has_value());
}

// The thinking rule every reward's grading goes through (ScoreCompletion):
// the answer follows the last </think>; a block left open, by the response
// or by a generation prompt ending in "<think>\n", means no answer.
TEST(AnswerTextTest, GradesOnlyTextAfterClosedThinking) {
  EXPECT_EQ(AnswerText("42", false), "42");
  EXPECT_EQ(AnswerText("<think>7?</think> 42", false), " 42");
  EXPECT_EQ(AnswerText("7?</think>42", true), "42");
  EXPECT_EQ(AnswerText("7?</think>42", false), "42");
  EXPECT_FALSE(AnswerText("<think>maybe 42", false).has_value());
  EXPECT_FALSE(AnswerText("maybe 42", true).has_value());
  EXPECT_FALSE(AnswerText("<think>a</think>b<think>maybe 42", false));
  EXPECT_TRUE(EndsInsideThinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(EndsInsideThinking("<think>\n\n</think>\n\n"));
  EXPECT_FALSE(EndsInsideThinking("no tags"));
}

TEST(MathRewardTest, ScoresGsm8kResponses) {
  const std::string solution =
      "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
      "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and "
      "May.\n#### 72";
  EXPECT_TRUE(Correct(solution, "72"));
  EXPECT_TRUE(Correct(solution, solution));  // a reference with "####"
  EXPECT_TRUE(Correct("She sold 72 clips.", "72"));
  EXPECT_TRUE(Correct("The final answer is $\\boxed{72}$.", "72"));
  EXPECT_FALSE(Correct("She sold 71 clips.", "72"));
  EXPECT_FALSE(Correct("72 clips in May, 24 in April", "72"));  // last is 24
  EXPECT_FALSE(Correct("#### 73", "72"));
}

TEST(MathRewardTest, ComparesIntegersExactly) {
  EXPECT_TRUE(Correct("\\boxed{1,234}", "1234"));
  EXPECT_TRUE(Correct("$1,234", "1234"));
  EXPECT_TRUE(Correct("1234.00", "1,234"));
  EXPECT_TRUE(Correct("+5", "5"));
  EXPECT_TRUE(Correct("-0", "0"));
  EXPECT_TRUE(Correct("1e3", "1000"));
  EXPECT_FALSE(Correct("1000001", "1000000"));  // no tolerance for integers
  EXPECT_FALSE(Correct("-3", "3"));
  EXPECT_TRUE(Correct("\\boxed{-3}", "-3"));
  EXPECT_TRUE(Correct("The change is -$3.", "-3"));
  EXPECT_TRUE(Correct("123456789012345678901234567890",
                      "123,456,789,012,345,678,901,234,567,890"));
  EXPECT_FALSE(Correct("123456789012345678901234567891",
                       "123456789012345678901234567890"));
}

// GSM8K's graders, as verl's gsm8k reward writes them: the final number of
// the response (the last "-?[0-9.,]+", or the one after "####"), commas
// and "$" stripped, compared with the reference's exactly; FusionRL
// compares the numbers rather than their strings, so only the spelling of
// one value may differ (trailing zeros: 72.0 = 72). A value merely near the
// reference is wrong, whatever its size.
TEST(MathRewardTest, GradesAsGsm8kGradersDo) {
  struct Case {
    const char* response;
    const char* reference;
    bool correct;
  };
  const Case table[] = {
      {"48 + 24 = 72\n#### 72", "72", true},
      {"#### 72.00001", "72", false},
      {"#### 72.0", "72", true},
      {"#### 18.000", "18", true},
      {"#### 1,000", "1000", true},
      {"The total is $1,000", "1000", true},
      {"#### 2,500.00", "2500", true},
      {"#### 999999.9999999", "1000000", false},
      {"#### 1000000.000001", "1,000,000", false},
      {"#### 7.1", "7.10000001", false},
      {"#### 0.50", "0.5", true},
      {"#### 12.5", "12.50", true},
      {"#### 0.3333333", "1/3", false},
      {"#### -3", "-3", true},
      {"#### 3", "-3", false},
  };
  for (const Case& c : table) {
    EXPECT_EQ(Correct(c.response, c.reference), c.correct)
        << "'" << c.response << "' against '" << c.reference << "'";
  }
}

TEST(MathRewardTest, ComparesDecimalsAndFractions) {
  EXPECT_TRUE(Correct("0.75", "3/4"));
  EXPECT_TRUE(Correct("\\boxed{\\frac{3}{4}}", "0.75"));
  EXPECT_TRUE(Correct("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}"));
  EXPECT_TRUE(Correct("\\boxed{\\tfrac{6}{8}}", "3/4"));
  EXPECT_TRUE(Correct("\\boxed{-\\frac{1}{2}}", "-0.5"));
  EXPECT_TRUE(Correct("\\boxed{\\frac{-1}{2}}", "-1/2"));
  EXPECT_TRUE(Correct("\\boxed{\\frac{1}{-2}}", "-.5"));
  EXPECT_TRUE(Correct("3.50", "3.5"));
  EXPECT_FALSE(Correct("0.3333333", "1/3"));  // exact: close is not equal
  EXPECT_FALSE(Correct("0.33", "1/3"));
  EXPECT_FALSE(Correct("0.7501", "0.75"));
  EXPECT_TRUE(Correct("2.5e-3", "0.0025"));
  EXPECT_FALSE(Correct("\\boxed{\\frac{3}{0}}", "3"));  // no value
  EXPECT_EQ(Extract("5/0"), "0");  // no "/0" fraction: 5, then 0
}

TEST(MathRewardTest, NormalizesUnitsAndLatex) {
  EXPECT_TRUE(Correct("\\boxed{50\\%}", "50"));
  EXPECT_TRUE(Correct("The discount is 50%.", "50"));
  EXPECT_TRUE(Correct("\\boxed{\\$18.00}", "18"));
  EXPECT_TRUE(Correct("\\boxed{18 \\text{ dollars}}", "18"));
  EXPECT_TRUE(Correct("\\boxed{\\text{18 dollars}}", "18"));
  EXPECT_TRUE(Correct("\\boxed{x = 5}", "5"));
  EXPECT_TRUE(Correct("\\boxed{90^\\circ}", "90"));
  EXPECT_TRUE(Correct("\\boxed{90^{\\circ}}", "90"));
  EXPECT_TRUE(Correct("\\boxed{1{,}000}", "1000"));
  EXPECT_TRUE(Correct("\\boxed{1\\,000}", "1000"));
  EXPECT_TRUE(Correct("\\boxed{{42}}", "42"));
  EXPECT_TRUE(Correct("#### 72 apples.", "72"));
}

TEST(MathRewardTest, SymbolicAnswersCompareAsText) {
  EXPECT_TRUE(
      Correct("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\dfrac{\\sqrt{3}}{2}"));
  EXPECT_FALSE(Correct("\\boxed{\\sqrt{2}}", "2"));  // not the number 2
  EXPECT_TRUE(Correct("\\boxed{2x + 1}", "2x+1"));
  EXPECT_FALSE(Correct("\\boxed{2x + 1}", "2x+2"));
  EXPECT_FALSE(Correct("\\boxed{2x + 1}", "3"));
}

TEST(MathRewardTest, RejectsGarbageWithoutCrashing) {
  for (const char* r : {"",
                        "####",
                        "\\boxed",
                        "\\boxed{",
                        "}}}{{{",
                        "$$$",
                        "---",
                        "-$",
                        "\\frac{",
                        "\\frac{1}{",
                        "\\frac{}{}",
                        "1/",
                        "/2",
                        "e5",
                        "1e",
                        "1e+",
                        "1,",
                        ",123",
                        "1.",
                        ".",
                        "\\text{",
                        "9999999999999999999999999999999999"
                        "999999999999999",
                        "1e999",
                        "<think>",
                        "</think>"}) {
    EXPECT_FALSE(Correct(r, "72")) << r;
  }
  std::mt19937_64 rng(7);
  const std::string alphabet = "0123456789-+.,/$%\\{}eE# boxedfrac";
  const std::unique_ptr<RewardFn> reward = MakeMathReward();
  Problem p;
  p.answer = "12";
  for (int i = 0; i < 20000; ++i) {
    std::string s(rng() % 24, ' ');
    for (char& c : s) c = alphabet[rng() % alphabet.size()];
    const Verdict v = reward->Score(p, s);
    EXPECT_TRUE(v.reward == 0.0 || v.reward == 1.0) << s;
  }
}

TEST(MathRewardTest, EveryReferenceSolutionScoresOne) {
  TaskConfig c;
  c.name = "math";
  c.train_path = kSample;
  c.eval_size = 5;
  absl::StatusOr<std::unique_ptr<Task>> task = MakeMathTask(c);
  ASSERT_TRUE(task.ok()) << task.status();
  const std::unique_ptr<RewardFn> reward = MakeMathReward();
  for (uint64_t i = 0; i < 36; ++i) {
    const Problem p = (*task)->TrainProblem(i);
    EXPECT_TRUE(reward->Score(p, (*task)->Solution(p)).correct) << p.prompt;
    EXPECT_TRUE(
        reward->Score(p, absl::StrCat("\\boxed{", p.answer, "}")).correct)
        << p.prompt;
    EXPECT_FALSE(reward->Score(p, "\\boxed{123456}").correct) << p.prompt;
  }
}

// ------------------------------------------------------------------ task

class MathTaskTest : public testing::Test {
 protected:
  ~MathTaskTest() override {
    for (const std::string& path : paths_) std::remove(path.c_str());
  }

  std::string WriteFile(const std::string& content) {
    const std::string path = absl::StrCat(
        testing::TempDir(), "fusionrl_math_task_test_", getpid(), "_",
        testing::UnitTest::GetInstance()->current_test_info()->name(), "_",
        paths_.size(), ".jsonl");
    std::FILE* f = std::fopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr) << path;
    if (f != nullptr) {
      std::fwrite(content.data(), 1, content.size(), f);
      std::fclose(f);
    }
    paths_.push_back(path);
    return path;
  }

  static TaskConfig Config(const std::string& train, int eval_size = 5) {
    TaskConfig c;
    c.name = "math";
    c.train_path = train;
    c.eval_size = eval_size;
    return c;
  }

  std::vector<std::string> paths_;
};

TEST_F(MathTaskTest, LoadsTheSampleThroughTheRegistry) {
  absl::StatusOr<std::unique_ptr<Task>> task =
      TaskRegistry::Global().Create(Config(kSample, 8));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ((*task)->name(), "math");
  EXPECT_EQ((*task)->default_reward(), "math");
  const std::vector<Problem>& eval = (*task)->eval_set();
  ASSERT_EQ(eval.size(), 8u);  // the last 8 of 41 lines
  absl::flat_hash_set<std::string> eval_prompts;
  for (const Problem& p : eval) eval_prompts.insert(p.prompt);
  absl::flat_hash_set<std::string> train_prompts;
  for (uint64_t i = 0; i < 33; ++i) {
    const Problem p = (*task)->TrainProblem(i);
    EXPECT_FALSE(eval_prompts.contains(p.prompt)) << p.prompt;
    train_prompts.insert(p.prompt);
  }
  EXPECT_EQ(train_prompts.size(), 33u);  // one epoch visits each once
  // The last line is a chat-form record.
  const Problem& last = eval.back();
  EXPECT_EQ(last.prompt,
            "A rectangle is 13 cm long and 6 cm wide. What is its area in "
            "square centimeters?");
  EXPECT_EQ(last.answer, "78");
  ASSERT_EQ(last.messages.size(), 1u);
  EXPECT_EQ(last.messages[0].role, "user");
  EXPECT_EQ((*task)->Solution(last),
            "13 * 6 = <<13*6=78>>78 square centimeters.\n#### 78");
}

TEST_F(MathTaskTest, SampleHasEveryRecordForm) {
  absl::StatusOr<std::vector<Problem>> all =
      LoadJsonl(kSample, ParseMathRecord);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 41u);
  int with_system = 0, chat = 0, chat_with_system = 0;
  for (const Problem& p : *all) {
    EXPECT_FALSE(p.prompt.empty());
    EXPECT_FALSE(p.answer.empty());
    EXPECT_THAT(p.solution, HasSubstr("#### " + p.answer));
    EXPECT_EQ(p.answer.find("####"), std::string::npos);
    if (p.messages.empty()) {
      with_system += p.system.empty() ? 0 : 1;
    } else {
      ++chat;
      EXPECT_EQ(p.messages.back().content, p.prompt);
      if (!p.system.empty()) {
        ++chat_with_system;
        EXPECT_EQ(p.messages[0].content, p.system);
      }
    }
  }
  EXPECT_EQ(with_system, 3);
  EXPECT_EQ(chat, 4);
  EXPECT_EQ(chat_with_system, 2);
}

TEST_F(MathTaskTest, ParsesEachRecordForm) {
  auto parse = [](const char* line) {
    return ParseMathRecord(nlohmann::json::parse(line));
  };
  absl::StatusOr<Problem> p =
      parse(R"({"question": "Q?", "answer": "a\nb\n#### 1,000 "})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->prompt, "Q?");
  EXPECT_EQ(p->answer, "1,000");
  EXPECT_EQ(p->solution, "a\nb\n#### 1,000");
  EXPECT_TRUE(p->messages.empty());
  EXPECT_TRUE(p->system.empty());

  p = parse(R"({"question": "Q?", "answer": 42, "system": "S"})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->answer, "42");
  EXPECT_EQ(p->solution, "");
  EXPECT_EQ(p->system, "S");

  p = parse(R"({"question": "Q?", "answer": " \\frac{1}{2} "})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->answer, "\\frac{1}{2}");

  p = parse(R"({"messages": [{"role": "system", "content": "S"},
                             {"role": "user", "content": "U1"},
                             {"role": "assistant", "content": "A1"},
                             {"role": "user", "content": "U2"}],
                "answer": "7"})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->prompt, "U2");
  EXPECT_EQ(p->system, "S");
  ASSERT_EQ(p->messages.size(), 4u);
  EXPECT_EQ(p->messages[2].role, "assistant");
  EXPECT_EQ(RenderChat(ChatFormat::kChatML, ProblemMessages(*p, "X"), true),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n"
            "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nU2"
            "<|im_end|>\n<|im_start|>assistant\n");
}

TEST_F(MathTaskTest, RejectsBadRecordsNamingWhatIsWrong) {
  const struct {
    const char* line;
    const char* reason;
  } cases[] = {
      {R"({"answer": "1"})", "missing \"question\" (or \"messages\")"},
      {R"({"question": "Q"})", "missing \"answer\""},
      {R"({"question": 3, "answer": "1"})",
       "\"question\" must be a string, got number"},
      {R"({"question": "  ", "answer": "1"})", "\"question\" is empty"},
      {R"({"question": "Q", "answer": ""})", "\"answer\" is empty"},
      {R"({"question": "Q", "answer": "work ####  "})",
       "\"answer\" has nothing after its last \"####\""},
      {R"({"question": "Q", "answer": [1]})",
       "\"answer\" must be a string or a number, got array"},
      {R"({"question": "Q", "answer": "1", "system": 5})",
       "\"system\" must be a string, got number"},
      {R"({"question": "Q", "messages": [], "answer": "1"})",
       "has both \"question\" and \"messages\""},
      {R"({"messages": "hi", "answer": "1"})",
       "\"messages\" must be an array, got string"},
      {R"({"messages": [], "answer": "1"})", "\"messages\" is empty"},
      {R"({"messages": [3], "answer": "1"})",
       "\"messages\"[0] must be an object, got number"},
      {R"({"messages": [{"content": "x"}], "answer": "1"})",
       "missing \"messages\"[0].role"},
      {R"({"messages": [{"role": "user"}], "answer": "1"})",
       "missing \"messages\"[0].content"},
      {R"({"messages": [{"role": "tool", "content": "x"}], "answer": "1"})",
       "\"messages\"[0].role must be system, user or assistant, got \"tool\""},
      {R"({"messages": [{"role": "user", "content": "x"},
                        {"role": "system", "content": "s"},
                        {"role": "user", "content": "y"}], "answer": "1"})",
       "\"messages\"[1]: a system message may only be the first message"},
      {R"({"messages": [{"role": "user", "content": "x"},
                        {"role": "assistant", "content": "y"}], "answer": "1"})",
       "the last of \"messages\" must have role \"user\", got \"assistant\""},
      {R"({"messages": [{"role": "user", "content": " "}], "answer": "1"})",
       "the last of \"messages\" (the question) has empty content"},
      {R"({"messages": [{"role": "user", "content": "x"}], "system": "s",
           "answer": "1"})",
       "\"system\" cannot be used with \"messages\""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.line);
    absl::StatusOr<Problem> p = ParseMathRecord(nlohmann::json::parse(c.line));
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(p.status().message()), HasSubstr(c.reason));
  }
}

TEST_F(MathTaskTest, FileErrorsNameFileAndLine) {
  const std::string path = WriteFile(
      "{\"question\": \"Q1\", \"answer\": \"#### 1\"}\n"
      "\n"
      "{\"question\": \"Q2\", \"answer\": \"#### 2\"}\n"
      "{\"question\": \"Q3\", \"solution\": \"#### 3\"}\n");
  absl::Status s = MakeMathTask(Config(path, 1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), absl::StrCat(path, ":4: missing \"answer\""));

  const std::string bad_json = WriteFile("{\"question\": \"Q1\",\n");
  s = MakeMathTask(Config(bad_json, 1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(absl::StrCat(bad_json, ":1: invalid JSON")));

  const std::string not_object = WriteFile("[1, 2]\n");
  s = MakeMathTask(Config(not_object, 1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            absl::StrCat(not_object, ":1: expected a JSON object, got array"));
}

TEST_F(MathTaskTest, ConfigErrorsNameTheKey) {
  TaskConfig c = Config("");
  absl::Status s = MakeMathTask(c).status();
  EXPECT_EQ(s.message(), "task.train_path: required by the math task");

  const std::string two = WriteFile(
      "{\"question\": \"Q1\", \"answer\": \"1\"}\n"
      "{\"question\": \"Q2\", \"answer\": \"2\"}\n");
  s = MakeMathTask(Config(two, 2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("task.eval_size=2"));

  c = Config(two, 1);
  c.eval_path = WriteFile("{\"question\": \"E1\", \"answer\": \"5\"}\n");
  absl::StatusOr<std::unique_ptr<Task>> task = MakeMathTask(c);
  ASSERT_TRUE(task.ok()) << task.status();
  ASSERT_EQ((*task)->eval_set().size(), 1u);
  EXPECT_EQ((*task)->eval_set()[0].prompt, "E1");
  EXPECT_EQ((*task)->Solution((*task)->eval_set()[0]), "5");  // no solution
}

TEST_F(MathTaskTest, JsonlTaskIsUnchanged) {
  const std::string path = WriteFile(
      "{\"prompt\": \"p1\", \"answer\": \"a #### 1\"}\n"
      "{\"prompt\": \"p2\", \"answer\": 2}\n");
  TaskConfig c = Config(path, 1);
  c.name = "jsonl";
  absl::StatusOr<std::unique_ptr<Task>> task = TaskRegistry::Global().Create(c);
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ((*task)->name(), "jsonl");
  EXPECT_EQ((*task)->default_reward(), "exact");
  const Problem p = (*task)->TrainProblem(0);
  EXPECT_EQ(p.answer, "a #### 1");  // taken as it is
  EXPECT_EQ((*task)->Solution(p), "a #### 1");
  EXPECT_EQ((*task)->eval_set()[0].answer, "2");
}

}  // namespace
}  // namespace fusionrl::tasks
