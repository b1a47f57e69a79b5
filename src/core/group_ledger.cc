#include "core/group_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fusionrl {

GroupLedger::GroupLedger(uint64_t total_groups) : total_(total_groups) {}

std::vector<uint64_t> GroupLedger::Assign(const std::string& node_id,
                                          int max_groups) {
  std::vector<uint64_t> out;
  while (static_cast<int>(out.size()) < max_groups) {
    uint64_t group;
    if (!requeued_.empty()) {
      group = requeued_.front();
      requeued_.pop_front();
    } else if (next_new_ < total_) {
      group = next_new_++;
    } else {
      break;
    }
    owner_[group] = node_id;
    out.push_back(group);
  }
  return out;
}

absl::Status GroupLedger::MarkTrained(const std::string& node_id,
                                      const std::vector<uint64_t>& groups) {
  for (size_t i = 0; i < groups.size(); ++i) {
    auto it = owner_.find(groups[i]);
    if (it == owner_.end() || it->second != node_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("group ", groups[i], " is not assigned to ", node_id,
                       it == owner_.end()
                           ? " (not assigned to any node)"
                           : absl::StrCat(" (assigned to ", it->second, ")")));
    }
    // A group listed twice in one report is an error too.
    if (std::find(groups.begin(), groups.begin() + i, groups[i]) !=
        groups.begin() + i) {
      return absl::FailedPreconditionError(
          absl::StrCat("group ", groups[i], " is reported twice"));
    }
  }
  for (uint64_t g : groups) {
    owner_.erase(g);
    trained_ids_.insert(g);
  }
  trained_ += groups.size();
  return absl::OkStatus();
}

int64_t GroupLedger::Requeue(const std::string& node_id) {
  std::vector<uint64_t> back;
  for (const auto& [group, owner] : owner_) {
    if (owner == node_id) back.push_back(group);
  }
  std::sort(back.begin(), back.end());
  for (uint64_t g : back) {
    owner_.erase(g);
    requeued_.push_back(g);
  }
  requeued_total_ += back.size();
  return static_cast<int64_t>(back.size());
}

absl::Status GroupLedger::Reclaim(const std::vector<uint64_t>& groups) {
  absl::flat_hash_set<uint64_t> seen;
  for (uint64_t g : groups) {
    if (!seen.insert(g).second) {
      return absl::FailedPreconditionError(
          absl::StrCat("group ", g, " is reclaimed twice"));
    }
    if (!owner_.contains(g) && !trained_ids_.contains(g)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group ", g, " is neither assigned nor trained; cannot reclaim it"));
    }
  }
  for (auto it = groups.rbegin(); it != groups.rend(); ++it) {
    if (owner_.erase(*it) == 0) {
      trained_ids_.erase(*it);
      --trained_;
    }
    requeued_.push_front(*it);
  }
  requeued_total_ += groups.size();
  return absl::OkStatus();
}

std::string GroupLedger::DebugString() const {
  return absl::StrCat("groups: ", total_, " total, ", pending(), " pending (",
                      requeued_.size(), " re-queued), ", assigned(),
                      " assigned, ", trained_, " trained; ", requeued_total_,
                      " re-queued so far");
}

}  // namespace fusionrl
