// The `math` reward: final-answer extraction from a model's response and
// numeric comparison with the reference answer (rules in rewards.h).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "fusionrl/task.h"
#include "tasks/rewards.h"

namespace fusionrl::tasks {
namespace {

using int128 = __int128;

constexpr Verdict kCorrect{1.0, true};
constexpr Verdict kWrong{0.0, false};
constexpr int kMaxExponent = 30;

absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlnum(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c));
}
bool StartsWithAt(std::string_view s, size_t pos, std::string_view prefix) {
  return s.size() >= pos && s.substr(pos, prefix.size()) == prefix;
}

std::string_view Trim(std::string_view s) {
  const absl::string_view t = absl::StripAsciiWhitespace(AsAbsl(s));
  return {t.data(), t.size()};
}

// An exact rational num/den, den > 0, in lowest terms.
struct Rational {
  int128 num = 0;
  int128 den = 1;
};

int128 Gcd(int128 a, int128 b) {
  if (a < 0) a = -a;
  while (b != 0) {
    const int128 t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// num/den reduced; nullopt if den == 0.
std::optional<Rational> MakeRational(int128 num, int128 den) {
  if (den == 0) return std::nullopt;
  if (den < 0) {
    num = -num;
    den = -den;
  }
  const int128 g = Gcd(num, den);
  if (g > 1) {
    num /= g;
    den /= g;
  }
  return Rational{num, den};
}

// Reads a run of digits at `*i` into `*value` (value = value * 10 + d),
// also multiplying `*scale` by 10 per digit when non-null. False on
// overflow. Returns the number of digits through `*count`.
bool ReadDigits(std::string_view s, size_t* i, int128* value, int128* scale,
                size_t* count) {
  *count = 0;
  bool ok = true;
  while (*i < s.size() && IsDigit(s[*i])) {
    if (ok &&
        (__builtin_mul_overflow(*value, 10, value) ||
         __builtin_add_overflow(*value, s[*i] - '0', value) ||
         (scale != nullptr && __builtin_mul_overflow(*scale, 10, scale)))) {
      ok = false;
    }
    ++*i;
    ++*count;
  }
  return ok;
}

// A plain number at `pos` (no sign, no '$'): digits with optional
// thousands commas ("1,234,567": a first group of 1-3 digits, then groups
// of exactly three), an optional ".digits" (or a bare ".5"), an optional
// exponent "e[+-]digits" (|e| <= 30), or instead of the last two an
// integer denominator "/digits" ("3/4"). Sets `*end`; `*value` is nullopt
// when the token is well-formed but does not fit (overflow, "/0" is never
// consumed). False if no number starts at `pos`.
bool ScanUnsigned(std::string_view s, size_t pos, size_t* end,
                  std::optional<Rational>* value) {
  size_t i = pos;
  int128 num = 0, den = 1;
  size_t count = 0;
  bool ok = ReadDigits(s, &i, &num, nullptr, &count);
  const size_t int_digits = count;
  if (int_digits > 0 && int_digits <= 3) {
    // Thousands groups: ",ddd" not followed by another digit.
    while (i + 3 < s.size() && s[i] == ',' && IsDigit(s[i + 1]) &&
           IsDigit(s[i + 2]) && IsDigit(s[i + 3]) &&
           (i + 4 >= s.size() || !IsDigit(s[i + 4]))) {
      ++i;
      ok = ReadDigits(s, &i, &num, nullptr, &count) && ok;
    }
  }
  bool integer = true;
  if (i + 1 < s.size() && s[i] == '.' && IsDigit(s[i + 1])) {
    ++i;
    ok = ReadDigits(s, &i, &num, &den, &count) && ok;
    integer = false;
  } else if (int_digits == 0) {
    return false;
  }
  if (i + 1 < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    bool negative = false;
    if (s[j] == '+' || s[j] == '-') {
      negative = s[j] == '-';
      ++j;
    }
    if (j < s.size() && IsDigit(s[j])) {
      int128 exponent = 0;
      ok = ReadDigits(s, &j, &exponent, nullptr, &count) && ok;
      i = j;
      integer = false;
      if (exponent > kMaxExponent) ok = false;
      for (int k = 0; ok && k < static_cast<int>(exponent); ++k) {
        ok = !__builtin_mul_overflow(negative ? den : num, 10,
                                     negative ? &den : &num);
      }
    }
  }
  if (integer && i + 1 < s.size() && s[i] == '/' && IsDigit(s[i + 1])) {
    size_t j = i + 1;
    int128 denominator = 0;
    const bool den_ok = ReadDigits(s, &j, &denominator, nullptr, &count);
    if (denominator != 0) {  // "5/0": the token is just "5"
      i = j;
      ok = ok && den_ok;
      den = denominator;
    }
  }
  *end = i;
  *value = ok ? MakeRational(num, den) : std::nullopt;
  return true;
}

// A number token at `pos`: an optional sign ('-' or '+'), an optional
// currency sign ("$" or "\$"), then a plain number (ScanUnsigned) or a
// LaTeX fraction \frac{A}{B} / \dfrac / \tfrac whose A and B are signed
// plain numbers (spaces allowed inside the braces).
bool ScanNumber(std::string_view s, size_t pos, size_t* end,
                std::optional<Rational>* value) {
  size_t i = pos;
  bool negative = false;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) {
    negative = s[i] == '-';
    ++i;
  }
  if (StartsWithAt(s, i, "\\$")) {
    i += 2;
  } else if (i < s.size() && s[i] == '$') {
    ++i;
  }
  std::optional<Rational> v;
  for (std::string_view frac : {"\\frac", "\\dfrac", "\\tfrac"}) {
    if (!StartsWithAt(s, i, frac)) continue;
    size_t j = i + frac.size();
    std::optional<Rational> parts[2];
    bool ok = true;
    for (auto& part : parts) {
      while (j < s.size() && s[j] == ' ') ++j;
      if (j >= s.size() || s[j] != '{') return false;
      ++j;
      while (j < s.size() && s[j] == ' ') ++j;
      size_t part_end = j;
      if (!ScanNumber(s, j, &part_end, &part)) return false;
      j = part_end;
      while (j < s.size() && s[j] == ' ') ++j;
      if (j >= s.size() || s[j] != '}') return false;
      ++j;
      ok = ok && part.has_value();
    }
    *end = j;
    if (!ok || parts[1]->num == 0) {
      *value = std::nullopt;
      return true;
    }
    int128 num = 0, den = 0;
    if (__builtin_mul_overflow(parts[0]->num, parts[1]->den, &num) ||
        __builtin_mul_overflow(parts[0]->den, parts[1]->num, &den)) {
      *value = std::nullopt;
      return true;
    }
    v = MakeRational(negative ? -num : num, den);
    *value = v;
    return true;
  }
  if (!ScanUnsigned(s, i, end, &v)) return false;
  if (v.has_value() && negative) v->num = -v->num;
  *value = v;
  return true;
}

// A number token found in free text.
struct Token {
  size_t begin = 0;
  size_t end = 0;
  std::optional<Rational> value;
};

// All number tokens of `s`, left to right. A '-' counts as a sign only when
// it does not follow a letter, digit or closing bracket ("5-3" is 5 and 3).
std::vector<Token> NumberTokens(std::string_view s) {
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    const char prev = i > 0 ? s[i - 1] : ' ';
    bool candidate =
        IsDigit(c) || c == '$' || c == '\\' || (c == '.' && !IsDigit(prev));
    if (c == '-' || c == '+') {
      candidate = !IsAlnum(prev) && prev != ')' && prev != '}' && prev != ']';
    }
    size_t end = i;
    std::optional<Rational> value;
    if (candidate && ScanNumber(s, i, &end, &value) && end > i) {
      tokens.push_back({i, end, value});
      i = end;
    } else {
      ++i;
    }
  }
  return tokens;
}

