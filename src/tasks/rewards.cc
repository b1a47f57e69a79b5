#include "tasks/rewards.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "fusionrl/task.h"

namespace fusionrl::tasks {
namespace {

constexpr Verdict kCorrect{1.0, true};
constexpr Verdict kWrong{0.0, false};
constexpr int kMaxNesting = 64;

// Abseil 20220623 (Debian) has its own string_view type.
absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

// Parses all of `digits` (decimal digits only, non-empty) into `*value`;
// false on anything else or on int64 overflow.
bool ParseDigits(std::string_view digits, int64_t* value) {
  if (digits.empty()) return false;
  int64_t v = 0;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
    if (__builtin_mul_overflow(v, int64_t{10}, &v) ||
        __builtin_add_overflow(v, int64_t{c - '0'}, &v)) {
      return false;
    }
  }
  *value = v;
  return true;
}

// Recursive-descent parser for EvalCountdownExpression:
//   expr   := term (('+' | '-') term)*
//   term   := factor ('*' factor)*
//   factor := number | '(' expr ')'
// Single use; not thread-safe.
class ExprParser {
 public:
  ExprParser(std::string_view text, std::vector<int64_t>* numbers)
      : text_(text), numbers_(numbers) {}

  absl::StatusOr<int64_t> Parse() {
    absl::StatusOr<int64_t> value = ParseExpr(0);
    if (!value.ok()) return value;
    SkipSpaces();
    if (pos_ != text_.size()) return Error("unexpected character");
    return value;
  }

 private:
  absl::StatusOr<int64_t> ParseExpr(int depth) {
    absl::StatusOr<int64_t> lhs = ParseTerm(depth);
    if (!lhs.ok()) return lhs;
    int64_t value = *lhs;
    while (true) {
      SkipSpaces();
      if (pos_ >= text_.size() || (text_[pos_] != '+' && text_[pos_] != '-')) {
        return value;
      }
      const char op = text_[pos_++];
      absl::StatusOr<int64_t> rhs = ParseTerm(depth);
      if (!rhs.ok()) return rhs;
      const bool overflow = op == '+'
                                ? __builtin_add_overflow(value, *rhs, &value)
                                : __builtin_sub_overflow(value, *rhs, &value);
      if (overflow) return Error("overflow");
    }
  }

  absl::StatusOr<int64_t> ParseTerm(int depth) {
    absl::StatusOr<int64_t> lhs = ParseFactor(depth);
    if (!lhs.ok()) return lhs;
    int64_t value = *lhs;
    while (true) {
      SkipSpaces();
      if (pos_ >= text_.size() || text_[pos_] != '*') return value;
      ++pos_;
      absl::StatusOr<int64_t> rhs = ParseFactor(depth);
      if (!rhs.ok()) return rhs;
      if (__builtin_mul_overflow(value, *rhs, &value)) {
        return Error("overflow");
      }
    }
  }

  absl::StatusOr<int64_t> ParseFactor(int depth) {
    SkipSpaces();
    if (pos_ >= text_.size()) return Error("unexpected end");
    if (text_[pos_] == '(') {
      if (depth >= kMaxNesting) return Error("nesting too deep");
      ++pos_;
      absl::StatusOr<int64_t> value = ParseExpr(depth + 1);
      if (!value.ok()) return value;
      SkipSpaces();
      if (pos_ >= text_.size() || text_[pos_] != ')') {
        return Error("expected ')'");
      }
      ++pos_;
      return value;
    }
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           absl::ascii_isdigit(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
    int64_t value = 0;
    if (pos_ == start) return Error("expected a number or '('");
    if (!ParseDigits(text_.substr(start, pos_ - start), &value)) {
      return Error("number too large");
    }
    if (numbers_ != nullptr) numbers_->push_back(value);
    return value;
  }

  void SkipSpaces() {
    while (pos_ < text_.size() &&
           absl::ascii_isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }

  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(what), " at offset ", pos_));
  }

  std::string_view text_;
  std::vector<int64_t>* numbers_;
  size_t pos_ = 0;
};

