// Built-in reward functions and the countdown expression parser they share
// with the countdown task. Private to fusionrl_tasks; users reach the rewards
// through RewardRegistry::Global() ("exact", "char_match", "numeric",
// "countdown", "math"). The math reward lives in math_reward.cc.
#ifndef FUSIONRL_TASKS_REWARDS_H_
#define FUSIONRL_TASKS_REWARDS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fusionrl/task.h"

namespace fusionrl::tasks {

// Evaluates a countdown expression: non-negative integer literals, binary
// + - * with the usual precedence, parentheses, optional spaces; no unary
// minus. Arithmetic is 64-bit. Appends every literal, left to right, to
// `*numbers` (which may be null). InvalidArgument on a syntax error, on
// overflow, or on parentheses nested deeper than 64. Never crashes on
// arbitrary input.
absl::StatusOr<int64_t> EvalCountdownExpression(std::string_view expr,
                                                std::vector<int64_t>* numbers);

// A countdown prompt "n1,n2,...>target=".
struct CountdownPrompt {
  std::vector<int64_t> numbers;  // in prompt order
  int64_t target = 0;
};
// InvalidArgument unless `prompt` has exactly the form above (decimal digits
// only, at least one number).
absl::StatusOr<CountdownPrompt> ParseCountdownPrompt(std::string_view prompt);

// Thinking models: what of a response a reward grades. The answer is the
// text after the last "</think>"; a response that ends inside a thinking
// block, opened by itself ("<think>" after its last "</think>") or by the
// prompt's generation prompt (Qwen3-Thinking and QwQ templates end the
// prompt with "<think>\n", `prompt_opens_thinking`) and never closed, has
// no answer: nullopt, graded as a wrong answer, never as its thinking text
// (a response cut at max_new_tokens mid-thought would otherwise be graded on
// whatever number it last mentioned). Without any think tag, the whole
// response.
std::optional<std::string_view> AnswerText(std::string_view response,
                                           bool prompt_opens_thinking);

// `text` ends inside a thinking block: it has a "<think>" after its last
// "</think>".
bool EndsInsideThinking(std::string_view text);

// 1.0 iff the response, surrounding whitespace trimmed, equals the answer
// (also trimmed).
std::unique_ptr<RewardFn> MakeExactReward();

// Partial credit: (positions i where response[i] == answer[i]) / max of the
// two lengths, both trimmed; 1.0 and correct only on an exact match.
std::unique_ptr<RewardFn> MakeCharMatchReward();

// 1.0 iff response and answer (trimmed) both parse completely as decimal
// numbers ([+-]digits[.digits][e[+-]digits]) and
// |response - answer| <= 1e-6 * max(1, |answer|).
std::unique_ptr<RewardFn> MakeNumericReward();

// 1.0 iff the response is a countdown expression that uses exactly the
// prompt's numbers (as a multiset) and evaluates to the prompt's target.
// The problem's answer is not consulted.
std::unique_ptr<RewardFn> MakeCountdownReward();

// The final answer of a math response, as text:
//   1. only AnswerText(response, false) is searched: the text after the
//      last "</think>" (a response still thinking has no answer);
//   2. the content of the last complete \boxed{...} or \fbox{...} (braces
//      balanced, "\{" "\}" literal; an empty one does not count);
//   3. else, after the last "####": its first number token, or if it has
//      none the rest of that line (non-empty);
//   4. else the last number token in the text.
// nullopt when there is nothing (no number at all).
// A number token is [sign][$ or \$]digits[,ddd...][.digits][e[+-]digits]
// or [sign][$]digits/digits ("3/4") or [sign]\frac{A}{B} (also \dfrac,
// \tfrac) with A, B plain numbers; ".5" is a number; commas only group
// thousands ("1,234,567"; "1,2" is two numbers); '-' is a sign only when it
// does not follow a letter, digit or closing bracket ("5-3" ends in 3); a
// trailing "." ends the token ("is 72." gives 72).
std::optional<std::string> ExtractMathAnswer(std::string_view response);

// True iff a candidate answer matches a reference answer. Both are first
// normalised: \text{X}, \textbf{X}, \textrm{X}, \mathrm{X}, \mbox{X}
// become X; "$", "\$", "%", "\%", degree signs, \left, \right, \!, \,
// and \displaystyle are dropped ("%" is dropped, not divided by 100); \dfrac
// and \tfrac become \frac; outer braces and trailing periods are stripped.
// A normalised answer has a value when it is one number token, or holds a
// single number token among plain words ("18 dollars", "x = 5"; not
// "\sqrt{2}" or "2x+1"). Values are exact rationals and must be equal
// exactly, as GSM8K's graders compare the final number: "72.0" == "72" ==
// "72.00", "0.75" == "3/4" == "\frac{3}{4}", but "72.00001" != "72" and
// "0.3333333" != "1/3". Answers without a value (symbolic ones) match
// only as equal strings, whitespace ignored; a value never matches a
// non-value. Exponents above 30 and numbers beyond 128-bit rationals have no
// value.
bool MathAnswersEqual(std::string_view candidate, std::string_view reference);

// 1.0 iff ExtractMathAnswer(response) MathAnswersEqual the problem's answer
// (the text after its last "####" if it has one). Never crashes on
// arbitrary input.
std::unique_ptr<RewardFn> MakeMathReward();

}  // namespace fusionrl::tasks

#endif  // FUSIONRL_TASKS_REWARDS_H_