// The content of the last complete, non-empty \boxed{...} or \fbox{...}
// (braces balanced; "\{" and "\}" are literal), or nullopt.
std::optional<std::string_view> LastBoxed(std::string_view s) {
  std::optional<std::string_view> last;
  for (size_t pos = s.find('\\'); pos != std::string_view::npos;
       pos = s.find('\\', pos + 1)) {
    size_t i = pos;
    if (StartsWithAt(s, i, "\\boxed")) {
      i += 6;
    } else if (StartsWithAt(s, i, "\\fbox")) {
      i += 5;
    } else {
      continue;
    }
    while (i < s.size() && s[i] == ' ') ++i;
    if (i >= s.size() || s[i] != '{') continue;
    const size_t start = i + 1;
    int depth = 0;
    for (; i < s.size(); ++i) {
      if (s[i] == '\\' && i + 1 < s.size()) {
        ++i;  // \{ \} \\ are not structure
      } else if (s[i] == '{') {
        ++depth;
      } else if (s[i] == '}' && --depth == 0) {
        break;
      }
    }
    if (i >= s.size()) break;  // unbalanced: nothing after it is complete
    const std::string_view content = Trim(s.substr(start, i - start));
    if (!content.empty()) last = content;
  }
  return last;
}

// Removes LaTeX and currency noise from an answer: \text{X} / \textbf /
// \mathrm / \mbox become X; \left \right \! \, \; \: "\ " ~ \displaystyle,
// degree signs (^\circ, ^{\circ}), "$", "\$", "%", "\%" are dropped;
// \dfrac and \tfrac become \frac; outer braces and surrounding whitespace
// and trailing periods are stripped.
std::string Normalize(std::string_view text) {
  std::string s(text);
  for (std::string_view wrapper :
       {"\\text{", "\\textbf{", "\\textrm{", "\\mathrm{", "\\mbox{"}) {
    for (size_t pos = s.find(wrapper); pos != std::string::npos;
         pos = s.find(wrapper, pos)) {
      // Drop the wrapper and its matching close brace.
      size_t i = pos + wrapper.size();
      int depth = 1;
      for (; i < s.size(); ++i) {
        if (s[i] == '{') ++depth;
        if (s[i] == '}' && --depth == 0) break;
      }
      if (i >= s.size()) break;
      s.replace(i, 1, " ");
      s.replace(pos, wrapper.size(), " ");
    }
  }
  s = absl::StrReplaceAll(s, {{"^{\\circ}", ""},
                              {"^\\circ", ""},
                              {"\\circ", ""},
                              {"\\left", ""},
                              {"\\right", ""},
                              {"\\displaystyle", ""},
                              {"\\!", ""},
                              {"\\,", ""},
                              {"{,}", ","},
                              {"\\;", " "},
                              {"\\:", " "},
                              {"\\ ", " "},
                              {"~", " "},
                              {"\\$", ""},
                              {"$", ""},
                              {"\\%", ""},
                              {"%", ""},
                              {"\\dfrac", "\\frac"},
                              {"\\tfrac", "\\frac"}});
  std::string_view v = Trim(s);
  while (true) {
    while (!v.empty() && v.back() == '.') v = Trim(v.substr(0, v.size() - 1));
    if (v.size() >= 2 && v.front() == '{' && v.back() == '}') {
      v = Trim(v.substr(1, v.size() - 2));
      continue;
    }
    break;
  }
  return std::string(v);
}

