// StaleSync: the two staleness bounds of near-asynchronous RL training
// (docs/stalesync.md), as small value types with no locks, no LibTorch and
// no gRPC in them.
//
//  * PolicyLagRule decides rollout admission so that no sample is trained
//    more than `max_policy_lag` (s) policy versions after the version that
//    generated it (AReaL's rule). FusedRollout applies it per step.
//  * ClockSkewGate keeps the training clocks of the super nodes within
//    `max_clock_skew` (k) steps of each other (stale-synchronous parallel).
//    JobManager applies it to a skewed job's plans.
//
// Both only count and decide; they never wait. The object that holds one
// guards it with its own mutex (FusedRollout::mu_, JobManager::mu_) and
// waits on its own condition variable.
#ifndef FUSIONRL_CORE_STALESYNC_H_
#define FUSIONRL_CORE_STALESYNC_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusionrl {

// PolicyLagRule: the policy-lag admission rule over one frame, defined once.
//
// Terms. The policy version v is the number of optimizer steps the trainer
// has completed. A frame starts at policy version v0 = `frame_version` (a
// fresh run, a resume, a reset of the rollout's predictions) and step
// `base_step`; step t of the run is the frame's step i = t - base_step, and
// it is trained at version v0 + i (it reads the weights of version v0 + i).
//
// Rule. Step i may start sampling once the trainer has published version
//
//     AdmitVersion(t) = v0 + i - s
//
// (s = `max_policy_lag`), so that a step sampled from the version current at
// admission is trained with staleness <= s. s = 0 is exactly synchronous
// on-policy RL: a step starts only when the version that trains it is
// current. Admission is monotone: a step admitted at version v is admitted
// at every later one, and version v admits the frame's steps
// 0 .. v - v0 + s, each trained (in step order) within the bound.
//
// Just in time admission uses a smaller lag d in 1..s (the `lag` argument);
// the bound still holds since d <= s.
//
// Thread safety: a value type with no lock. An object that shares one
// between threads guards it (REQUIRES its mutex: FusedRollout::mu_).
struct PolicyLagRule {
  int64_t max_policy_lag = 0;  // s >= 0
  // Lagged: consecutive steps sampling from one version (1..s + 1,
  // stalesync.steps_per_version).
  int64_t steps_per_version = 1;
  int64_t frame_version = 0;  // v0
  int64_t base_step = 0;      // the run's step that is the frame's step 0

  // The version step `step` may start at with admission lag `lag` (<= s):
  // v0 + (step - base_step) - lag.
  int64_t AdmitVersion(int64_t step, int64_t lag) const;
  int64_t AdmitVersion(int64_t step) const {
    return AdmitVersion(step, max_policy_lag);
  }
  // Whether `step` may start once version `published` is published.
  bool Admits(int64_t step, int64_t published, int64_t lag) const {
    return published >= AdmitVersion(step, lag);
  }
  bool Admits(int64_t step, int64_t published) const {
    return Admits(step, published, max_policy_lag);
  }

  // The version step `step` samples from under stalesync.rollout_version
  // lagged, with m = steps_per_version consecutive steps sharing one
  // version: the frame's steps i in [mb, mb + m) sample from
  // max(v0, v0 + mb + m - 1 - s), the version their last step is admitted
  // at. m = 1 is AdmitVersion (every sample exactly s old once the pipeline
  // is full); with m > 1 the block's steps are s - m + 1 .. s old and their
  // rollouts can decode in one round (continuous batching across steps), at
  // the price of starting later. Never below AdmitVersion, so staleness
  // stays <= s. A step before the frame belongs to the block below it.
  int64_t LaggedSampleVersion(int64_t step) const;

  // Partial rollout with segments of `segment_tokens` N > 0 tokens: the
  // version that samples token `tokens` of a response of `step`, the
  // version that samples step + min(tokens / N, s - 1) under m = 1 (at
  // least v0). N <= 0: the step's own version.
  int64_t TokenVersion(int64_t step, int64_t tokens,
                       int64_t segment_tokens) const;
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
// Advance() is the only way a clock moves forward, and it moves it by
// exactly one and only if the rule allowed that step to start. Since the
// other clocks never decrease and removing a node only raises the minimum,
// a step that was allowed when it started is still allowed when it
// finishes, so the check at Advance() refuses exactly the steps that were
// started without permission.
//
// Invariant: at any moment, max clock - min clock over live nodes <= k + 1.
// (Induction: a node at c advances to c+1 only if c <= min(others) + k, so
// afterwards its clock is <= min(others) + k + 1; Remove() only shrinks the
// set.) MaxSkewSeen() records the largest such difference ever reached.
//
// A removed (lost) super node no longer holds the others back; it cannot
// come back under the same name.
//
// Thread safety: none; a value the caller guards. JobManager keeps a skewed
// job's gate under JobManager::mu_ (REQUIRES it for every call) and waits
// for a node's turn on its own condition variable.
class ClockSkewGate {
 public:
  // Validates and builds a gate. InvalidArgument if max_clock_skew < 0,
  // initial_clock < 0, `super_nodes` is empty, or a name is empty or
  // repeated (naming it).
  static absl::StatusOr<ClockSkewGate> Create(
      int64_t max_clock_skew, const std::vector<std::string>& super_nodes,
      int64_t initial_clock = 0);

  // REQUIRES: max_clock_skew >= 0, initial_clock >= 0, names non-empty and
  // unique (unchecked; a repeated name is kept once). Use Create() for
  // untrusted values.
  ClockSkewGate(int64_t max_clock_skew,
                const std::vector<std::string>& super_nodes,
                int64_t initial_clock = 0);

  // Records that super node `name` finished step `new_clock`. NotFound for
  // an unknown name; FailedPrecondition, naming the node, if it was
  // removed, if new_clock is not its clock + 1, or if the rule did not allow
  // it to start that step (naming the slowest other node: "super node sn-a
  // at clock 3 may not start step 4: slowest super node sn-c is at clock 1
  // (max_clock_skew k=1); it finished a step it was not allowed to start").
  // On error nothing changes.
  absl::Status Advance(const std::string& name, int64_t new_clock);

  // Whether live super node `name` may start step Clock(name) + 1 now.
  // False for unknown or removed names.
  bool MayStart(const std::string& name) const;

  // Removes a lost super node: it no longer holds others back and may no
  // longer advance. Unknown or already removed names are ignored.
  void Remove(const std::string& name);

  // Sets every live node's clock to `clock` (their steps after it are run
  // again: a job rolled back to its last weight sync). The largest skew
  // seen is kept.
  void RollBack(int64_t clock);

  // The clock of `name` (its last clock if removed), or -1 if unknown.
  int64_t Clock(const std::string& name) const;

  // The largest max clock - min clock over live nodes ever reached (0 at
  // construction). Never exceeds k + 1.
  int64_t MaxSkewSeen() const { return max_skew_seen_; }

  // "clock skew k=1: sn-a=3 sn-b=2 sn-c=2(removed); max skew seen 1".
  std::string DebugString() const;

 private:
  struct Node {
    int64_t clock = 0;
    bool live = true;
  };

  // The live node other than `self` with the smallest clock (ties: first
  // name), or end() if there is none.
  std::map<std::string, Node>::const_iterator SlowestOther(
      const std::string& self) const;
  bool MayStart(const std::string& name, const Node& node) const;
  std::string BlockedMessage(const std::string& name, const Node& node) const;
  void UpdateSkew();

  int64_t max_clock_skew_;
  std::map<std::string, Node> nodes_;
  int64_t max_skew_seen_ = 0;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_STALESYNC_H_
