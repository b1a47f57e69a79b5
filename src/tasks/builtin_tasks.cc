#include "tasks/builtin_tasks.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/seed.h"
#include "core/status_macros.h"
#include "tasks/rewards.h"

namespace fusionrl::tasks {
namespace {

// Draws of the eval stream before giving up on eval_size distinct prompts.
uint64_t MaxEvalDraws(int eval_size) {
  return 50 * static_cast<uint64_t>(eval_size) + 1000;
}
// Training indices checked at construction, and attempts allowed for each.
constexpr uint64_t kTrainProbeProblems = 64;
constexpr uint64_t kTrainProbeAttempts = 1000;

constexpr int kMaxAdditionDigits = 18;  // the sum still fits in int64_t
constexpr int kMaxMultiplyDigits = 9;   // the product still fits in int64_t
constexpr int kMaxStringLength = 1000;  // reverse, sort
constexpr int kMaxCountdownOperands = 8;
constexpr int kMaxCountdownOperand = 9999;
constexpr int64_t kMaxCountdownTarget = 9999;
constexpr int kMaxRepeatCount = 500;  // answers stay <= kMaxStringLength

absl::Status CheckEvalSize(const TaskConfig& c) {
  if (c.eval_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.eval_size: must be >= 0 (got ", c.eval_size, ")"));
  }
  return absl::OkStatus();
}

// min_digits/max_digits as a length range 1 <= min <= max <= `limit`.
absl::Status CheckLengths(const TaskConfig& c, const std::string& task,
                          int limit) {
  if (c.min_digits < 1 || c.min_digits > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.min_digits: must be in [1, ", limit, "] for the ",
                     task, " task (got ", c.min_digits, ")"));
  }
  if (c.max_digits < c.min_digits || c.max_digits > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task.max_digits: must be in [task.min_digits (", c.min_digits, "), ",
        limit, "] for the ", task, " task (got ", c.max_digits, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Task>> Finish(
    std::unique_ptr<SyntheticTask> task, int eval_size) {
  FUSIONRL_RETURN_IF_ERROR(task->Init(eval_size));
  return std::unique_ptr<Task>(std::move(task));
}

// "47+385=" -> "432". Operands have a uniform digit count in
// [min_digits, max_digits] and no leading zeros.
class AdditionTask final : public SyntheticTask {
 public:
  explicit AdditionTask(const TaskConfig& c)
      : SyntheticTask("addition", "exact", c.seed),
        min_digits_(c.min_digits),
        max_digits_(c.max_digits) {}

 protected:
  Problem Generate(std::mt19937_64& rng) const override {
    const int64_t a = Operand(rng);
    const int64_t b = Operand(rng);
    return {absl::StrCat(a, "+", b, "="), absl::StrCat(a + b)};
  }

 private:
  int64_t Operand(std::mt19937_64& rng) const {
    const int digits =
        static_cast<int>(UniformInt(rng, min_digits_, max_digits_));
    int64_t lo = 1;
    for (int i = 1; i < digits; ++i) lo *= 10;
    return UniformInt(rng, digits == 1 ? 0 : lo, lo * 10 - 1);
  }

  const int min_digits_;
  const int max_digits_;
};

// "347*29=" -> "10063" (the calculator environment's task). Operands have a
// uniform digit count in [min_digits, max_digits] and no leading zeros; a
// one-digit operand is 1-9, never 0, so no product is trivially 0.
class MultiplyTask final : public SyntheticTask {
 public:
  explicit MultiplyTask(const TaskConfig& c)
      : SyntheticTask("multiply", "exact", c.seed),
        min_digits_(c.min_digits),
        max_digits_(c.max_digits) {}

 protected:
  Problem Generate(std::mt19937_64& rng) const override {
    const int64_t a = Operand(rng);
    const int64_t b = Operand(rng);
    return {absl::StrCat(a, "*", b, "="), absl::StrCat(a * b)};
  }

 private:
  int64_t Operand(std::mt19937_64& rng) const {
    const int digits =
        static_cast<int>(UniformInt(rng, min_digits_, max_digits_));
    int64_t lo = 1;
    for (int i = 1; i < digits; ++i) lo *= 10;
    return UniformInt(rng, lo, lo * 10 - 1);
  }

  const int min_digits_;
  const int max_digits_;
};

// Base of reverse and sort: a random string over `alphabet`.
class StringTask : public SyntheticTask {
 protected:
  StringTask(std::string name, std::string alphabet, const TaskConfig& c)
      : SyntheticTask(std::move(name), "exact", c.seed),
        alphabet_(std::move(alphabet)),
        min_length_(c.min_digits),
        max_length_(c.max_digits) {}

  std::string RandomString(std::mt19937_64& rng) const {
    const auto length =
        static_cast<size_t>(UniformInt(rng, min_length_, max_length_));
    std::string s(length, ' ');
    const int64_t last = static_cast<int64_t>(alphabet_.size()) - 1;
    for (char& ch : s) ch = alphabet_[UniformInt(rng, 0, last)];
    return s;
  }

 private:
  const std::string alphabet_;
  const int min_length_;
  const int max_length_;
};

// "rev:abc=" -> "cba".
class ReverseTask final : public StringTask {
 public:
  explicit ReverseTask(const TaskConfig& c)
      : StringTask("reverse", "abcdefghijklmnopqrstuvwxyz", c) {}

 protected:
  Problem Generate(std::mt19937_64& rng) const override {
    const std::string s = RandomString(rng);
    return {absl::StrCat("rev:", s, "="), std::string(s.rbegin(), s.rend())};
  }
};

// "sort:31942=" -> "12349".
class SortTask final : public StringTask {
 public:
  explicit SortTask(const TaskConfig& c)
      : StringTask("sort", "0123456789", c) {}

 protected:
  Problem Generate(std::mt19937_64& rng) const override {
    const std::string s = RandomString(rng);
    std::string sorted = s;
    std::sort(sorted.begin(), sorted.end());
    return {absl::StrCat("sort:", s, "="), std::move(sorted)};
  }
};

// "3,7,9>30=" -> "7*3+9": num_operands numbers from 1..max_operand; the
// target is the value of an expression using each number once, in a random
// order, joined by random + - * (usual precedence). Draws whose target is
// outside [1, 9999] are redrawn. The answer is that expression.
class CountdownTask final : public SyntheticTask {
 public:
  explicit CountdownTask(const TaskConfig& c)
      : SyntheticTask("countdown", "countdown", c.seed),
        num_operands_(c.num_operands),
        max_operand_(c.max_operand) {}

 protected:
  Problem Generate(std::mt19937_64& rng) const override {
    std::vector<int64_t> numbers(num_operands_);
    while (true) {
      for (int64_t& n : numbers) n = UniformInt(rng, 1, max_operand_);
      std::vector<int64_t> order = numbers;
      for (size_t i = order.size() - 1; i > 0; --i) {
        std::swap(order[i], order[UniformInt(rng, 0, i)]);
      }
      std::string expr = absl::StrCat(order[0]);
      for (size_t i = 1; i < order.size(); ++i) {
        absl::StrAppend(&expr, std::string(1, "+-*"[UniformInt(rng, 0, 2)]),
                        order[i]);
      }
      // Evaluating the text with the reward's own parser keeps the two in
      // agreement (and rejects overflow).
      const absl::StatusOr<int64_t> target =
          EvalCountdownExpression(expr, nullptr);
      if (target.ok() && *target > 0 && *target <= kMaxCountdownTarget) {
        return {absl::StrCat(absl::StrJoin(numbers, ","), ">", *target, "="),
                std::move(expr)};
      }
    }
  }

 private:
  const int num_operands_;
  const int max_operand_;
};

// "rep:ab*7=" -> "ababababababab": a pattern of 1-2 lowercase letters, drawn
// uniformly from all 26 + 26 * 26 such patterns, repeated n times. With
// probability long_fraction n is long, uniform in [(long_max + 1) / 2,
// long_max]; otherwise it is short, uniform in [min_digits, max_digits].
// Answer lengths thus have a long tail (at most 2 * long_max).
//
// The alphabet is all of a-z because the eval split is drawn from the same
// distribution: with few patterns, the eval split would hold nearly every
// short prompt, and training (which redraws eval prompts) would see mostly
// long problems. With 702 patterns, at the defaults the eval split holds
// under a tenth of the short prompts, which raises training's long share only
// slightly (about 0.135 for long_fraction 0.125).
class RepeatTask final : public SyntheticTask {
 public:
  explicit RepeatTask(const TaskConfig& c)
      : SyntheticTask("repeat", "exact", c.seed),
        min_short_(c.min_digits),
        max_short_(c.max_digits),
        long_fraction_(c.long_fraction),
        min_long_((c.long_max + 1) / 2),
        max_long_(c.long_max) {}

 protected:
  Problem Generate(std::mt19937_64& rng) const override {
    constexpr int64_t kLetters = 26;
    // Index into the 1-letter patterns, then the 2-letter ones.
    const int64_t k = UniformInt(rng, 0, kLetters + kLetters * kLetters - 1);
    std::string pattern;
    if (k < kLetters) {
      pattern.push_back(static_cast<char>('a' + k));
    } else {
      pattern.push_back(static_cast<char>('a' + (k - kLetters) / kLetters));
      pattern.push_back(static_cast<char>('a' + (k - kLetters) % kLetters));
    }
    // 53 random bits: a portable uniform double in [0, 1).
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    const int64_t n = u < long_fraction_
                          ? UniformInt(rng, min_long_, max_long_)
                          : UniformInt(rng, min_short_, max_short_);
    std::string answer;
    answer.reserve(pattern.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) answer += pattern;
    return {absl::StrCat("rep:", pattern, "*", n, "="), std::move(answer)};
  }

 private:
  const int min_short_;
  const int max_short_;
  const double long_fraction_;
  const int min_long_;
  const int max_long_;
};

}  // namespace

uint64_t ProblemSeed(uint64_t seed, uint64_t stream, uint64_t index,
                     uint64_t attempt) {
  return fusionrl::MixSeed(
      fusionrl::MixSeed(fusionrl::MixSeed(seed, stream), index), attempt);
}

int64_t UniformInt(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  if (span == kMax) return static_cast<int64_t>(rng());
  const uint64_t n = span + 1;
  const uint64_t limit = kMax - kMax % n;  // [0, limit) splits evenly
  uint64_t x = rng();
  while (x >= limit) x = rng();
  return static_cast<int64_t>(static_cast<uint64_t>(lo) + x % n);
}

SyntheticTask::SyntheticTask(std::string name, std::string default_reward,
                             int64_t seed)
    : name_(std::move(name)),
      default_reward_(std::move(default_reward)),
      seed_(static_cast<uint64_t>(seed)) {}

Problem SyntheticTask::Draw(uint64_t stream, uint64_t index,
                            uint64_t attempt) const {
  std::mt19937_64 rng(ProblemSeed(seed_, stream, index, attempt));
  return Generate(rng);
}

Problem SyntheticTask::TrainProblem(uint64_t index) const {
  // Init() checked that a non-eval problem is found quickly, so this loop
  // ends after a few attempts with overwhelming probability.
  for (uint64_t attempt = 0;; ++attempt) {
    Problem p = Draw(kTrainStream, index, attempt);
    if (!eval_prompts_.contains(p.prompt)) return p;
  }
}

absl::Status SyntheticTask::Init(int eval_size) {
  const size_t want = static_cast<size_t>(eval_size);
  const uint64_t max_draws = MaxEvalDraws(eval_size);
  for (uint64_t i = 0; eval_.size() < want && i < max_draws; ++i) {
    Problem p = Draw(kEvalStream, i, 0);
    if (eval_prompts_.insert(p.prompt).second) eval_.push_back(std::move(p));
  }
  if (eval_.size() < want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task.eval_size: only ", eval_.size(), " distinct ", name_,
        " problems could be drawn; lower task.eval_size or widen the task"));
  }
  for (uint64_t index = 0; index < kTrainProbeProblems; ++index) {
    bool found = false;
    for (uint64_t a = 0; a < kTrainProbeAttempts && !found; ++a) {
      found = !eval_prompts_.contains(Draw(kTrainStream, index, a).prompt);
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("task.eval_size: the eval split (", eval_.size(),
                       " prompts) covers (nearly) the whole ", name_,
                       " problem space, leaving no training problems; lower "
                       "task.eval_size or widen the task"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Task>> MakeAdditionTask(const TaskConfig& c) {
  FUSIONRL_RETURN_IF_ERROR(CheckEvalSize(c));
  FUSIONRL_RETURN_IF_ERROR(CheckLengths(c, "addition", kMaxAdditionDigits));
  return Finish(std::make_unique<AdditionTask>(c), c.eval_size);
}

absl::StatusOr<std::unique_ptr<Task>> MakeMultiplyTask(const TaskConfig& c) {
  FUSIONRL_RETURN_IF_ERROR(CheckEvalSize(c));
  FUSIONRL_RETURN_IF_ERROR(CheckLengths(c, "multiply", kMaxMultiplyDigits));
  return Finish(std::make_unique<MultiplyTask>(c), c.eval_size);
}

absl::StatusOr<std::unique_ptr<Task>> MakeReverseTask(const TaskConfig& c) {
  FUSIONRL_RETURN_IF_ERROR(CheckEvalSize(c));
  FUSIONRL_RETURN_IF_ERROR(CheckLengths(c, "reverse", kMaxStringLength));
  return Finish(std::make_unique<ReverseTask>(c), c.eval_size);
}

absl::StatusOr<std::unique_ptr<Task>> MakeSortTask(const TaskConfig& c) {
  FUSIONRL_RETURN_IF_ERROR(CheckEvalSize(c));
  FUSIONRL_RETURN_IF_ERROR(CheckLengths(c, "sort", kMaxStringLength));
  return Finish(std::make_unique<SortTask>(c), c.eval_size);
}

absl::StatusOr<std::unique_ptr<Task>> MakeRepeatTask(const TaskConfig& c) {
  FUSIONRL_RETURN_IF_ERROR(CheckEvalSize(c));
  FUSIONRL_RETURN_IF_ERROR(CheckLengths(c, "repeat", kMaxRepeatCount));
  // Written so that NaN fails.
  if (!(c.long_fraction >= 0.0 && c.long_fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.long_fraction: must be in [0, 1] for the repeat "
                     "task (got ",
                     c.long_fraction, ")"));
  }
  if (c.long_max < 1 || c.long_max > kMaxRepeatCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.long_max: must be in [1, ", kMaxRepeatCount,
                     "] for the repeat task (got ", c.long_max, ")"));
  }
  return Finish(std::make_unique<RepeatTask>(c), c.eval_size);
}

absl::StatusOr<std::unique_ptr<Task>> MakeCountdownTask(const TaskConfig& c) {
  FUSIONRL_RETURN_IF_ERROR(CheckEvalSize(c));
  if (c.num_operands < 1 || c.num_operands > kMaxCountdownOperands) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task.num_operands: must be in [1, ", kMaxCountdownOperands,
        "] for the countdown task (got ", c.num_operands, ")"));
  }
  if (c.max_operand < 1 || c.max_operand > kMaxCountdownOperand) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.max_operand: must be in [1, ", kMaxCountdownOperand,
                     "] for the countdown task (got ", c.max_operand, ")"));
  }
  return Finish(std::make_unique<CountdownTask>(c), c.eval_size);
}

}  // namespace fusionrl::tasks
