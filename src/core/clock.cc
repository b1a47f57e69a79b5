#include "core/clock.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace fusionrl {
namespace {

class RealClockImpl final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock::~Clock() = default;

Clock& RealClock() {
  static RealClockImpl* const clock = new RealClockImpl();
  return *clock;
}

}  // namespace fusionrl
