// The Gloo groups behind GradientSync: a group formed through any c10d
// Store (as the cross-node group of the c10d data plane is, through the
// controller's) sums like the local one, and a collective that a frozen
// peer holds up is abandoned as soon as the probe says so, not at the
// group's timeout.
#include "engine/collectives/grad_sync.h"

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
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

// StaleSync's asynchronous sums: started one after another without waiting
// (with a blocking sum between them), each holds its own sum once waited
// for, whichever rank waits first; a broadcast hands every rank the root's
// bytes exactly (a negative zero stays negative).
TEST(GradSyncTest, AsynchronousSumsAndABroadcastKeepTheirOrder) {
  auto group = StoreGroup(2, absl::Seconds(30));
  ASSERT_EQ(group.size(), 2u);
  std::vector<std::future<std::vector<float>>> results;
  for (int r = 0; r < 2; ++r) {
    results.push_back(std::async(std::launch::async, [&, r] {
      GradientSync& g = *group[r];
      std::vector<at::Tensor> sums;
      std::vector<int64_t> tickets;
      for (int i = 0; i < 3; ++i) {
        sums.push_back(at::full({4}, static_cast<float>(10 * i + r + 1)));
        auto t = g.StartAllReduceSum(sums.back());
        EXPECT_TRUE(t.ok()) << t.status();
        tickets.push_back(t.value_or(-1));
        if (i == 1) {
          std::vector<at::Tensor> now = {at::full({2}, 100.0f * (r + 1))};
          EXPECT_TRUE(g.AllReduceSum(now).ok());
          EXPECT_EQ(now[0][1].item<float>(), 300.0f);
        }
      }
      for (int64_t t : tickets) EXPECT_TRUE(g.WaitAllReduceSum(t).ok());
      EXPECT_EQ(g.WaitAllReduceSum(tickets[0]).code(),
                absl::StatusCode::kInvalidArgument);
      std::vector<at::Tensor> b = {
          r == 0 ? at::tensor({-0.0f, 1.5f}) : at::tensor({7.0f, 7.0f}),
          r == 0 ? at::tensor({2.0f}) : at::tensor({9.0f})};
      EXPECT_TRUE(g.Broadcast(b, 0).ok());
      return std::vector<float>{
          sums[0][0].item<float>(), sums[1][3].item<float>(),
          sums[2][2].item<float>(), b[0][0].item<float>(),
          b[0][1].item<float>(),    b[1][0].item<float>()};
    }));
  }
  for (auto& f : results) {
    const std::vector<float> v = f.get();
    EXPECT_EQ(v[0], 3.0f);   // (0 + 1) + (0 + 2)
    EXPECT_EQ(v[1], 23.0f);  // 11 + 12
    EXPECT_EQ(v[2], 43.0f);  // 21 + 22
    EXPECT_EQ(v[3], 0.0f);
    EXPECT_TRUE(std::signbit(v[3])) << "the root's -0.0 arrives as it is";
    EXPECT_EQ(v[4], 1.5f);
    EXPECT_EQ(v[5], 2.0f);
  }
}

// Sums in buckets of 40 bytes (10 floats): 103 elements over several
// tensors are 11 buckets, some spanning two tensors, the last partial. The
// values are small integers, so every order of summation gives the exact
// sum, which every rank must hold: a bucket lost, repeated or misplaced
// shows as a wrong element. Asynchronous sums take the same path.
TEST(GradSyncTest, BucketedSumsCoverEveryElementOnce) {
  constexpr int kWorld = 3;
  auto made =
      MakeLocalGlooGroup(kWorld, absl::Seconds(30), /*bucket_bytes=*/40);
  ASSERT_TRUE(made.ok()) << made.status();
  std::vector<std::unique_ptr<GradientSync>>& group = *made;
  const std::vector<int64_t> sizes = {7, 50, 1, 45};  // 103 elements
  std::vector<std::future<std::vector<at::Tensor>>> results;
  for (int r = 0; r < kWorld; ++r) {
    results.push_back(std::async(std::launch::async, [&, r] {
      std::vector<at::Tensor> t;
      int64_t offset = 0;
      for (int64_t n : sizes) {
        // Element i of rank r: i + 1000 r.
        t.push_back(at::arange(offset, offset + n, at::kFloat) + 1000.0f * r);
        offset += n;
      }
      EXPECT_TRUE(group[r]->AllReduceSum(t).ok());
      at::Tensor async = at::arange(0, 103, at::kFloat) * (r + 1);
      auto ticket = group[r]->StartAllReduceSum(async);
      EXPECT_TRUE(ticket.ok()) << ticket.status();
      EXPECT_TRUE(group[r]->WaitAllReduceSum(ticket.value_or(-1)).ok());
      t.push_back(async);
      return t;
    }));
  }
  for (auto& f : results) {
    std::vector<at::Tensor> t = f.get();
    ASSERT_EQ(t.size(), 5u);
    const at::Tensor blocking = at::cat({t[0], t[1], t[2], t[3]});
    // sum over r of (i + 1000 r) = 3 i + 3000.
    EXPECT_TRUE(at::equal(blocking, at::arange(0, 103, at::kFloat) * 3 + 3000))
        << blocking;
    // sum over r of i (r + 1) = 6 i.
    EXPECT_TRUE(at::equal(t[4], at::arange(0, 103, at::kFloat) * 6)) << t[4];
  }
}

// A collective that completes just after a slice's wait gave up: c10d's
// wait(timeout) then throws "Operation timed out!" although the work is
// done. That is a completed collective (with its own error, if it had
// one), never a failed one; a work still running is neither.
class CompletesAsTheWaitGivesUp : public c10d::Work {
 public:
  explicit CompletesAsTheWaitGivesUp(std::exception_ptr error)
      : error_(std::move(error)) {}
  bool wait(std::chrono::milliseconds timeout) override {
    if (!done_) {
      done_ = true;
      finish(error_);
      TORCH_CHECK(false, "Operation timed out!");
    }
    return c10d::Work::wait(timeout);
  }

 private:
  std::exception_ptr error_;
  bool done_ = false;
};

TEST(GradSyncTest, ASliceThatTimesOutAsTheWorkCompletesCountsAsCompleted) {
  auto ok = c10::make_intrusive<CompletesAsTheWaitGivesUp>(nullptr);
  EXPECT_TRUE(internal::WaitSlice(ok, absl::Milliseconds(10)));

  auto failed = c10::make_intrusive<CompletesAsTheWaitGivesUp>(
      std::make_exception_ptr(std::runtime_error("peer closed the pair")));
  try {
    internal::WaitSlice(failed, absl::Milliseconds(10));
    ADD_FAILURE() << "a failed collective's error was not thrown";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "peer closed the pair");
  }

  auto running = c10::make_intrusive<c10d::Work>();
  EXPECT_FALSE(internal::WaitSlice(running, absl::Milliseconds(10)));
}

}  // namespace
}  // namespace fusionrl
