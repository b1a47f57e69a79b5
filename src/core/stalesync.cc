#include "core/stalesync.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace fusionrl {

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

}  // namespace

// ---------------------------------------------------------------------------
// PolicyLagRule

int64_t PolicyLagRule::AdmitVersion(int64_t step, int64_t lag) const {
  return frame_version + (step - base_step) - lag;
}

int64_t PolicyLagRule::LaggedSampleVersion(int64_t step) const {
  const int64_t m = std::max<int64_t>(1, steps_per_version);
  const int64_t i = step - base_step;
  // The block's last step; floor division, so a negative index (a step
  // before the frame) belongs to the block below it.
  const int64_t block = i >= 0 ? i / m : -((-i + m - 1) / m);
  const int64_t last = base_step + block * m + m - 1;
  return std::max(frame_version, AdmitVersion(last));
}

int64_t PolicyLagRule::TokenVersion(int64_t step, int64_t tokens,
                                    int64_t segment_tokens) const {
  const int64_t s = max_policy_lag;
  const int64_t n = segment_tokens;
  const int64_t j =
      n > 0 ? std::min<int64_t>(tokens / n, std::max<int64_t>(0, s - 1)) : 0;
  return std::max(frame_version, AdmitVersion(step + j));
}

// ---------------------------------------------------------------------------
// ClockSkewGate

absl::StatusOr<ClockSkewGate> ClockSkewGate::Create(
    int64_t max_clock_skew, const std::vector<std::string>& super_nodes,
    int64_t initial_clock) {
  if (max_clock_skew < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_clock_skew: must be >= 0, got ", max_clock_skew));
  }
  if (initial_clock < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial_clock: must be >= 0, got ", initial_clock));
  }
  if (super_nodes.empty()) {
    return absl::InvalidArgumentError("super_nodes: must not be empty");
  }
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < super_nodes.size(); ++i) {
    if (super_nodes[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("super_nodes[", i, "]: must not be empty"));
    }
    if (!seen.insert(super_nodes[i]).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "super_nodes[", i, "]: duplicate name '", super_nodes[i], "'"));
    }
  }
  return ClockSkewGate(max_clock_skew, super_nodes, initial_clock);
}

ClockSkewGate::ClockSkewGate(int64_t max_clock_skew,
                             const std::vector<std::string>& super_nodes,
                             int64_t initial_clock)
    : max_clock_skew_(max_clock_skew) {
  for (const std::string& name : super_nodes) {
    nodes_[name] = Node{initial_clock, true};
  }
}

std::map<std::string, ClockSkewGate::Node>::const_iterator
ClockSkewGate::SlowestOther(const std::string& self) const {
  auto slowest = nodes_.end();
  for (auto it = nodes_.begin(); it != nodes_.end(); ++it) {
    if (!it->second.live || it->first == self) continue;
    if (slowest == nodes_.end() || it->second.clock < slowest->second.clock) {
      slowest = it;
    }
  }
  return slowest;
}

bool ClockSkewGate::MayStart(const std::string& name, const Node& node) const {
  if (!node.live) return false;
  auto slowest = SlowestOther(name);
  if (slowest == nodes_.end()) return true;
  // Clocks are >= 0, so the difference cannot overflow.
  return node.clock - slowest->second.clock <= max_clock_skew_;
}

std::string ClockSkewGate::BlockedMessage(const std::string& name,
                                          const Node& node) const {
  std::string msg = absl::StrCat("super node ", name, " at clock ", node.clock,
                                 " may not start step ", node.clock + 1);
  auto slowest = SlowestOther(name);
  if (slowest != nodes_.end()) {
    absl::StrAppend(&msg, ": slowest super node ", slowest->first,
                    " is at clock ", slowest->second.clock);
  }
  absl::StrAppend(&msg, " (max_clock_skew k=", max_clock_skew_, ")");
  return msg;
}

void ClockSkewGate::UpdateSkew() {
  bool any = false;
  int64_t lo = 0;
  int64_t hi = 0;
  for (const auto& [name, node] : nodes_) {
    if (!node.live) continue;
    if (!any) {
      lo = hi = node.clock;
      any = true;
    } else {
      lo = std::min(lo, node.clock);
      hi = std::max(hi, node.clock);
    }
  }
  if (any) max_skew_seen_ = std::max(max_skew_seen_, hi - lo);
}

void ClockSkewGate::RollBack(int64_t clock) {
  for (auto& [name, node] : nodes_) {
    if (node.live) node.clock = clock;
  }
}

absl::Status ClockSkewGate::Advance(const std::string& name,
                                    int64_t new_clock) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown super node ", name));
  }
  Node& node = it->second;
  if (!node.live) {
    return absl::FailedPreconditionError(
        absl::StrCat("super node ", name, " was removed at clock ", node.clock,
                     "; it may not advance"));
  }
  if (node.clock == kInt64Max || new_clock != node.clock + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "super node ", name, " is at clock ", node.clock,
        "; it may only advance to ", node.clock + 1, ", got ", new_clock));
  }
  if (!MayStart(name, node)) {
    return absl::FailedPreconditionError(
        absl::StrCat(BlockedMessage(name, node),
                     "; it finished a step it was not allowed to start"));
  }
  node.clock = new_clock;
  UpdateSkew();
  return absl::OkStatus();
}

bool ClockSkewGate::MayStart(const std::string& name) const {
  auto it = nodes_.find(name);
  return it != nodes_.end() && MayStart(name, it->second);
}

void ClockSkewGate::Remove(const std::string& name) {
  auto it = nodes_.find(name);
  if (it == nodes_.end() || !it->second.live) return;
  it->second.live = false;
  UpdateSkew();  // cannot grow, kept for symmetry
}

int64_t ClockSkewGate::Clock(const std::string& name) const {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? -1 : it->second.clock;
}

std::string ClockSkewGate::DebugString() const {
  std::string out = absl::StrCat("clock skew k=", max_clock_skew_, ":");
  for (const auto& [name, node] : nodes_) {
    absl::StrAppend(&out, " ", name, "=", node.clock,
                    node.live ? "" : "(removed)");
  }
  absl::StrAppend(&out, "; max skew seen ", max_skew_seen_);
  return out;
}

}  // namespace fusionrl
