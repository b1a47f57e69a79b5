// Tests of the calculator tool (calculator.h), the built-in environments and
// their registry (fusionrl/environment.h), and the multiply task they are
// trained on.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fusionrl/config.h"
#include "fusionrl/environment.h"
#include "fusionrl/task.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tasks/calculator.h"
#include "tasks/tool_calls.h"

namespace fusionrl {
namespace {

using tasks::EvaluateArithmetic;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::string Eval(std::string_view expression) {
  absl::StatusOr<std::string> v = EvaluateArithmetic(expression);
  if (!v.ok()) return "ERROR " + std::string(v.status().message());
  return *v;
}

// ------------------------------------------------------------ calculator

TEST(ArithmeticTest, PrecedenceAndAssociativity) {
  EXPECT_EQ(Eval("2+3*4"), "14");
  EXPECT_EQ(Eval("10-2-3"), "5");
  EXPECT_EQ(Eval("100/4/5"), "5");
  EXPECT_EQ(Eval("2*3-4*5"), "-14");
  EXPECT_EQ(Eval(" 347 * 29 "), "10063");
  EXPECT_EQ(Eval("000123"), "123");
  EXPECT_EQ(Eval("\t7\n"), "7");
}

TEST(ArithmeticTest, ParenthesesAndUnaryMinus) {
  EXPECT_EQ(Eval("(2+3)*4"), "20");
  EXPECT_EQ(Eval("-3*-2"), "6");
  EXPECT_EQ(Eval("--5"), "5");
  EXPECT_EQ(Eval("3--2"), "5");
  EXPECT_EQ(Eval("-(4-10)/- 3"), "-2");
  EXPECT_EQ(Eval("((((1))))"), "1");
  EXPECT_EQ(Eval(std::string(200, '-') + "1"), "1");
  EXPECT_EQ(Eval(std::string(201, '-') + "1"), "-1");
}

TEST(ArithmeticTest, SixtyFourBitLimits) {
  EXPECT_EQ(Eval("9223372036854775807"), "9223372036854775807");
  EXPECT_EQ(Eval("-9223372036854775808"), "-9223372036854775808");
  EXPECT_EQ(Eval("9223372036854775808"),
            "ERROR the number 9223372036854775808 at position 1 does not fit "
            "in a 64-bit integer");
  EXPECT_EQ(Eval("1+99999999999999999999999"),
            "ERROR the number 99999999999999999999999 at position 3 does not "
            "fit in a 64-bit integer");
  EXPECT_EQ(Eval("9223372036854775807+1"),
            "ERROR 9223372036854775807+1 at position 20 does not fit in a "
            "64-bit integer");
  EXPECT_EQ(Eval("-9223372036854775807-2"),
            "ERROR -9223372036854775807-2 at position 21 does not fit in a "
            "64-bit integer");
  EXPECT_EQ(Eval("4294967296*4294967296"),
            "ERROR 4294967296*4294967296 at position 11 does not fit in a "
            "64-bit integer");
  EXPECT_EQ(Eval("-9223372036854775808/-1"),
            "ERROR -9223372036854775808/(-1) at position 21 does not fit in a "
            "64-bit integer");
  EXPECT_EQ(Eval("-(-9223372036854775808)"),
            "ERROR -(-9223372036854775808) does not fit in a 64-bit integer");
}

TEST(ArithmeticTest, DivisionIsExact) {
  EXPECT_EQ(Eval("84/-4"), "-21");
  EXPECT_EQ(Eval("7/2"),
            "ERROR division 7/2 is not exact (at position 2); only exact "
            "integer division is supported");
  EXPECT_EQ(Eval("1+6/0"), "ERROR division by zero at position 4 (6/0)");
}

TEST(ArithmeticTest, SyntaxErrorsNameThePosition) {
  EXPECT_EQ(Eval(""), "ERROR empty expression");
  EXPECT_EQ(Eval("   "), "ERROR empty expression");
  EXPECT_EQ(Eval("2+"),
            "ERROR expected a number or '(' at position 3, found the end of "
            "the expression");
  EXPECT_EQ(Eval("2*x"),
            "ERROR expected a number or '(' at position 3, found 'x'");
  EXPECT_EQ(Eval("2 x"),
            "ERROR unexpected 'x' at position 3 (expected an operator)");
  EXPECT_EQ(Eval("2)"), "ERROR unmatched ')' at position 2");
  EXPECT_EQ(Eval("(2"), "ERROR unclosed '(' at position 1");
  EXPECT_EQ(Eval("(2 3)"),
            "ERROR unexpected '3' at position 4 (expected an operator or ')')");
  EXPECT_EQ(Eval("1.5"),
            "ERROR unexpected '.' at position 2 (expected an operator)");
  EXPECT_EQ(Eval("+1"),
            "ERROR expected a number or '(' at position 1, found '+'");
}

TEST(ArithmeticTest, NestingAndLengthLimits) {
  const int limit = tasks::kMaxArithmeticNesting;
  EXPECT_EQ(Eval(std::string(limit, '(') + "7" + std::string(limit, ')')), "7");
  EXPECT_EQ(
      Eval(std::string(limit + 1, '(') + "7" + std::string(limit + 1, ')')),
      "ERROR parentheses nested deeper than 64 at position 65");
  EXPECT_EQ(Eval(std::string(257, '1')),
            "ERROR expression is 257 characters long; the limit is 256");
  // Never a stack overflow, whatever the length.
  EXPECT_EQ(Eval(std::string(100000, '(')),
            "ERROR expression is 100000 characters long; the limit is 256");
}

TEST(ArithmeticTest, RandomInputNeverCrashes) {
  const std::string alphabet = "0123456789+-*/() x";
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 20000; ++iter) {
    std::string text(rng() % 40, ' ');
    for (char& c : text) {
      c = rng() % 8 == 0 ? static_cast<char>(rng() % 256)
                         : alphabet[rng() % alphabet.size()];
    }
    const absl::StatusOr<std::string> v = EvaluateArithmetic(text);
    if (v.ok()) {
      EXPECT_FALSE(v->empty()) << text;
    } else {
      EXPECT_FALSE(v.status().message().empty()) << text;
    }
  }
}

// ---------------------------------------------------------- environments

std::unique_ptr<Environment> MustCreateEnv(const std::string& name) {
  EnvConfig config;
  config.name = name;
  absl::StatusOr<std::unique_ptr<Environment>> env =
      EnvironmentRegistry::Global().Create(config);
  EXPECT_TRUE(env.ok()) << env.status();
  return env.ok() ? *std::move(env) : nullptr;
}

const Problem kProblem{"347*29=", "10063"};

absl::Time Deadline() { return absl::Now() + absl::Seconds(10); }

AssistantTurn ToolTurn(std::vector<ToolCall> calls,
                       std::vector<std::string> errors = {}) {
  AssistantTurn turn;
  turn.tool_calls = std::move(calls);
  turn.call_errors = std::move(errors);
  return turn;
}

AssistantTurn FinalTurn(const std::string& content) {
  AssistantTurn turn;
  turn.text = content;
  turn.content = content;
  return turn;
}

std::vector<std::string> Contents(const Observation& obs) {
  std::vector<std::string> out;
  for (const ChatMessage& m : obs.messages) {
    EXPECT_EQ(m.role, "tool");
    out.push_back(m.content);
  }
  return out;
}

TEST(CalculatorEnvironmentTest, OffersCalc) {
  std::unique_ptr<Environment> env = MustCreateEnv("calculator");
  ASSERT_NE(env, nullptr);
  EpisodeStart start;
  start.messages.push_back({"user", "stale"});
  ASSERT_TRUE(env->Open(kProblem, 1, Deadline(), &start).ok());
  EXPECT_THAT(start.messages, IsEmpty());
  ASSERT_EQ(start.tools.size(), 1u);
  EXPECT_EQ(start.tools[0].name, "calc");
  EXPECT_EQ(start.tools[0].description,
            "Evaluates integer arithmetic: + - * / and parentheses");
  EXPECT_EQ(*ToolsJson(start.tools),
            R"([{"type":"function","function":{"name":"calc","description":)"
            R"("Evaluates integer arithmetic: + - * / and parentheses",)"
            R"("parameters":{"type":"object","properties":{"expression":)"
            R"({"type":"string","description":"e.g. 347*29"}},"required":)"
            R"(["expression"]}}}])");
}

TEST(CalculatorEnvironmentTest, AnswersCallsThenGradesTheAnswer) {
  std::unique_ptr<Environment> env = MustCreateEnv("calculator");
  ASSERT_NE(env, nullptr);
  EpisodeStart start;
  absl::StatusOr<std::unique_ptr<Episode>> episode =
      env->Open(kProblem, 1, Deadline(), &start);
  ASSERT_TRUE(episode.ok()) << episode.status();

  absl::StatusOr<Observation> obs =
      (*episode)->Step(ToolTurn({{"calc", R"({"expression":"347*29"})"},
                                 {"calc", R"({"expression":"7/2"})"},
                                 {"calc", R"({"expr":"1"})"},
                                 {"other", R"({"x":1})"}},
                                {"tool call 5: not valid JSON"}),
                       Deadline());
  ASSERT_TRUE(obs.ok()) << obs.status();
  EXPECT_FALSE(obs->done);
  EXPECT_THAT(Contents(*obs),
              ElementsAre("10063",
                          "error: division 7/2 is not exact (at position 2); "
                          "only exact integer division is supported",
                          R"(error: calc takes {"expression": "<arithmetic>"})",
                          "error: unknown tool 'other' (offered: calc)"));
  EXPECT_EQ(obs->metrics, (std::map<std::string, double>{{"calc_calls", 4}}));

  // Only call errors: the rollout answers them; the episode goes on.
  obs = (*episode)->Step(ToolTurn({}, {"tool call 1: not valid JSON"}),
                         Deadline());
  ASSERT_TRUE(obs.ok());
  EXPECT_FALSE(obs->done);
  EXPECT_THAT(obs->messages, IsEmpty());

  obs = (*episode)->Step(FinalTurn(" 10063\n"), Deadline());
  ASSERT_TRUE(obs.ok());
  EXPECT_TRUE(obs->done);
  EXPECT_EQ(obs->reward, 1.0);
  EXPECT_EQ(obs->correct, true);
  EXPECT_THAT(obs->messages, IsEmpty());

  absl::StatusOr<std::unique_ptr<Episode>> other =
      env->Open(kProblem, 2, Deadline(), &start);
  ASSERT_TRUE(other.ok());
  obs = (*other)->Step(FinalTurn("10064"), Deadline());
  ASSERT_TRUE(obs.ok());
  EXPECT_TRUE(obs->done);
  EXPECT_EQ(obs->reward, 0.0);
  EXPECT_EQ(obs->correct, false);
}

// The demonstration, played through the plain parser and the episode: a
// call, then the tool's result as the (correct) answer, then the end.
TEST(CalculatorEnvironmentTest, DemonstrationSolvesTheProblem) {
  std::unique_ptr<Environment> env = MustCreateEnv("calculator");
  ASSERT_NE(env, nullptr);
  EpisodeStart start;
  absl::StatusOr<std::unique_ptr<Episode>> episode =
      env->Open(kProblem, 1, Deadline(), &start);
  ASSERT_TRUE(episode.ok());
  std::vector<ChatMessage> conversation = {{"user", kProblem.prompt}};

  std::optional<std::string> first = env->Demonstrate(kProblem, conversation);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, "[calc 347*29]");
  const ParsedTurn parsed =
      ParseToolCalls(ToolFormat::kPlain, *first, start.tools);
  ASSERT_THAT(parsed.errors, IsEmpty());
  AssistantTurn turn = ToolTurn(parsed.calls);
  turn.text = *first;
  absl::StatusOr<Observation> obs = (*episode)->Step(turn, Deadline());
  ASSERT_TRUE(obs.ok());
  EXPECT_THAT(Contents(*obs), ElementsAre("10063"));
  conversation.push_back({"assistant", *first});
  conversation.insert(conversation.end(), obs->messages.begin(),
                      obs->messages.end());

