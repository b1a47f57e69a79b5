#include "controller/group_ledger.h"

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

GroupLedger::Saved GroupLedger::Save() const {
  Saved s;
  s.total = total_;
  s.next_new = next_new_;
  s.requeued_total = requeued_total_;
  s.requeued.assign(requeued_.begin(), requeued_.end());
  std::vector<uint64_t> trained(trained_ids_.begin(), trained_ids_.end());
  std::sort(trained.begin(), trained.end());
  for (uint64_t g : trained) {
    if (!s.trained.empty() && s.trained.back().second == g) {
      ++s.trained.back().second;
    } else {
      s.trained.emplace_back(g, g + 1);
    }
  }
  for (const auto& [group, node] : owner_) s.assigned.emplace_back(group, node);
  std::sort(s.assigned.begin(), s.assigned.end());
  return s;
}

absl::StatusOr<std::unique_ptr<GroupLedger>> GroupLedger::Load(
    const Saved& saved) {
  if (saved.next_new > saved.total) {
    return absl::InvalidArgumentError(
        absl::StrCat("ledger: next group ", saved.next_new, " is past the ",
                     saved.total, " groups"));
  }
  auto ledger = std::make_unique<GroupLedger>(saved.total);
  ledger->next_new_ = saved.next_new;
  ledger->requeued_total_ = saved.requeued_total;
  absl::flat_hash_set<uint64_t> seen;
  auto claim = [&](uint64_t g) -> absl::Status {
    if (g >= saved.next_new) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ledger: group ", g, " is accounted for but was never handed out"));
    }
    if (!seen.insert(g).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("ledger: group ", g, " is accounted for twice"));
    }
    return absl::OkStatus();
  };
  for (const auto& [begin, end] : saved.trained) {
    for (uint64_t g = begin; g < end; ++g) {
      if (absl::Status s = claim(g); !s.ok()) return s;
      ledger->trained_ids_.insert(g);
    }
  }
  ledger->trained_ = ledger->trained_ids_.size();
  for (const auto& [g, node] : saved.assigned) {
    if (absl::Status s = claim(g); !s.ok()) return s;
    ledger->owner_[g] = node;
  }
  for (uint64_t g : saved.requeued) {
    if (absl::Status s = claim(g); !s.ok()) return s;
    ledger->requeued_.push_back(g);
  }
  if (seen.size() != saved.next_new) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ledger: ", saved.next_new - seen.size(), " of the ", saved.next_new,
        " groups handed out are not accounted for"));
  }
  return ledger;
}

std::string GroupLedger::DebugString() const {
  return absl::StrCat("groups: ", total_, " total, ", pending(), " pending (",
                      requeued_.size(), " re-queued), ", assigned(),
                      " assigned, ", trained_, " trained; ", requeued_total_,
                      " re-queued so far");
}

}  // namespace fusionrl
