// StaleSync: the two staleness bounds of near-asynchronous RL training
// (docs/stalesync.md), as small thread-safe gates with no LibTorch and no
// gRPC in them.
//
//  * PolicyLagGate paces rollout admission so that no sample is trained more
//    than `max_policy_lag` (s) policy versions after the version that
//    generated it (AReaL's rule).
//  * ClockSkewGate keeps the training clocks of the super nodes within
//    `max_clock_skew` (k) steps of each other (stale-synchronous parallel).
//
// Both gates only count and decide; they never sleep except inside the
// blocking Wait* methods, which wait on an absl::CondVar until a real
// absl::Time deadline (they do not consult the injected fusionrl::Clock).
#ifndef FUSIONRL_CORE_STALESYNC_H_
#define FUSIONRL_CORE_STALESYNC_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace fusionrl {

// The policy-lag admission rule, defined once: PolicyLagGate applies it per
// prompt group and FusedRollout per step. Counting steps from a frame that
// starts at policy version v0 (a fresh run, a resume, a reset of the
// rollout's predictions), step i (0-based) may start sampling once the
// trainer has published version v0 + i - s, so that it is trained (at
// version v0 + i) with staleness <= s.
int64_t AdmitVersion(int64_t frame_version, int64_t step_index,
                     int64_t max_policy_lag);
// How many steps of such a frame version `version` admits (steps 0 ..
// n - 1): version - v0 + s + 1, never negative.
int64_t StepsAdmitted(int64_t frame_version, int64_t version,
                      int64_t max_policy_lag);
// The version the i-th step of such a frame samples from under
// stalesync.rollout_version lagged, with m = steps_per_version (1..s + 1)
// consecutive steps sharing one version: the steps i in [mb, mb + m) sample
// from max(v0, v0 + mb + m - 1 - s), the version their last step is
// admitted at. m = 1 is AdmitVersion (every sample exactly s old once the
// pipeline is full); with m > 1 the block's steps are s - m + 1 .. s old and
// their rollouts can decode in one round (continuous batching across
// steps), at the price of starting later. Never below AdmitVersion, so
// staleness stays <= s.
int64_t LaggedSampleVersion(int64_t frame_version, int64_t step_index,
                            int64_t max_policy_lag, int64_t steps_per_version);

// PolicyLagGate: policy-lag admission control for rollout (AReaL's rule).
//
// Terms. The policy version v is the number of optimizer steps the trainer
// has completed; the trainer publishes it with OnVersion(). A prompt group is
// "started" (admitted) when rollout may begin sampling it; its behaviour
// version is the version current at admission (TryAdmit/WaitAdmit report
// it). Training step t reads the weights of version t and produces version
// t+1; the staleness of a group trained in step t is t - behaviour version.
// Each training step consumes exactly G = `groups_per_step` groups.
//
// Rule. A new group may start only while
//
//     counted < (s + (v - v0) + 1) * G
//
// where s = `max_policy_lag`, v0 = `initial_version` (0 for a fresh run; the
// resumed version after a checkpoint restore) and counted = started -
// dropped (groups given back with RecordDropped() no longer hold a slot, so
// that dropping a group never starves the trainer of a full batch).
// With v0 = 0 and no drops this is exactly `started < (s + v + 1) * G`.
//
// Invariant (staleness bound). Suppose the trainer takes groups in admission
// order (a FIFO fed in the order TryAdmit/WaitAdmit returned), G per step,
// skipping only groups it gave back with RecordDropped(). Then every group
// trained in step t was admitted while v >= t - s, so its behaviour version
// is >= t - s and its staleness is <= s. Proof: let the group be the i-th
// (0-based) trained group, so t = v0 + floor(i / G). The i groups trained
// before it were all admitted before it and none was dropped, and every
// group dropped by the time of its admission was admitted before it, so
// i <= counted at its admission < (s + (v - v0) + 1) * G, hence
// floor(i / G) <= s + v - v0 and t <= s + v.
// s = 0 is exactly synchronous on-policy RL: a group can start only when the
// version that will train it is current (G groups per version).
//
// If groups are trained out of admission order (e.g. in rollout-completion
// order, where a long-tail group finishes late), the bound is no longer
// implied by admission; the trainer must then check Trainable() and give
// back over-stale groups with RecordDropped(). The rule still never
// deadlocks: while fewer than G trainable groups are waiting and nothing is
// in flight, at least G - waiting groups are admissible.
//
// The behaviour version is only meaningful if the rollout engine has loaded
// the weights of the version reported at admission (or newer) before it
// samples the group; a rollout engine that lags behind must tag groups with
// the version it actually sampled from and the trainer must use Trainable().
//
// Thread safety: thread-safe. Every method takes one internal mutex and
// calls nothing outside this class while holding it. WaitAdmit() blocks on a
// condition variable that OnVersion(), RecordDropped() and Close() signal.
class PolicyLagGate {
 public:
  // Validates the arguments and builds a gate. InvalidArgument naming the
  // field if max_policy_lag < 0, groups_per_step < 1 or initial_version < 0.
  static absl::StatusOr<std::unique_ptr<PolicyLagGate>> Create(
      int64_t max_policy_lag, int groups_per_step, int64_t initial_version = 0);

