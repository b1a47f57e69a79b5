#include "core/clock.h"

#include <algorithm>
#include <chrono>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace fusionrl {
namespace {

class RealClockImpl final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  absl::Time MonotonicNow() const override {
    return absl::UnixEpoch() +
           absl::FromChrono(
               std::chrono::steady_clock::now().time_since_epoch());
  }
};

}  // namespace

Clock::~Clock() = default;

Clock& RealClock() {
  static RealClockImpl* const clock = new RealClockImpl();
  return *clock;
}

bool WaitOnClock(absl::CondVar& cv, absl::Mutex& mu, const Clock& clock,
                 absl::Time deadline, absl::Duration poll) {
  const absl::Duration left = deadline - clock.Now();
  if (left <= absl::ZeroDuration()) return true;
  cv.WaitWithTimeout(&mu, std::min(left, poll));
  return clock.Now() >= deadline;
}

void SleepOnClock(const Clock& clock, absl::Duration d, absl::Duration poll) {
  absl::Mutex mu;
  absl::CondVar cv;  // never signalled: WaitOnClock reads the clock again
  absl::MutexLock lock(&mu);
  const absl::Time until = clock.Now() + d;
  while (!WaitOnClock(cv, mu, clock, until, poll)) {
  }
}

}  // namespace fusionrl
