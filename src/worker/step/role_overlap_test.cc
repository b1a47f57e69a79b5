#include "worker/step/role_overlap.h"

#include "core/fake_clock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using Role = RoleOverlap::Role;

TEST(RoleOverlapTest, SplitsTimeByWhichRolesCompute) {
  FakeClock clock;
  RoleOverlap overlap(clock);
  clock.Advance(absl::Seconds(1));  // idle
  overlap.Begin(Role::kRollout);
  clock.Advance(absl::Seconds(2));  // rollout only
  overlap.Begin(Role::kTrainer);
  EXPECT_TRUE(overlap.Computing(Role::kTrainer));
  EXPECT_TRUE(overlap.Computing(Role::kRollout));
  clock.Advance(absl::Seconds(3));  // both
  overlap.End(Role::kRollout);
  EXPECT_FALSE(overlap.Computing(Role::kRollout));
  clock.Advance(absl::Seconds(4));  // trainer only
  const RoleSplit a = overlap.Take();
  EXPECT_DOUBLE_EQ(a.idle, 1);
  EXPECT_DOUBLE_EQ(a.rollout_only, 2);
  EXPECT_DOUBLE_EQ(a.both, 3);
  EXPECT_DOUBLE_EQ(a.trainer_only, 4);
  EXPECT_DOUBLE_EQ(a.total(), 10);
  // Take() starts a new period; the trainer is still computing.
  clock.Advance(absl::Seconds(5));
  overlap.End(Role::kTrainer);
  clock.Advance(absl::Seconds(6));
  const RoleSplit b = overlap.Take();
  EXPECT_DOUBLE_EQ(b.trainer_only, 5);
  EXPECT_DOUBLE_EQ(b.idle, 6);
  EXPECT_DOUBLE_EQ(b.both, 0);
  RoleSplit sum = a;
  sum += b;
  EXPECT_DOUBLE_EQ(sum.total(), 21);
}

}  // namespace
}  // namespace fusionrl
