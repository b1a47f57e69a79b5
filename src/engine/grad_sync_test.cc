// The Gloo groups behind GradientSync: a group formed through any c10d
// Store (as the cross-node group of the c10d data plane is, through the
// controller's) sums like the local one, and a collective that a frozen
// peer holds up is abandoned as soon as the probe says so, not at the
// group's timeout.
#include "engine/grad_sync.h"

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <future>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

std::vector<std::unique_ptr<GradientSync>> StoreGroup(
    int world, absl::Duration timeout,
    std::function<absl::Status()> probe = nullptr) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<absl::StatusOr<std::unique_ptr<GradientSync>>>>
      pending;
  for (int r = 0; r < world; ++r) {
    pending.push_back(std::async(std::launch::async, [=] {
      return MakeStoreGlooGroup(store, r, world, timeout, probe);
    }));
  }
  std::vector<std::unique_ptr<GradientSync>> group;
  for (auto& p : pending) {
    auto g = p.get();
    EXPECT_TRUE(g.ok()) << g.status();
    if (g.ok()) group.push_back(*std::move(g));
  }
  return group;
}

TEST(GradSyncTest, AStoreGroupSumsEveryRanksTensors) {
  auto group = StoreGroup(3, absl::Seconds(30));
  ASSERT_EQ(group.size(), 3u);
  std::vector<std::future<std::vector<float>>> results;
  for (int r = 0; r < 3; ++r) {
    results.push_back(std::async(std::launch::async, [&, r] {
      std::vector<at::Tensor> t = {at::full({2}, 1.0f + r),
                                   at::full({3}, 10.0f * r)};
      EXPECT_TRUE(group[r]->AllReduceSum(t).ok());
      return std::vector<float>{t[0][0].item<float>(), t[0][1].item<float>(),
                                t[1][2].item<float>()};
    }));
  }
  for (auto& f : results) {
    EXPECT_EQ(f.get(), (std::vector<float>{6.0f, 6.0f, 30.0f}));
  }
}

TEST(GradSyncTest, AProbeErrorAbandonsACollectiveAFrozenPeerHolds) {
  std::atomic<int> probes{0};
  // The peer is "declared lost" after a few probes.
  auto probe = [&probes]() -> absl::Status {
    return ++probes >= 3 ? absl::AbortedError("generation 7 is over")
                         : absl::OkStatus();
  };
  auto group = StoreGroup(2, absl::Seconds(30), probe);
  ASSERT_EQ(group.size(), 2u);
  // Rank 1 never joins the all-reduce (frozen).
  std::vector<at::Tensor> t = {at::ones({4})};
  const absl::Time start = absl::Now();
  absl::Status s = group[0]->AllReduceSum(t);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("generation 7 is over"), std::string::npos) << s;
  // Abandoned after a second of waiting and a few 200 ms probes, far from
  // the group's 30 s timeout.
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_LT(took, absl::Seconds(15)) << took;
  EXPECT_GE(probes.load(), 3);
  // The abandoned group refuses further collectives...
  EXPECT_EQ(group[0]->AllReduceSum(t).code(),
            absl::StatusCode::kFailedPrecondition);
  // ...and letting go of it does not wait for the stuck collective.
  const absl::Time drop = absl::Now();
  group[0].reset();
  EXPECT_LT(absl::Now() - drop, absl::Seconds(5));
}

}  // namespace
}  // namespace fusionrl
