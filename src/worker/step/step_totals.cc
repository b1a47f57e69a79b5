#include "worker/step/step_totals.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "worker/step/group_sampler.h"

namespace fusionrl {
namespace {

// The scalar fields, in their packed order (the histogram follows them).
constexpr double StepTotals::*kScalars[] = {
    &StepTotals::reward_sum,
    &StepTotals::correct,
    &StepTotals::finished,
    &StepTotals::tokens,
    &StepTotals::samples,
    &StepTotals::trained_groups,
    &StepTotals::trained_group_id_sum,
    &StepTotals::trained_group_id_sq_sum,
    &StepTotals::thread_samples,
    &StepTotals::partial_samples,
    &StepTotals::partial_newer_tokens,
    &StepTotals::over_stale,
    &StepTotals::env_turns,
    &StepTotals::env_tool_calls,
    &StepTotals::env_tool_errors,
    &StepTotals::env_seconds,
    &StepTotals::env_tokens,
    &StepTotals::env_failed,
};
constexpr size_t kNumScalars = std::size(kScalars);

}  // namespace

absl::StatusOr<StepTotals> StepTotals::Of(const RolloutBatch& batch,
                                          int64_t trainer_version, int max_lag,
                                          int64_t thread_samples,
                                          int64_t over_stale) {
  StepTotals t;
  t.reward_sum = batch.reward_sum;
  t.correct = static_cast<double>(batch.correct);
  t.finished = static_cast<double>(batch.finished);
  t.tokens = static_cast<double>(batch.tokens);
  t.samples = static_cast<double>(batch.samples.size());
  t.thread_samples = static_cast<double>(thread_samples);
  t.over_stale = static_cast<double>(over_stale);
  t.staleness.assign(static_cast<size_t>(std::max(0, max_lag)) + 1, 0.0);
  for (const Sample& s : batch.samples) {
    t.env_turns += s.episode.turns;
    t.env_tool_calls += s.episode.tool_calls;
    t.env_tool_errors += s.episode.tool_errors;
    t.env_seconds += s.episode.env_seconds;
    t.env_failed += s.episode.env_failed ? 1 : 0;
    for (const uint8_t m : s.loss_mask) t.env_tokens += m == 0 ? 1 : 0;
  }
  std::set<uint64_t> groups;
  for (const Sample& s : batch.samples) {
    if (s.excluded) continue;
    groups.insert(s.group_id);
    const int64_t staleness = trainer_version - s.behaviour_version;
    if (staleness < 0 || staleness > max_lag) {
      return absl::InvalidArgumentError(
          absl::StrCat("step totals: a trained sample of group ", s.group_id,
                       " has staleness ", staleness, " (behaviour version ",
                       s.behaviour_version, ", trainer version ",
                       trainer_version, "), outside 0..", max_lag));
    }
    t.staleness[static_cast<size_t>(staleness)] += 1;
    if (!s.token_versions.empty()) {
      t.partial_samples += 1;
      for (int64_t v : s.token_versions) {
        t.partial_newer_tokens += v != s.behaviour_version ? 1 : 0;
      }
    }
  }
  for (uint64_t g : groups) {
    const double id = static_cast<double>(g);
    t.trained_groups += 1;
    t.trained_group_id_sum += id;
    t.trained_group_id_sq_sum += id * id;
  }
  return t;
}

std::vector<double> StepTotals::Pack() const {
  std::vector<double> flat;
  flat.reserve(kNumScalars + staleness.size());
  for (double StepTotals::*field : kScalars) flat.push_back(this->*field);
  flat.insert(flat.end(), staleness.begin(), staleness.end());
  return flat;
}

absl::StatusOr<StepTotals> StepTotals::Unpack(const std::vector<double>& flat,
                                              int max_lag) {
  const size_t want =
      kNumScalars + static_cast<size_t>(std::max(0, max_lag)) + 1;
  if (flat.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("step totals: ", flat.size(), " values, expected ", want,
                     " for policy lag ", max_lag));
  }
  StepTotals t;
  for (size_t i = 0; i < kNumScalars; ++i) t.*kScalars[i] = flat[i];
  t.staleness.assign(flat.begin() + kNumScalars, flat.end());
  return t;
}

StepTotals& StepTotals::operator+=(const StepTotals& other) {
  for (double StepTotals::*field : kScalars) this->*field += other.*field;
  if (staleness.size() < other.staleness.size()) {
    staleness.resize(other.staleness.size(), 0.0);
  }
  for (size_t i = 0; i < other.staleness.size(); ++i) {
    staleness[i] += other.staleness[i];
  }
  return *this;
}

}  // namespace fusionrl
