// RoleOverlap: how a card's wall time splits between its two roles.
//
// The card's trainer and its rollout each say when they start and stop
// computing (Begin/End); Take() returns, for the time since the last Take,
// the seconds in which neither computed (idle), only the trainer did, only
// the rollout did, and both did. In colocated-sync the roles take turns on
// one thread, so "both" stays 0; in RL Fusion "both" is the overlap the
// placement exists for, and a trainer slower beside a rollout shows as
// trainer time that grew, not as a guess (`fusionrl bench` reports the
// split per mode).
//
// Thread safety: thread-safe (one mutex); Begin/End of one role must
// alternate (REQUIRES: End(r) only after Begin(r)).
#ifndef FUSIONRL_WORKER_STEP_ROLE_OVERLAP_H_
#define FUSIONRL_WORKER_STEP_ROLE_OVERLAP_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace fusionrl {

struct RoleSplit {
  double idle = 0;
  double trainer_only = 0;
  double rollout_only = 0;
  double both = 0;

  double total() const { return idle + trainer_only + rollout_only + both; }
  RoleSplit& operator+=(const RoleSplit& o) {
    idle += o.idle;
    trainer_only += o.trainer_only;
    rollout_only += o.rollout_only;
    both += o.both;
    return *this;
  }
};

class RoleOverlap {
 public:
  enum class Role { kTrainer, kRollout };

  // `clock` borrowed; time starts at construction.
  explicit RoleOverlap(const Clock& clock);

  void Begin(Role role) ABSL_LOCKS_EXCLUDED(mu_);
  void End(Role role) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether `role` is between Begin and End now.
  bool Computing(Role role) const ABSL_LOCKS_EXCLUDED(mu_);

  // The split since the previous Take() (or construction).
  RoleSplit Take() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Adds the time since last_ to the bucket of the current state.
  void AdvanceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock& clock_;
  mutable absl::Mutex mu_;
  bool trainer_ ABSL_GUARDED_BY(mu_) = false;
  bool rollout_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  RoleSplit pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_STEP_ROLE_OVERLAP_H_