// The value of a normalised answer: the whole text as one number token, or
// else its only number token when the rest is plain words ("18 dollars",
// "x = 5": no LaTeX command, bracket or operator, so "\sqrt{2}" and "2x+1"
// have none); nullopt otherwise, or if the number does not fit.
std::optional<Rational> AnswerValue(std::string_view normalized) {
  size_t end = 0;
  std::optional<Rational> value;
  if (ScanNumber(normalized, 0, &end, &value) && end == normalized.size()) {
    return value;
  }
  const std::vector<Token> tokens = NumberTokens(normalized);
  if (tokens.size() != 1) return std::nullopt;
  const std::string_view before = normalized.substr(0, tokens[0].begin);
  const std::string_view after = normalized.substr(tokens[0].end);
  for (std::string_view rest : {before, after}) {
    if (rest.find_first_of("\\^_{}()[]*/+-|<>!") != std::string_view::npos) {
      return std::nullopt;
    }
  }
  return tokens[0].value;
}

// Exact: GSM8K's graders compare the final number exactly (verl's gsm8k
// reward compares the extracted string), so a value near the reference is
// wrong (72.00001 != 72); lowest terms make 72.0 = 72 and 0.75 = 3/4.
bool ValuesEqual(const Rational& a, const Rational& b) {
  return a.num == b.num && a.den == b.den;
}

std::string WithoutSpaces(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) out.push_back(c);
  }
  return out;
}

class MathReward final : public RewardFn {
 public:
  Verdict Score(const Problem& problem,
                std::string_view response) const override {
    const std::optional<std::string> answer = ExtractMathAnswer(response);
    if (!answer.has_value()) return kWrong;
    std::string_view reference = problem.answer;
    const size_t hashes = reference.rfind("####");
    if (hashes != std::string_view::npos) {
      reference = reference.substr(hashes + 4);
    }
    return MathAnswersEqual(*answer, reference) ? kCorrect : kWrong;
  }
};

}  // namespace

std::optional<std::string> ExtractMathAnswer(std::string_view response) {
  const std::optional<std::string_view> answer =
      AnswerText(response, /*prompt_opens_thinking=*/false);
  if (!answer.has_value()) return std::nullopt;
  response = *answer;
  if (const auto boxed = LastBoxed(response); boxed.has_value()) {
    return std::string(*boxed);
  }
  const size_t hashes = response.rfind("####");
  if (hashes != std::string_view::npos) {
    const std::string_view rest = response.substr(hashes + 4);
    const std::vector<Token> tokens = NumberTokens(rest);
    if (!tokens.empty()) {
      return std::string(
          rest.substr(tokens[0].begin, tokens[0].end - tokens[0].begin));
    }
    const std::string_view line = Trim(rest.substr(0, rest.find('\n')));
    if (!line.empty()) return std::string(line);
  }
  const std::vector<Token> tokens = NumberTokens(response);
  if (tokens.empty()) return std::nullopt;
  return std::string(response.substr(tokens.back().begin,
                                     tokens.back().end - tokens.back().begin));
}

bool MathAnswersEqual(std::string_view candidate, std::string_view reference) {
  const std::string c = Normalize(candidate);
  const std::string r = Normalize(reference);
  if (r.empty() || c.empty()) return false;
  const std::optional<Rational> cv = AnswerValue(c);
  const std::optional<Rational> rv = AnswerValue(r);
  if (cv.has_value() && rv.has_value()) return ValuesEqual(*cv, *rv);
  if (cv.has_value() != rv.has_value()) return false;
  return WithoutSpaces(c) == WithoutSpaces(r);
}

std::unique_ptr<RewardFn> MakeMathReward() {
  return std::make_unique<MathReward>();
}

}  // namespace fusionrl::tasks
