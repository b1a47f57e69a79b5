#include "core/clock.h"

#include "core/fake_clock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

TEST(ClockTest, MonotonicTimeNeverGoesBackAndMeasuresDurations) {
  const Clock& real = RealClock();
  absl::Time last = real.MonotonicNow();
  for (int i = 0; i < 1000; ++i) {
    const absl::Time now = real.MonotonicNow();
    EXPECT_GE(now, last);
    last = now;
  }
  const absl::Time start = real.MonotonicNow();
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_GE(real.SecondsSince(start), 0.02);

  // A fake's monotonic time is its Now(): durations follow Advance().
  FakeClock fake(absl::FromUnixSeconds(100));
  const absl::Time t0 = fake.MonotonicNow();
  fake.Advance(absl::Seconds(2.5));
  EXPECT_EQ(fake.SecondsSince(t0), 2.5);
}

}  // namespace
}  // namespace fusionrl
