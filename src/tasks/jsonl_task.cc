// JSONL-backed tasks: loading, eval split and shuffle (jsonl_task.h), and
// the `jsonl` task's {"prompt", "answer"} records.

#include "tasks/jsonl_task.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"
#include "tasks/builtin_tasks.h"

namespace fusionrl::tasks {
namespace {

std::string ErrnoMessage(int err) {
  return std::generic_category().message(err);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open (", ErrnoMessage(errno), ")"));
  }
  std::string content;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) content.append(buf, n);
  const int err = std::ferror(f) ? errno : 0;
  std::fclose(f);
  if (err != 0) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot read (", ErrnoMessage(err), ")"));
  }
  return content;
}

// One JSONL line -> JSON value; the error message is the bare reason.
absl::StatusOr<nlohmann::json> ParseLine(absl::string_view line) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.what(): "[json.exception.parse_error.101] parse error at line 1,
    // column 7: syntax error while parsing ..."; keep the part after the
    // position, the line is always 1.
    const absl::string_view what = e.what();
    const size_t column = what.find("column ");
    const size_t colon = what.find(": ", column);
    const absl::string_view detail =
        column == absl::string_view::npos || colon == absl::string_view::npos
            ? what
            : what.substr(colon + 2);
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON at column ", e.byte, ": ", detail));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a JSON object, got ", j.type_name()));
  }
  return j;
}

// A jsonl-task record: {"prompt": str, "answer": str|number}.
absl::StatusOr<Problem> ParsePromptRecord(const nlohmann::json& j) {
  Problem p;
  const auto prompt = j.find("prompt");
  if (prompt == j.end()) {
    return absl::InvalidArgumentError("missing \"prompt\"");
  }
  if (!prompt->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"prompt\" must be a string, got ", prompt->type_name()));
  }
  p.prompt = prompt->get<std::string>();
  if (p.prompt.empty()) {
    return absl::InvalidArgumentError("\"prompt\" is empty");
  }
  const auto answer = j.find("answer");
  if (answer == j.end()) {
    return absl::InvalidArgumentError("missing \"answer\"");
  }
  if (answer->is_string()) {
    p.answer = answer->get<std::string>();
  } else if (answer->is_number()) {
    p.answer = answer->dump();
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"answer\" must be a string or a number, got ", answer->type_name()));
  }
  return p;
}

}  // namespace

absl::StatusOr<std::vector<Problem>> LoadJsonl(
    const std::string& path, const JsonlRecordParser& parse_record) {
  FUSIONRL_ASSIGN_OR_RETURN(const std::string content, ReadFile(path));
  std::vector<Problem> records;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    ++line_number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<nlohmann::json> json = ParseLine(line);
    absl::StatusOr<Problem> record =
        json.ok() ? parse_record(*json)
                  : absl::StatusOr<Problem>(json.status());
    if (!record.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_number, ": ", record.status().message()));
    }
    records.push_back(*std::move(record));
  }
  return records;
}

namespace {

// Problems from JSONL files: a fixed eval split and training records
// visited in a fresh seeded shuffle every epoch (TrainProblem(index) is
// record perm_e[index % n] with e = index / n).
// Thread safety: const methods are safe to call concurrently; the current
// epoch's permutation is cached under `mu_`.
class JsonlTask final : public Task {
 public:
  // REQUIRES: !train.empty(); no train prompt is an eval prompt.
  JsonlTask(std::string name, std::string default_reward,
            std::vector<Problem> train, std::vector<Problem> eval, int64_t seed)
      : name_(std::move(name)),
        default_reward_(std::move(default_reward)),
        train_(std::move(train)),
        eval_(std::move(eval)),
        seed_(static_cast<uint64_t>(seed)) {}

  std::string name() const override { return name_; }
  std::string default_reward() const override { return default_reward_; }
  const std::vector<Problem>& eval_set() const override { return eval_; }
  std::string Solution(const Problem& problem) const override {
    return problem.solution.empty() ? problem.answer : problem.solution;
  }

  Problem TrainProblem(uint64_t index) const override {
    const uint64_t n = train_.size();
    const uint64_t epoch = index / n;
    absl::MutexLock lock(&mu_);
    if (perm_.empty() || perm_epoch_ != epoch) {
      perm_ = Permutation(epoch);
      perm_epoch_ = epoch;
    }
    return train_[perm_[index % n]];
  }

 private:
  std::vector<size_t> Permutation(uint64_t epoch) const {
    std::vector<size_t> perm(train_.size());
    std::iota(perm.begin(), perm.end(), size_t{0});
    std::mt19937_64 rng(ProblemSeed(seed_, kShuffleStream, epoch, 0));
    for (size_t i = perm.size() - 1; i > 0; --i) {
      std::swap(perm[i], perm[UniformInt(rng, 0, static_cast<int64_t>(i))]);
    }
    return perm;
  }

  const std::string name_;
  const std::string default_reward_;
  const std::vector<Problem> train_;
  const std::vector<Problem> eval_;
  const uint64_t seed_;
  mutable absl::Mutex mu_;
  mutable uint64_t perm_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::vector<size_t> perm_ ABSL_GUARDED_BY(mu_);  // empty: none yet
};

}  // namespace

absl::StatusOr<std::unique_ptr<Task>> MakeJsonlTaskFromSpec(
    const TaskConfig& c, const JsonlTaskSpec& spec) {
  if (c.train_path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.train_path: required by the ", spec.name, " task"));
  }
  if (c.eval_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.eval_size: must be >= 0 (got ", c.eval_size, ")"));
  }
  const size_t eval_size = static_cast<size_t>(c.eval_size);
  FUSIONRL_ASSIGN_OR_RETURN(std::vector<Problem> train,
                            LoadJsonl(c.train_path, spec.parse_record));
  std::vector<Problem> eval;
  if (!c.eval_path.empty()) {
    FUSIONRL_ASSIGN_OR_RETURN(eval, LoadJsonl(c.eval_path, spec.parse_record));
    if (eval.empty() && eval_size > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.eval_path, ": no records"));
    }
    if (eval.size() > eval_size) eval.resize(eval_size);
  } else {
    if (train.size() < eval_size + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          c.train_path, ": ", train.size(), " records, but task.eval_size=",
          eval_size, " holds out the last ", eval_size, " and needs at least ",
          eval_size + 1, "; lower task.eval_size or set task.eval_path"));
    }
    eval.assign(std::make_move_iterator(train.end() - eval_size),
                std::make_move_iterator(train.end()));
    train.resize(train.size() - eval_size);
  }
  absl::flat_hash_set<std::string> eval_prompts;
  for (const Problem& p : eval) eval_prompts.insert(p.prompt);
  const size_t loaded = train.size();
  train.erase(std::remove_if(train.begin(), train.end(),
                             [&](const Problem& p) {
                               return eval_prompts.contains(p.prompt);
                             }),
              train.end());
  if (train.empty()) {
    return absl::InvalidArgumentError(
        loaded == 0
            ? absl::StrCat(c.train_path, ": no records")
            : absl::StrCat(c.train_path, ": all ", loaded,
                           " training records have eval prompts; nothing "
                           "left to train on"));
  }
  return std::unique_ptr<Task>(
      std::make_unique<JsonlTask>(spec.name, spec.default_reward,
                                  std::move(train), std::move(eval), c.seed));
}

absl::StatusOr<std::unique_ptr<Task>> MakeJsonlTask(const TaskConfig& c) {
  return MakeJsonlTaskFromSpec(c, {"jsonl", "exact", ParsePromptRecord});
}

}  // namespace fusionrl::tasks