  // REQUIRES: max_policy_lag >= 0, groups_per_step >= 1,
  // initial_version >= 0 (unchecked; use Create() for untrusted values).
  PolicyLagGate(int64_t max_policy_lag, int groups_per_step,
                int64_t initial_version = 0);

  PolicyLagGate(const PolicyLagGate&) = delete;
  PolicyLagGate& operator=(const PolicyLagGate&) = delete;

  // Admits one group if the rule allows it now, counting it as started, and
  // returns true; otherwise (or after Close()) returns false and counts
  // nothing. If `behaviour_version` is not null and the group is admitted,
  // it receives the version current at admission, read under the same lock.
  bool TryAdmit(int64_t* behaviour_version = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until one group can be admitted, admits it (as TryAdmit) and
  // returns OK. Returns DeadlineExceeded once `clock` reaches `deadline`
  // (a time on that clock: a FakeClock a test moves ends the wait), naming
  // what it waited for, e.g. "policy lag s=2: 48 groups started, version 3
  // allows 48; waiting for version 4"; Cancelled if the gate is closed
  // before or while waiting. Nothing is counted unless OK is returned.
  absl::Status WaitAdmit(const Clock& clock, absl::Time deadline,
                         int64_t* behaviour_version = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // How many groups could be admitted right now (0 when closed), clamped to
  // INT_MAX.
  int Admissible() const ABSL_LOCKS_EXCLUDED(mu_);

  // The trainer published version `version` (optimizer steps done). Versions
  // only move forward: a `version` at or below the current one is ignored
  // (announcements may arrive out of order from different threads, and the
  // highest one is the truth). A jump by n versions releases n * G slots.
  // Wakes WaitAdmit() callers.
  void OnVersion(int64_t version) ABSL_LOCKS_EXCLUDED(mu_);

  // Gives back the slot of one admitted group that will never be trained
  // (over-stale per Trainable(), filtered out, or abandoned) and counts it
  // in over_stale_dropped(). REQUIRES: one call per such group; calls beyond
  // the number of started groups are ignored. Wakes WaitAdmit() callers.
  void RecordDropped() ABSL_LOCKS_EXCLUDED(mu_);

  // Makes every current and future WaitAdmit() return Cancelled and every
  // TryAdmit() return false (job finished or aborted). Irreversible.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  // Whether a group generated by `behaviour_version` may be trained by the
  // step that reads `train_version`: 0 <= train_version - behaviour_version
  // <= s. A behaviour version newer than the trainer's is never trainable.
  bool Trainable(int64_t behaviour_version, int64_t train_version) const;

  int64_t max_policy_lag() const { return max_policy_lag_; }
  int groups_per_step() const { return groups_per_step_; }
  int64_t initial_version() const { return initial_version_; }

  // The current policy version (initial_version until OnVersion raises it).
  int64_t version() const ABSL_LOCKS_EXCLUDED(mu_);
  // Groups admitted so far (dropped ones included).
  int64_t started() const ABSL_LOCKS_EXCLUDED(mu_);
  // Groups given back with RecordDropped() so far.
  int64_t over_stale_dropped() const ABSL_LOCKS_EXCLUDED(mu_);
  bool closed() const ABSL_LOCKS_EXCLUDED(mu_);

  // "policy lag s=2 G=8: version 3, 48 groups started (0 dropped), 0
  // admissible".
  std::string DebugString() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // (s + (v - v0) + 1) * G, saturating at INT64_MAX.
  int64_t BudgetLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t AdmissibleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdmitLocked(int64_t* behaviour_version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string BlockedMessageLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_policy_lag_;
  const int groups_per_step_;
  const int64_t initial_version_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled when the budget grows or on Close()
  int64_t version_ ABSL_GUARDED_BY(mu_);
  int64_t started_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// ClockSkewGate: the stale-synchronous-parallel gate across super nodes.
//
// Each super node has a training clock c: the number of training steps it
// has completed (all nodes start at `initial_clock`). Super nodes train
// data-parallel inside themselves and exchange weight updates with each
// other; this gate bounds how far ahead of the others one may run.
//
// Rule. A live super node at clock c may start step c+1 only while
//
//     c - min(clocks of the OTHER live super nodes) <= k
//
// with k = `max_clock_skew` (a node with no other live node may always
// start). k = 0 is a global barrier: nobody starts step c+1 until every
// live node has finished step c. The slowest live node may always start, so
// the gate never deadlocks.
//
// Advance() is the only way a clock moves, and it moves it by exactly one
// and only if the rule allowed that step to start. Since the other clocks
// never decrease and removing a node only raises the minimum, a step that
// was allowed when it started is still allowed when it finishes, so the
// check at Advance() refuses exactly the steps that were started without
// permission.
//
// Invariant: at any moment, max clock - min clock over live nodes <= k + 1.
// (Induction: a node at c advances to c+1 only if c <= min(others) + k, so
// afterwards its clock is <= min(others) + k + 1; Remove() only shrinks the
// set.) MaxSkewSeen() records the largest such difference ever reached.
//
// A removed (lost) super node no longer holds the others back; it cannot
// come back under the same name.
//
// Thread safety: thread-safe. Every method takes one internal mutex and
// calls nothing outside this class while holding it. WaitMayStart() blocks
// on a condition variable that Advance() and Remove() signal.
class ClockSkewGate {
 public:
  // Validates and builds a gate. InvalidArgument if max_clock_skew < 0,
  // initial_clock < 0, `super_nodes` is empty, or a name is empty or
  // repeated (naming it).
  static absl::StatusOr<std::unique_ptr<ClockSkewGate>> Create(
      int64_t max_clock_skew, const std::vector<std::string>& super_nodes,
      int64_t initial_clock = 0);

  // REQUIRES: max_clock_skew >= 0, initial_clock >= 0, names non-empty and
  // unique (unchecked; a repeated name is kept once). Use Create() for
  // untrusted values.
  ClockSkewGate(int64_t max_clock_skew,
                const std::vector<std::string>& super_nodes,
                int64_t initial_clock = 0);

  ClockSkewGate(const ClockSkewGate&) = delete;
  ClockSkewGate& operator=(const ClockSkewGate&) = delete;

  // Records that super node `name` finished step `new_clock`. NotFound for
  // an unknown name; FailedPrecondition, naming the node, if it was
  // removed, if new_clock is not its clock + 1, or if the rule did not allow
  // it to start that step (naming the slowest other node). On error nothing
  // changes. Wakes WaitMayStart() callers.
  absl::Status Advance(const std::string& name, int64_t new_clock)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whether live super node `name` may start step Clock(name) + 1 now.
  // False for unknown or removed names.
  bool MayStart(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until MayStart(name) and returns OK. NotFound for an unknown
  // name; FailedPrecondition if the node is (or gets) removed;
  // DeadlineExceeded once `clock` reaches `deadline`, naming the slowest node
  // and its clock: "super node sn-a at clock 3 may not start step 4: slowest
  // super node sn-c is at clock 1 (max_clock_skew k=1)".
  // (`::fusionrl::Clock`: this class's Clock() names a super node's clock.)
  absl::Status WaitMayStart(const std::string& name,
                            const ::fusionrl::Clock& clock, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Removes a lost super node: it no longer holds others back and may no
  // longer advance. Unknown or already removed names are ignored. Wakes
  // WaitMayStart() callers.
  void Remove(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // Sets every live node's clock to `clock` (their steps after it are run
  // again: a job rolled back to its last weight sync). The largest skew
  // seen is kept. Wakes WaitMayStart() callers.
  void RollBack(int64_t clock) ABSL_LOCKS_EXCLUDED(mu_);

  // The clock of `name` (its last clock if removed), or -1 if unknown.
  int64_t Clock(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);

  // The largest max clock - min clock over live nodes ever reached (0 at
  // construction). Never exceeds k + 1.
  int64_t MaxSkewSeen() const ABSL_LOCKS_EXCLUDED(mu_);

  // Smallest clock among live nodes, or -1 if none is live.
  int64_t MinClock() const ABSL_LOCKS_EXCLUDED(mu_);

  // Names of the live super nodes, sorted.
  std::vector<std::string> LiveNodes() const ABSL_LOCKS_EXCLUDED(mu_);

  int64_t max_clock_skew() const { return max_clock_skew_; }

  // "clock skew k=1: sn-a=3 sn-b=2 sn-c=2(removed); max skew seen 1".
  std::string DebugString() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Node {
    int64_t clock = 0;
    bool live = true;
  };

  // The live node other than `self` with the smallest clock (ties: first
  // name), or end() if there is none.
  std::map<std::string, Node>::const_iterator SlowestOtherLocked(
      const std::string& self) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool MayStartLocked(const std::string& name, const Node& node) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string BlockedMessageLocked(const std::string& name,
                                   const Node& node) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateSkewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_clock_skew_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on every Advance() and Remove()
  std::map<std::string, Node> nodes_ ABSL_GUARDED_BY(mu_);
  int64_t max_skew_seen_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_STALESYNC_H_
