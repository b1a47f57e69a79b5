// Built-in reward functions and the countdown expression parser they share
// with the countdown task. Private to fusionrl_tasks; users reach the rewards
// through RewardRegistry::Global() ("exact", "char_match", "numeric",
// "countdown").
#ifndef FUSIONRL_TASKS_REWARDS_H_
#define FUSIONRL_TASKS_REWARDS_H_

#include <cstdint>
#include <memory>
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

}  // namespace fusionrl::tasks

#endif  // FUSIONRL_TASKS_REWARDS_H_