// True iff `s` is [+-]digits[.digits][(e|E)[+-]digits] with at least one
// mantissa digit (".5" and "5." are accepted).
bool IsDecimalNumber(absl::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < s.size() &&
           absl::ascii_isdigit(static_cast<unsigned char>(s[i])))
      ++i;
    return i - start;
  };
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  size_t mantissa = digits();
  if (i < s.size() && s[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

bool ParseDecimal(std::string_view text, double* value) {
  const absl::string_view s = absl::StripAsciiWhitespace(AsAbsl(text));
  return IsDecimalNumber(s) && absl::SimpleAtod(s, value) &&
         std::isfinite(*value);
}

class ExactReward final : public RewardFn {
 public:
  Verdict Score(const Problem& problem,
                std::string_view response) const override {
    return absl::StripAsciiWhitespace(AsAbsl(response)) ==
                   absl::StripAsciiWhitespace(problem.answer)
               ? kCorrect
               : kWrong;
  }
};

// Partial credit: the fraction of aligned positions where response and answer
// agree, over the longer of the two; correct only on an exact match. A dense
// signal for tasks whose answers are built character by character.
class CharMatchReward final : public RewardFn {
 public:
  Verdict Score(const Problem& problem,
                std::string_view response) const override {
    const absl::string_view r = absl::StripAsciiWhitespace(AsAbsl(response));
    const absl::string_view a = absl::StripAsciiWhitespace(problem.answer);
    if (r == a) return kCorrect;
    const size_t longest = std::max(r.size(), a.size());
    size_t same = 0;
    for (size_t i = 0; i < std::min(r.size(), a.size()); ++i) {
      same += r[i] == a[i] ? 1 : 0;
    }
    return Verdict{static_cast<double>(same) / static_cast<double>(longest),
                   false};
  }
};

class NumericReward final : public RewardFn {
 public:
  Verdict Score(const Problem& problem,
                std::string_view response) const override {
    double r = 0, a = 0;
    if (!ParseDecimal(response, &r) || !ParseDecimal(problem.answer, &a)) {
      return kWrong;
    }
    return std::fabs(r - a) <= 1e-6 * std::max(1.0, std::fabs(a)) ? kCorrect
                                                                  : kWrong;
  }
};

class CountdownReward final : public RewardFn {
 public:
  Verdict Score(const Problem& problem,
                std::string_view response) const override {
    absl::StatusOr<CountdownPrompt> prompt =
        ParseCountdownPrompt(problem.prompt);
    if (!prompt.ok()) return kWrong;
    std::vector<int64_t> used;
    absl::StatusOr<int64_t> value = EvalCountdownExpression(response, &used);
    if (!value.ok() || *value != prompt->target) return kWrong;
    std::vector<int64_t> given = prompt->numbers;
    std::sort(given.begin(), given.end());
    std::sort(used.begin(), used.end());
    return used == given ? kCorrect : kWrong;
  }
};

}  // namespace

bool EndsInsideThinking(std::string_view text) {
  const size_t open = text.rfind("<think>");
  if (open == std::string_view::npos) return false;
  const size_t close = text.rfind("</think>");
  return close == std::string_view::npos || close < open;
}

std::optional<std::string_view> AnswerText(std::string_view response,
                                           bool prompt_opens_thinking) {
  constexpr std::string_view kClose = "</think>";
  const size_t close = response.rfind(kClose);
  if (close == std::string_view::npos) {
    if (prompt_opens_thinking || EndsInsideThinking(response)) {
      return std::nullopt;
    }
    return response;
  }
  if (EndsInsideThinking(response)) return std::nullopt;
  return response.substr(close + kClose.size());
}

absl::StatusOr<int64_t> EvalCountdownExpression(std::string_view expr,
                                                std::vector<int64_t>* numbers) {
  return ExprParser(expr, numbers).Parse();
}

absl::StatusOr<CountdownPrompt> ParseCountdownPrompt(std::string_view prompt) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("not a countdown prompt (want \"n1,n2,...>target=\"): \"",
                     absl::CHexEscape(AsAbsl(prompt)), "\""));
  };
  const size_t gt = prompt.find('>');
  if (gt == std::string_view::npos || prompt.empty() || prompt.back() != '=') {
    return bad();
  }
  CountdownPrompt result;
  if (!ParseDigits(prompt.substr(gt + 1, prompt.size() - gt - 2),
                   &result.target)) {
    return bad();
  }
  for (absl::string_view part :
       absl::StrSplit(AsAbsl(prompt.substr(0, gt)), ',')) {
    int64_t n = 0;
    if (!ParseDigits({part.data(), part.size()}, &n)) return bad();
    result.numbers.push_back(n);
  }
  return result;
}

std::unique_ptr<RewardFn> MakeExactReward() {
  return std::make_unique<ExactReward>();
}
std::unique_ptr<RewardFn> MakeCharMatchReward() {
  return std::make_unique<CharMatchReward>();
}
std::unique_ptr<RewardFn> MakeNumericReward() {
  return std::make_unique<NumericReward>();
}
std::unique_ptr<RewardFn> MakeCountdownReward() {
  return std::make_unique<CountdownReward>();
}

}  // namespace fusionrl::tasks
