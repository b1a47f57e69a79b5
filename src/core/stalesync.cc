#include "core/stalesync.h"

#include <algorithm>
#include <climits>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace fusionrl {

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// a + b for a, b >= 0, saturating at INT64_MAX.
int64_t SatAdd(int64_t a, int64_t b) {
  return a > kInt64Max - b ? kInt64Max : a + b;
}

// a * b for a >= 0, b >= 1, saturating at INT64_MAX.
int64_t SatMul(int64_t a, int64_t b) {
  return a > kInt64Max / b ? kInt64Max : a * b;
}

}  // namespace

// ---------------------------------------------------------------------------
// PolicyLagGate

absl::StatusOr<std::unique_ptr<PolicyLagGate>> PolicyLagGate::Create(
    int64_t max_policy_lag, int groups_per_step, int64_t initial_version) {
  if (max_policy_lag < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_policy_lag: must be >= 0, got ", max_policy_lag));
  }
  if (groups_per_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("groups_per_step: must be >= 1, got ", groups_per_step));
  }
  if (initial_version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial_version: must be >= 0, got ", initial_version));
  }
  return std::make_unique<PolicyLagGate>(max_policy_lag, groups_per_step,
                                         initial_version);
}

PolicyLagGate::PolicyLagGate(int64_t max_policy_lag, int groups_per_step,
                             int64_t initial_version)
    : max_policy_lag_(max_policy_lag),
      groups_per_step_(groups_per_step),
      initial_version_(initial_version),
      version_(initial_version) {}

int64_t AdmitVersion(int64_t frame_version, int64_t step_index,
                     int64_t max_policy_lag) {
  return frame_version + step_index - max_policy_lag;
}

int64_t StepsAdmitted(int64_t frame_version, int64_t version,
                      int64_t max_policy_lag) {
  // Step i is admitted iff AdmitVersion(v0, i, s) <= version.
  return std::max<int64_t>(
      0, SatAdd(SatAdd(version - frame_version, max_policy_lag), 1));
}

int64_t LaggedSampleVersion(int64_t frame_version, int64_t step_index,
                            int64_t max_policy_lag, int64_t steps_per_version) {
  const int64_t m = std::max<int64_t>(1, steps_per_version);
  // The block's last step; floor division, so a negative index (a step
  // before the frame) belongs to the block below it.
  const int64_t block =
      step_index >= 0 ? step_index / m : -((-step_index + m - 1) / m);
  const int64_t last = block * m + m - 1;
  return std::max(frame_version,
                  AdmitVersion(frame_version, last, max_policy_lag));
}

int64_t PolicyLagGate::BudgetLocked() const {
  // The groups of the steps the rule admits at the current version.
  return SatMul(StepsAdmitted(initial_version_, version_, max_policy_lag_),
                groups_per_step_);
}

int64_t PolicyLagGate::AdmissibleLocked() const {
  if (closed_) return 0;
  const int64_t counted = started_ - dropped_;
  return std::max<int64_t>(0, BudgetLocked() - counted);
}

void PolicyLagGate::AdmitLocked(int64_t* behaviour_version) {
  ++started_;
  if (behaviour_version != nullptr) *behaviour_version = version_;
}

std::string PolicyLagGate::BlockedMessageLocked() const {
  std::string started = absl::StrCat(started_, " groups started");
  if (dropped_ > 0) {
    absl::StrAppend(&started, " (", dropped_, " dropped, ", started_ - dropped_,
                    " counted)");
  }
  // The first version whose budget exceeds the current count.
  const int64_t counted = started_ - dropped_;
  const int64_t needed_versions = counted / groups_per_step_ + 1;
  const int64_t wanted =
      initial_version_ +
      std::max<int64_t>(0, needed_versions - max_policy_lag_ - 1);
  return absl::StrCat("policy lag s=", max_policy_lag_, ": ", started,
                      ", version ", version_, " allows ", BudgetLocked(),
                      "; waiting for version ", wanted);
}

bool PolicyLagGate::TryAdmit(int64_t* behaviour_version) {
  absl::MutexLock lock(&mu_);
  if (AdmissibleLocked() <= 0) return false;
  AdmitLocked(behaviour_version);
  return true;
}

absl::Status PolicyLagGate::WaitAdmit(const Clock& clock, absl::Time deadline,
                                      int64_t* behaviour_version) {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (closed_) {
      return absl::CancelledError(
          absl::StrCat("policy lag gate closed; ", BlockedMessageLocked()));
    }
    if (AdmissibleLocked() > 0) {
      AdmitLocked(behaviour_version);
      return absl::OkStatus();
    }
    // WaitOnClock returns true once the deadline passed; re-check once
    // after it so a release that raced the deadline is not lost.
    if (WaitOnClock(cv_, mu_, clock, deadline) && !closed_ &&
        AdmissibleLocked() <= 0) {
      return absl::DeadlineExceededError(BlockedMessageLocked());
    }
  }
}

int PolicyLagGate::Admissible() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::min<int64_t>(AdmissibleLocked(), INT_MAX));
}

void PolicyLagGate::OnVersion(int64_t version) {
  absl::MutexLock lock(&mu_);
  if (version <= version_) return;
  version_ = version;
  cv_.SignalAll();
}

void PolicyLagGate::RecordDropped() {
  absl::MutexLock lock(&mu_);
  if (dropped_ >= started_) return;
  ++dropped_;
  cv_.SignalAll();
}

void PolicyLagGate::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  cv_.SignalAll();
}

bool PolicyLagGate::Trainable(int64_t behaviour_version,
                              int64_t train_version) const {
  if (train_version < behaviour_version) return false;
  // Both are versions (>= 0 in practice); compare without overflow.
  return train_version - behaviour_version <= max_policy_lag_;
}

