// A pause measured on an injected Clock, for the controller's polling loops
// (no wall-clock sleeps in controller logic): a FakeClock that a test moves
// ends it as well.
#ifndef FUSIONRL_CONTROLLER_CLOCK_WAIT_H_
#define FUSIONRL_CONTROLLER_CLOCK_WAIT_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace fusionrl {

// Returns once `clock` has moved `d` past the time of the call.
inline void SleepOnClock(const Clock& clock, absl::Duration d) {
  absl::Mutex mu;
  absl::CondVar cv;  // never signalled: WaitOnClock polls the clock
  absl::MutexLock lock(&mu);
  const absl::Time until = clock.Now() + d;
  while (!WaitOnClock(cv, mu, clock, until)) {
  }
}

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_CLOCK_WAIT_H_
