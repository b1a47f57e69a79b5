#include "tasks/calculator.h"

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace fusionrl::tasks {
namespace {

// Recursive-descent evaluator:
//   expr   := term (('+' | '-') term)*
//   term   := unary (('*' | '/') unary)*
//   unary  := '-'* primary
//   primary:= number | '(' expr ')'
// Recursion happens only through '(' (depth-limited), and the length limit
// bounds the rest. Positions in messages are 1-based. Single use.
class Evaluator {
 public:
  explicit Evaluator(std::string_view text) : text_(text) {}

  absl::StatusOr<int64_t> Evaluate() {
    SkipSpaces();
    if (pos_ == text_.size()) {
      return absl::InvalidArgumentError("empty expression");
    }
    absl::StatusOr<int64_t> value = ParseExpr(0);
    if (!value.ok()) return value;
    if (pos_ != text_.size()) {
      if (text_[pos_] == ')') {
        return Error(absl::StrCat("unmatched ')' at position ", pos_ + 1));
      }
      return Error(absl::StrCat("unexpected ", Found(), " at position ",
                                pos_ + 1, " (expected an operator)"));
    }
    return value;
  }

 private:
  static absl::Status Error(std::string message) {
    return absl::InvalidArgumentError(std::move(message));
  }

  // What is at pos_, quoted for a message.
  std::string Found() const {
    if (pos_ >= text_.size()) return "end of expression";
    return absl::StrCat("'", absl::CHexEscape(std::string(1, text_[pos_])),
                        "'");
  }

  void SkipSpaces() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  absl::StatusOr<int64_t> ParseExpr(int depth) {
    absl::StatusOr<int64_t> lhs = ParseTerm(depth);
    if (!lhs.ok()) return lhs;
    int64_t value = *lhs;
    while (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
      const char op = text_[pos_];
      const size_t op_pos = pos_++;
      SkipSpaces();
      absl::StatusOr<int64_t> rhs = ParseTerm(depth);
      if (!rhs.ok()) return rhs;
      int64_t result = 0;
      const bool overflow = op == '+'
                                ? __builtin_add_overflow(value, *rhs, &result)
                                : __builtin_sub_overflow(value, *rhs, &result);
      if (overflow) return Overflow(value, op, *rhs, op_pos);
      value = result;
    }
    return value;
  }

  absl::StatusOr<int64_t> ParseTerm(int depth) {
    absl::StatusOr<int64_t> lhs = ParseUnary(depth);
    if (!lhs.ok()) return lhs;
    int64_t value = *lhs;
    while (pos_ < text_.size() && (text_[pos_] == '*' || text_[pos_] == '/')) {
      const char op = text_[pos_];
      const size_t op_pos = pos_++;
      SkipSpaces();
      absl::StatusOr<int64_t> rhs = ParseUnary(depth);
      if (!rhs.ok()) return rhs;
      int64_t result = 0;
      if (op == '*') {
        if (__builtin_mul_overflow(value, *rhs, &result)) {
          return Overflow(value, op, *rhs, op_pos);
        }
      } else {
        if (*rhs == 0) {
          return Error(absl::StrCat("division by zero at position ", op_pos + 1,
                                    " (", value, "/0)"));
        }
        // INT64_MIN / -1 is the one quotient that does not fit.
        if (value == std::numeric_limits<int64_t>::min() && *rhs == -1) {
          return Overflow(value, op, *rhs, op_pos);
        }
        if (value % *rhs != 0) {
          return Error(absl::StrCat("division ", value, "/", *rhs,
                                    " is not exact (at position ", op_pos + 1,
                                    "); only exact integer division is "
                                    "supported"));
        }
        result = value / *rhs;
      }
      value = result;
    }
    return value;
  }

  // Minus signs are counted, not recursed on, so "------5" costs no stack.
  absl::StatusOr<int64_t> ParseUnary(int depth) {
    int minuses = 0;
    while (pos_ < text_.size() && text_[pos_] == '-') {
      ++minuses;
      ++pos_;
      SkipSpaces();
    }
    const bool negate = minuses % 2 == 1;
    if (pos_ < text_.size() && IsDigit(text_[pos_])) {
      // A negated literal may be 2^63: -9223372036854775808 fits.
      return ParseNumber(negate);
    }
    absl::StatusOr<int64_t> value = ParsePrimary(depth);
    if (!value.ok() || !negate) return value;
    if (*value == std::numeric_limits<int64_t>::min()) {
      return Error(
          absl::StrCat("-(", *value, ") does not fit in a 64-bit integer"));
    }
    return -*value;
  }

  absl::StatusOr<int64_t> ParsePrimary(int depth) {
    if (pos_ >= text_.size()) {
      return Error(absl::StrCat("expected a number or '(' at position ",
                                pos_ + 1, ", found the end of the expression"));
    }
    if (text_[pos_] != '(') {
      return Error(absl::StrCat("expected a number or '(' at position ",
                                pos_ + 1, ", found ", Found()));
    }
    if (depth >= kMaxArithmeticNesting) {
      return Error(absl::StrCat("parentheses nested deeper than ",
                                kMaxArithmeticNesting, " at position ",
                                pos_ + 1));
    }
    const size_t open = pos_++;
    SkipSpaces();
    absl::StatusOr<int64_t> value = ParseExpr(depth + 1);
    if (!value.ok()) return value;
    if (pos_ >= text_.size()) {
      return Error(absl::StrCat("unclosed '(' at position ", open + 1));
    }
    if (text_[pos_] != ')') {
      return Error(absl::StrCat("unexpected ", Found(), " at position ",
                                pos_ + 1, " (expected an operator or ')')"));
    }
    ++pos_;
    SkipSpaces();
    return value;
  }

  // Digits at pos_, negated when `negate`; leaves pos_ after the spaces that
  // follow them.
  absl::StatusOr<int64_t> ParseNumber(bool negate) {
    const size_t start = pos_;
    // Magnitudes up to 2^63 (the magnitude of INT64_MIN) fit in uint64_t.
    constexpr uint64_t kMaxMagnitude = uint64_t{1} << 63;
    uint64_t magnitude = 0;
    bool too_large = false;
    while (pos_ < text_.size() && IsDigit(text_[pos_])) {
      const uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
      if (!too_large) {
        if (magnitude > (kMaxMagnitude - digit) / 10) {
          too_large = true;
        } else {
          magnitude = magnitude * 10 + digit;
        }
      }
      ++pos_;
    }
    const uint64_t limit = negate ? kMaxMagnitude : kMaxMagnitude - 1;
    if (too_large || magnitude > limit) {
      std::string digits(text_.substr(start, pos_ - start));
      if (digits.size() > 40)
        digits = absl::StrCat(digits.substr(0, 37), "...");
      return Error(absl::StrCat("the number ", negate ? "-" : "", digits,
                                " at position ", start + 1,
                                " does not fit in a 64-bit integer"));
    }
    SkipSpaces();
    if (negate) {
      // Two's complement negation; exact for 2^63 too.
      return static_cast<int64_t>(~magnitude + 1);
    }
    return static_cast<int64_t>(magnitude);
  }

  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }

  static absl::Status Overflow(int64_t lhs, char op, int64_t rhs,
                               size_t op_pos) {
    return absl::InvalidArgumentError(absl::StrCat(
        lhs, std::string(1, op), rhs < 0 ? "(" : "", rhs, rhs < 0 ? ")" : "",
        " at position ", op_pos + 1, " does not fit in a 64-bit integer"));
  }

  const std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::string> EvaluateArithmetic(std::string_view expression) {
  if (expression.size() > kMaxArithmeticLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("expression is ", expression.size(),
                     " characters long; the limit is ", kMaxArithmeticLength));
  }
  absl::StatusOr<int64_t> value = Evaluator(expression).Evaluate();
  if (!value.ok()) return value.status();
  return absl::StrCat(*value);
}

}  // namespace fusionrl::tasks
