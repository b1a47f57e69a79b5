#include "worker/step/role_overlap.h"

namespace fusionrl {

RoleOverlap::RoleOverlap(const Clock& clock) : clock_(clock) {
  absl::MutexLock lock(&mu_);
  last_ = clock_.Now();
}

void RoleOverlap::AdvanceLocked() {
  const absl::Time now = clock_.Now();
  const double s = absl::ToDoubleSeconds(now - last_);
  last_ = now;
  if (s <= 0) return;
  if (trainer_ && rollout_) {
    pending_.both += s;
  } else if (trainer_) {
    pending_.trainer_only += s;
  } else if (rollout_) {
    pending_.rollout_only += s;
  } else {
    pending_.idle += s;
  }
}

void RoleOverlap::Begin(Role role) {
  absl::MutexLock lock(&mu_);
  AdvanceLocked();
  (role == Role::kTrainer ? trainer_ : rollout_) = true;
}

void RoleOverlap::End(Role role) {
  absl::MutexLock lock(&mu_);
  AdvanceLocked();
  (role == Role::kTrainer ? trainer_ : rollout_) = false;
}

bool RoleOverlap::Computing(Role role) const {
  absl::MutexLock lock(&mu_);
  return role == Role::kTrainer ? trainer_ : rollout_;
}

RoleSplit RoleOverlap::Take() {
  absl::MutexLock lock(&mu_);
  AdvanceLocked();
  RoleSplit out = pending_;
  pending_ = RoleSplit();
  return out;
}

}  // namespace fusionrl