  std::optional<std::string> second = env->Demonstrate(kProblem, conversation);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(*second, "10063");
  obs = (*episode)->Step(FinalTurn(*second), Deadline());
  ASSERT_TRUE(obs.ok());
  EXPECT_TRUE(obs->done);
  EXPECT_EQ(obs->reward, 1.0);
}

TEST(CalculatorEnvironmentTest, DemonstrationPromptsAndErrors) {
  std::unique_ptr<Environment> env = MustCreateEnv("calculator");
  ASSERT_NE(env, nullptr);
  EXPECT_EQ(env->Demonstrate({"12*3 = \n", "36"}, {}), "[calc 12*3]");
  EXPECT_EQ(env->Demonstrate({"12*3", "36"}, {}), "[calc 12*3]");
  EXPECT_EQ(env->Demonstrate({"1==", "1"}, {}), "[calc 1=]");
  // The last tool message counts.
  EXPECT_EQ(env->Demonstrate(kProblem, {{"user", "x"},
                                        {"tool", "error: bad"},
                                        {"assistant", "[calc 1]"},
                                        {"tool", "1"}}),
            "1");
  EXPECT_EQ(env->Demonstrate(kProblem, {{"user", "x"},
                                        {"tool", "1"},
                                        {"assistant", "[calc 7/2]"},
                                        {"tool", "error: division"}}),
            std::nullopt);
}