int64_t PolicyLagGate::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

int64_t PolicyLagGate::started() const {
  absl::MutexLock lock(&mu_);
  return started_;
}

int64_t PolicyLagGate::over_stale_dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

bool PolicyLagGate::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

std::string PolicyLagGate::DebugString() const {
  absl::MutexLock lock(&mu_);
  return absl::StrCat(
      "policy lag s=", max_policy_lag_, " G=", groups_per_step_, ": version ",
      version_, ", ", started_, " groups started (", dropped_, " dropped), ",
      AdmissibleLocked(), " admissible", closed_ ? ", closed" : "");
}

// ---------------------------------------------------------------------------
// ClockSkewGate

absl::StatusOr<std::unique_ptr<ClockSkewGate>> ClockSkewGate::Create(
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
  return std::make_unique<ClockSkewGate>(max_clock_skew, super_nodes,
                                         initial_clock);
}

ClockSkewGate::ClockSkewGate(int64_t max_clock_skew,
                             const std::vector<std::string>& super_nodes,
                             int64_t initial_clock)
    : max_clock_skew_(max_clock_skew) {
  absl::MutexLock lock(&mu_);
  for (const std::string& name : super_nodes) {
    nodes_[name] = Node{initial_clock, true};
  }
}

std::map<std::string, ClockSkewGate::Node>::const_iterator
ClockSkewGate::SlowestOtherLocked(const std::string& self) const {
  auto slowest = nodes_.end();
  for (auto it = nodes_.begin(); it != nodes_.end(); ++it) {
    if (!it->second.live || it->first == self) continue;
    if (slowest == nodes_.end() || it->second.clock < slowest->second.clock) {
      slowest = it;
    }
  }
  return slowest;
}

bool ClockSkewGate::MayStartLocked(const std::string& name,
                                   const Node& node) const {
  if (!node.live) return false;
  auto slowest = SlowestOtherLocked(name);
  if (slowest == nodes_.end()) return true;
  // Clocks are >= 0, so the difference cannot overflow.
  return node.clock - slowest->second.clock <= max_clock_skew_;
}

std::string ClockSkewGate::BlockedMessageLocked(const std::string& name,
                                                const Node& node) const {
  std::string msg = absl::StrCat("super node ", name, " at clock ", node.clock,
                                 " may not start step ", node.clock + 1);
  auto slowest = SlowestOtherLocked(name);
  if (slowest != nodes_.end()) {
    absl::StrAppend(&msg, ": slowest super node ", slowest->first,
                    " is at clock ", slowest->second.clock);
  }
  absl::StrAppend(&msg, " (max_clock_skew k=", max_clock_skew_, ")");
  return msg;
}

void ClockSkewGate::UpdateSkewLocked() {
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
  absl::MutexLock lock(&mu_);
  for (auto& [name, node] : nodes_) {
    if (node.live) node.clock = clock;
  }
  cv_.SignalAll();
}

absl::Status ClockSkewGate::Advance(const std::string& name,
                                    int64_t new_clock) {
  absl::MutexLock lock(&mu_);
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
  if (!MayStartLocked(name, node)) {
    return absl::FailedPreconditionError(
        absl::StrCat(BlockedMessageLocked(name, node),
                     "; it finished a step it was not allowed to start"));
  }
  node.clock = new_clock;
  UpdateSkewLocked();
  cv_.SignalAll();
  return absl::OkStatus();
}

bool ClockSkewGate::MayStart(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(name);
  return it != nodes_.end() && MayStartLocked(name, it->second);
}

absl::Status ClockSkewGate::WaitMayStart(const std::string& name,
                                         const ::fusionrl::Clock& clock,
                                         absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown super node ", name));
  }
  // std::map iterators stay valid: nodes are never erased.
  const Node& node = it->second;
  while (true) {
    if (!node.live) {
      return absl::FailedPreconditionError(absl::StrCat(
          "super node ", name, " was removed at clock ", node.clock));
    }
    if (MayStartLocked(name, node)) return absl::OkStatus();
    // True on timeout; re-check once so a release racing the deadline wins.
    if (WaitOnClock(cv_, mu_, clock, deadline) && node.live &&
        !MayStartLocked(name, node)) {
      return absl::DeadlineExceededError(BlockedMessageLocked(name, node));
    }
  }
}

void ClockSkewGate::Remove(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end() || !it->second.live) return;
  it->second.live = false;
  UpdateSkewLocked();  // cannot grow, kept for symmetry
  cv_.SignalAll();
}

int64_t ClockSkewGate::Clock(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(name);
  return it == nodes_.end() ? -1 : it->second.clock;
}

int64_t ClockSkewGate::MaxSkewSeen() const {
  absl::MutexLock lock(&mu_);
  return max_skew_seen_;
}

int64_t ClockSkewGate::MinClock() const {
  absl::MutexLock lock(&mu_);
  int64_t lo = -1;
  for (const auto& [name, node] : nodes_) {
    if (node.live && (lo < 0 || node.clock < lo)) lo = node.clock;
  }
  return lo;
}

std::vector<std::string> ClockSkewGate::LiveNodes() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, node] : nodes_) {
    if (node.live) out.push_back(name);
  }
  return out;
}

std::string ClockSkewGate::DebugString() const {
  absl::MutexLock lock(&mu_);
  std::string out = absl::StrCat("clock skew k=", max_clock_skew_, ":");
  for (const auto& [name, node] : nodes_) {
    absl::StrAppend(&out, " ", name, "=", node.clock,
                    node.live ? "" : "(removed)");
  }
  absl::StrAppend(&out, "; max skew seen ", max_skew_seen_);
  return out;
}

}  // namespace fusionrl
