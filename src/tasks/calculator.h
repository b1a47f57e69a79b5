// The calculator tool of the "calculator" environment (environments.cc):
// exact integer arithmetic whose errors the policy reads as tool results.
//
// Thread safety: pure functions.
#ifndef FUSIONRL_TASKS_CALCULATOR_H_
#define FUSIONRL_TASKS_CALCULATOR_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fusionrl::tasks {

// Expressions at most this long (bytes) are evaluated; longer ones are an
// error, which also bounds the work per call.
inline constexpr size_t kMaxArithmeticLength = 256;
// Parentheses nested at most this deep (unary minus signs are counted, not
// recursed on, and need no limit).
inline constexpr int kMaxArithmeticNesting = 64;

// Evaluates `expression`: decimal integer literals (any number of digits,
// but every value must fit in int64), binary + - * / with the usual
// precedence (left-associative), unary minus, parentheses and whitespace. `/`
// is exact integer division: a division that leaves a remainder
// ("division 7/2 is not exact") or by zero is an error, as is any overflow.
// The result is a decimal integer, e.g. "-42". Errors (InvalidArgument) are
// worded for the model to read and name the 1-based character position,
// e.g. "unexpected ')' at position 4". Never crashes on arbitrary input.
absl::StatusOr<std::string> EvaluateArithmetic(std::string_view expression);

}  // namespace fusionrl::tasks

#endif  // FUSIONRL_TASKS_CALCULATOR_H_