TEST(NoToolsEnvironmentTest, OffersNothingAndGradesTheSame) {
  std::unique_ptr<Environment> env = MustCreateEnv("no_tools");
  ASSERT_NE(env, nullptr);
  EpisodeStart start;
  start.tools.push_back({"calc", "", "{}"});
  absl::StatusOr<std::unique_ptr<Episode>> episode =
      env->Open(kProblem, 1, Deadline(), &start);
  ASSERT_TRUE(episode.ok());
  EXPECT_THAT(start.tools, IsEmpty());
  EXPECT_THAT(start.messages, IsEmpty());
  // The parser rejects every call: none are offered.
  EXPECT_THAT(
      ParseToolCalls(ToolFormat::kPlain, "[calc 1]", start.tools).errors,
      ElementsAre("tool call 1: unknown tool 'calc' (offered: none)"));

  absl::StatusOr<Observation> obs = (*episode)->Step(
      ToolTurn({{"calc", R"({"expression":"1"})"}}), Deadline());
  ASSERT_TRUE(obs.ok());
  EXPECT_FALSE(obs->done);
  EXPECT_THAT(Contents(*obs), ElementsAre("error: no tools are available"));
  obs =
      (*episode)->Step(ToolTurn({}, {"tool call 1: unknown tool"}), Deadline());
  ASSERT_TRUE(obs.ok());
  EXPECT_FALSE(obs->done);
  EXPECT_THAT(obs->messages, IsEmpty());
  obs = (*episode)->Step(FinalTurn("10063"), Deadline());
  ASSERT_TRUE(obs.ok());
  EXPECT_TRUE(obs->done);
  EXPECT_EQ(obs->reward, 1.0);
  EXPECT_EQ(obs->correct, true);
  EXPECT_EQ(env->Demonstrate(kProblem, {{"user", kProblem.prompt}}),
            std::nullopt);
}

