// Time source, injected so that time-dependent logic (heartbeat liveness,
// StaleSync deadlines) can be tested by moving time by hand.
#ifndef FUSIONRL_CORE_CLOCK_H_
#define FUSIONRL_CORE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace fusionrl {

// A source of the current wall-clock time.
//
// Ownership: components borrow a Clock by reference; it must outlive them.
// Thread safety: implementations must be safe to call from any thread.
// Tests use FakeClock (fake_clock.h); production code uses RealClock().
class Clock {
 public:
  virtual ~Clock();

  // The current time. Not guaranteed monotonic for RealClock() (it follows
  // the system clock); FakeClock returns whatever it was set to.
  virtual absl::Time Now() const = 0;

  // A time that never goes backwards, for measuring durations (its epoch
  // is arbitrary: only differences mean anything). RealClock() reads the
  // steady clock; the default, for fakes, is Now().
  virtual absl::Time MonotonicNow() const { return Now(); }

  // Seconds from `start` (a MonotonicNow()) to now.
  double SecondsSince(absl::Time start) const {
    return absl::ToDoubleSeconds(MonotonicNow() - start);
  }
};

// The process-wide real clock (absl::Now()). Never destroyed, so it may be
// used from static destructors and detached threads.
Clock& RealClock();

// Waits on `cv` (the caller holds `mu`) until it is signalled or `clock`
// reaches `deadline`; returns true once the deadline has passed. Wakes at
// least every `poll` of real time to read the clock again, so a FakeClock
// that a test moves ends the wait too. Callers loop on their condition:
//   while (!ready && !WaitOnClock(cv, mu, clock, deadline)) {}
bool WaitOnClock(absl::CondVar& cv, absl::Mutex& mu, const Clock& clock,
                 absl::Time deadline,
                 absl::Duration poll = absl::Milliseconds(50));

// Returns once `clock` has moved `d` past the time of the call: the pause of
// a polling loop or a retry in controller and worker logic (no wall-clock
// sleeps there), which a FakeClock that a test moves ends as well.
void SleepOnClock(const Clock& clock, absl::Duration d,
                  absl::Duration poll = absl::Milliseconds(50));

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_CLOCK_H_
