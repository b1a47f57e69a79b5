#include "worker/step/staleness_filter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fusionrl {
namespace {
bool Contains(const std::vector<uint64_t>& groups, uint64_t g) {
  return std::find(groups.begin(), groups.end(), g) != groups.end();
}
}  // namespace

absl::StatusOr<std::vector<uint64_t>> StalenessFilter::OverStaleGroups(
    const std::vector<Sample>& samples, int64_t train_version) const {
  std::vector<uint64_t> groups;
  for (const Sample& s : samples) {
    const int64_t staleness = train_version - s.behaviour_version;
    if (staleness < 0) {
      return absl::InternalError(absl::StrCat(
          "prompt group ", s.group_id, " was sampled by policy version ",
          s.behaviour_version, ", newer than the trainer's version ",
          train_version, " (negative staleness)"));
    }
    if (staleness > max_policy_lag_ && !Contains(groups, s.group_id)) {
      groups.push_back(s.group_id);
    }
  }
  return groups;
}

void StalenessFilter::Drop(std::vector<Sample>& samples,
                           const std::vector<uint64_t>& groups) {
  for (Sample& s : samples) {
    if (Contains(groups, s.group_id)) s.excluded = true;
  }
}

void StalenessFilter::Replace(std::vector<Sample>& samples,
                              const std::vector<uint64_t>& groups,
                              std::vector<Sample> fresh) {
  size_t next = 0;
  for (Sample& s : samples) {
    if (Contains(groups, s.group_id) && next < fresh.size()) {
      s = std::move(fresh[next++]);
    }
  }
}

int64_t StalenessFilter::MaxStaleness(const std::vector<Sample>& samples,
                                      int64_t train_version) {
  int64_t most = 0;
  for (const Sample& s : samples) {
    if (!s.excluded) most = std::max(most, train_version - s.behaviour_version);
  }
  return most;
}

}  // namespace fusionrl