TEST(EnvironmentRegistryTest, GlobalHasTheBuiltIns) {
  EXPECT_THAT(EnvironmentRegistry::Global().Names(),
              ElementsAre("calculator", "no_tools"));
  EnvConfig config;
  config.name = "nope";
  absl::Status s = EnvironmentRegistry::Global().Create(config).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(),
            "env.name: unknown environment 'nope' (known: calculator, "
            "no_tools)");
  config.name = "remote";
  s = EnvironmentRegistry::Global().Create(config).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(),
            "env.name: remote needs the gRPC environment client, which "
            "registers itself when a job starts in the fusionrl binary or "
            "fusionrl_worker (RegisterRemoteEnvironment())");
}

TEST(EnvironmentRegistryTest, RegisterAndCreate) {
  EnvironmentRegistry registry;
  EXPECT_THAT(registry.Names(), IsEmpty());
  int created = 0;
  const EnvironmentFactory factory =
      [&](const EnvConfig& c) -> absl::StatusOr<std::unique_ptr<Environment>> {
    ++created;
    EXPECT_EQ(c.address, "host:1");
    return MustCreateEnv("calculator");
  };
  ASSERT_TRUE(registry.Register("remote", factory).ok());
  const absl::Status again = registry.Register("remote", factory);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(again.message(), "environment 'remote' is already registered");
  EXPECT_EQ(registry.Register("", factory).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register("empty", nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(
      registry
          .Register("null",
                    [](const EnvConfig&)
                        -> absl::StatusOr<std::unique_ptr<Environment>> {
                      return std::unique_ptr<Environment>();
                    })
          .ok());
  EnvConfig config;
  config.name = "remote";
  config.address = "host:1";
  EXPECT_TRUE(registry.Create(config).ok());
  EXPECT_EQ(created, 1);
  config.name = "null";
  EXPECT_EQ(registry.Create(config).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_THAT(registry.Names(), ElementsAre("null", "remote"));
}

// ---------------------------------------------------------- multiply task

TaskConfig MultiplyConfig(int min_digits, int max_digits) {
  TaskConfig c;
  c.name = "multiply";
  c.min_digits = min_digits;
  c.max_digits = max_digits;
  c.eval_size = 50;
  return c;
}

std::unique_ptr<Task> MustCreateTask(const TaskConfig& config) {
  absl::StatusOr<std::unique_ptr<Task>> task =
      TaskRegistry::Global().Create(config);
  EXPECT_TRUE(task.ok()) << task.status();
  return task.ok() ? *std::move(task) : nullptr;
}

// The operands of "A*B=", checked for the digit range and the answer.
void CheckMultiplyProblem(const Problem& p, int min_digits, int max_digits) {
  SCOPED_TRACE(p.prompt);
  ASSERT_GE(p.prompt.size(), 4u);
  ASSERT_EQ(p.prompt.back(), '=');
  const size_t star = p.prompt.find('*');
  ASSERT_NE(star, std::string::npos);
  const std::string a = p.prompt.substr(0, star);
  const std::string b = p.prompt.substr(star + 1, p.prompt.size() - star - 2);
  for (const std::string& operand : {a, b}) {
    EXPECT_GE(static_cast<int>(operand.size()), min_digits);
    EXPECT_LE(static_cast<int>(operand.size()), max_digits);
    EXPECT_NE(operand[0], '0');
    EXPECT_EQ(operand.find_first_not_of("0123456789"), std::string::npos);
  }
  EXPECT_EQ(p.answer, std::to_string(std::stoll(a) * std::stoll(b)));
}

TEST(MultiplyTaskTest, ProblemsHaveTheDigitRange) {
  std::unique_ptr<Task> task = MustCreateTask(MultiplyConfig(2, 3));
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->name(), "multiply");
  EXPECT_EQ(task->default_reward(), "exact");
  std::set<size_t> lengths;
  for (uint64_t i = 0; i < 500; ++i) {
    const Problem p = task->TrainProblem(i);
    CheckMultiplyProblem(p, 2, 3);
    lengths.insert(p.prompt.find('*'));
  }
  EXPECT_EQ(lengths, (std::set<size_t>{2, 3}));
  for (const Problem& p : task->eval_set()) CheckMultiplyProblem(p, 2, 3);

  std::unique_ptr<Task> widest = MustCreateTask(MultiplyConfig(9, 9));
  ASSERT_NE(widest, nullptr);
  for (uint64_t i = 0; i < 100; ++i) {
    CheckMultiplyProblem(widest->TrainProblem(i), 9, 9);
  }
}

TEST(MultiplyTaskTest, DeterministicAndSeeded) {
  std::unique_ptr<Task> a = MustCreateTask(MultiplyConfig(1, 4));
  std::unique_ptr<Task> b = MustCreateTask(MultiplyConfig(1, 4));
  TaskConfig other_config = MultiplyConfig(1, 4);
  other_config.seed = 99;
  std::unique_ptr<Task> other = MustCreateTask(other_config);
  ASSERT_TRUE(a && b && other);
  int differing = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(a->TrainProblem(i).prompt, b->TrainProblem(i).prompt);
    differing += a->TrainProblem(i).prompt != other->TrainProblem(i).prompt;
  }
  EXPECT_GT(differing, 90);
  ASSERT_EQ(a->eval_set().size(), 50u);
  for (size_t i = 0; i < a->eval_set().size(); ++i) {
    EXPECT_EQ(a->eval_set()[i].prompt, b->eval_set()[i].prompt);
  }
}

TEST(MultiplyTaskTest, EvalSplitIsDisjointFromTraining) {
  // One-digit operands: only 81 problems, so training redraws often.
  TaskConfig config = MultiplyConfig(1, 1);
  config.eval_size = 40;
  std::unique_ptr<Task> task = MustCreateTask(config);
  ASSERT_NE(task, nullptr);
  std::set<std::string> eval;
  for (const Problem& p : task->eval_set()) eval.insert(p.prompt);
  EXPECT_EQ(eval.size(), 40u);
  std::set<std::string> train;
  for (uint64_t i = 0; i < 2000; ++i) {
    const Problem p = task->TrainProblem(i);
    CheckMultiplyProblem(p, 1, 1);
    EXPECT_EQ(eval.count(p.prompt), 0u) << p.prompt;
    train.insert(p.prompt);
  }
  EXPECT_EQ(train.size(), 81u - 40u);

  config.eval_size = 81;  // the whole problem space
  EXPECT_EQ(TaskRegistry::Global().Create(config).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MultiplyTaskTest, DigitBoundsAreChecked) {
  absl::Status s =
      TaskRegistry::Global().Create(MultiplyConfig(1, 10)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "task.max_digits: must be in [task.min_digits (1), 9] for the "
            "multiply task (got 10)");
  s = TaskRegistry::Global().Create(MultiplyConfig(0, 3)).status();
  EXPECT_EQ(s.message(),
            "task.min_digits: must be in [1, 9] for the multiply task (got 0)");
  s = TaskRegistry::Global().Create(MultiplyConfig(3, 2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fusionrl
