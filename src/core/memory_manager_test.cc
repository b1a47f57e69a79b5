#include "core/memory_manager.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/fake_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/wait_watch.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;
using Outcome = MemoryDecision::Outcome;

constexpr int64_t kMiB = int64_t{1} << 20;

// How long a thread may take to block in a Wait* call, and those calls'
// deadline: generous, since the tests wait for the state, never for time.
constexpr absl::Duration kLong = absl::Seconds(30);

// weights 20 MiB + optimizer 40 MiB on a 64 MiB card: 4 MiB free.
std::unique_ptr<CardMemoryManager> TrainerCard(OffloadPolicy policy,
                                               int card = 0) {
  auto m = std::make_unique<CardMemoryManager>(card, 64 * kMiB, policy);
  m->Set(MemoryCategory::kWeights, 20 * kMiB);
  m->Set(MemoryCategory::kOptimizer, 40 * kMiB);
  return m;
}

TEST(CardMemoryManagerTest, CategoryNamesAreTheStatusKeys) {
  EXPECT_EQ(MemoryCategoryName(MemoryCategory::kWeights), "weights");
  EXPECT_EQ(MemoryCategoryName(MemoryCategory::kSnapshot), "snapshot");
  EXPECT_EQ(MemoryCategoryName(MemoryCategory::kOptimizer), "optimizer");
  EXPECT_EQ(MemoryCategoryName(MemoryCategory::kGradients), "gradients");
  EXPECT_EQ(MemoryCategoryName(MemoryCategory::kActivations), "activations");
  EXPECT_EQ(MemoryCategoryName(MemoryCategory::kKvCache), "kv_cache");
  EXPECT_EQ(MemoryCategoryName(MemoryCategory::kOptimizerHost),
            "optimizer_host");
  EXPECT_TRUE(IsDeviceMemory(MemoryCategory::kKvCache));
  EXPECT_FALSE(IsDeviceMemory(MemoryCategory::kOptimizerHost));
}

TEST(CardMemoryManagerTest, CreateReadsTheMemorySection) {
  MemoryConfig config;
  config.card_budget_mib = 64.5;
  config.offload_optimizer = OffloadPolicy::kNever;
  auto m = CardMemoryManager::Create(2, config);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->budget_bytes(), 67633152);  // 64.5 * 1048576
  EXPECT_EQ((*m)->policy(), OffloadPolicy::kNever);
  EXPECT_EQ((*m)->card_index(), 2);

  EXPECT_EQ(CardMemoryManager::Create(0, MemoryConfig{}).value()->policy(),
            OffloadPolicy::kAuto);
  EXPECT_EQ(
      CardMemoryManager::Create(0, MemoryConfig{}).value()->budget_bytes(), 0);

  config.offload_optimizer = OffloadPolicy::kAuto;
  config.card_budget_mib = -1;
  EXPECT_EQ(CardMemoryManager::Create(0, config).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.card_budget_mib = 1;
  EXPECT_EQ(CardMemoryManager::Create(-1, config).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CardMemoryManagerTest, GrantsRequestsUpToTheBudgetInclusive) {
  CardMemoryManager m(1, 64 * kMiB, OffloadPolicy::kAuto);
  m.Set(MemoryCategory::kWeights, 20 * kMiB);
  m.Set(MemoryCategory::kGradients, 4 * kMiB);
  MemoryDecision d = m.RequestKvCache(30 * kMiB);
  EXPECT_EQ(d.outcome, Outcome::kGranted);
  EXPECT_TRUE(d.granted());
  EXPECT_EQ(d.message, "");
  EXPECT_EQ(m.Get(MemoryCategory::kKvCache), 30 * kMiB);
  EXPECT_EQ(m.InUse(), 54 * kMiB);

  // Exactly the budget fits.
  d = m.RequestActivations(10 * kMiB);
  EXPECT_EQ(d.outcome, Outcome::kGranted);
  EXPECT_EQ(m.InUse(), 64 * kMiB);

  // One byte more does not, and there is no optimizer state to offload.
  d = m.RequestActivations(10 * kMiB + 1);
  EXPECT_EQ(d.outcome, Outcome::kRefused);
  EXPECT_FALSE(d.granted());
  EXPECT_EQ(d.message,
            "card 1: activations needs 0.0 MiB more; budget 64.0 MiB, in use "
            "64.0 MiB: weights 20.0, gradients 4.0, activations 10.0, "
            "kv_cache 30.0; short by 0.0 MiB; no optimizer state on the card "
            "to offload");
  EXPECT_EQ(m.Get(MemoryCategory::kActivations), 10 * kMiB);

  // A cache that grows within what it holds, or shrinks, is always granted.
  EXPECT_EQ(m.RequestKvCache(30 * kMiB).outcome, Outcome::kGranted);
  EXPECT_EQ(m.RequestKvCache(6 * kMiB).outcome, Outcome::kGranted);
  EXPECT_EQ(m.InUse(), 40 * kMiB);
  EXPECT_EQ(m.Peak(MemoryCategory::kKvCache), 30 * kMiB);
  EXPECT_EQ(m.PeakInUse(), 64 * kMiB);
}

TEST(CardMemoryManagerTest, NeverPolicyRefusesInsteadOfOffloading) {
  auto m = TrainerCard(OffloadPolicy::kNever);
  EXPECT_EQ(m->InUse(), 60 * kMiB);
  MemoryDecision d = m->RequestKvCache(12 * kMiB);
  EXPECT_EQ(d.outcome, Outcome::kRefused);
  EXPECT_EQ(d.offload_bytes, 0);
  EXPECT_EQ(d.message,
            "card 0: KV cache needs 12.0 MiB more; budget 64.0 MiB, in use "
            "60.0 MiB: weights 20.0, optimizer 40.0; short by 8.0 MiB; "
            "optimizer offload is off (memory.offload_optimizer: never)");
  // Nothing was recorded.
  EXPECT_EQ(m->Get(MemoryCategory::kKvCache), 0);
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizer), 40 * kMiB);
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizerHost), 0);
  EXPECT_FALSE(m->optimizer_offloaded());
  // What fits is still granted.
  EXPECT_EQ(m->RequestKvCache(4 * kMiB).outcome, Outcome::kGranted);
  EXPECT_EQ(m->InUse(), 64 * kMiB);
}

TEST(CardMemoryManagerTest, KvCacheGrowthOffloadsOptimizerAndReleaseRestores) {
  auto m = TrainerCard(OffloadPolicy::kAuto);
  MemoryDecision d = m->RequestKvCache(12 * kMiB);
  EXPECT_EQ(d.outcome, Outcome::kGrantedAfterOffload);
  EXPECT_TRUE(d.granted());
  EXPECT_EQ(d.offload_bytes, 40 * kMiB);
  // The books hold the plan at once: 20 + 12 on the card, 40 on the host.
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizer), 0);
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizerHost), 40 * kMiB);
  EXPECT_EQ(m->Get(MemoryCategory::kKvCache), 12 * kMiB);
  EXPECT_EQ(m->InUse(), 32 * kMiB);
  EXPECT_TRUE(m->optimizer_offloaded());
  EXPECT_TRUE(m->offload_in_flight());

  // While the offload is in flight: no restore (the state is still on the
  // card, so a trainer need not wait), and no second offload.
  EXPECT_FALSE(m->OptimizerRestoreNeeded());
  EXPECT_EQ(
      m->WaitOptimizerRestore(RealClock(), absl::InfiniteFuture()).value(), 0);
  d = m->RequestActivations(40 * kMiB);
  EXPECT_EQ(d.outcome, Outcome::kRefused);
  EXPECT_THAT(d.message, HasSubstr("short by 8.0 MiB; an optimizer offload "
                                   "or restore is in flight"));

  // The caller measured a little more than planned.
  m->OptimizerOffloaded(40 * kMiB + 4096);
  EXPECT_FALSE(m->offload_in_flight());
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizerHost), 40 * kMiB + 4096);
  EXPECT_EQ(m->InUse(), 32 * kMiB);
  // 32 + 40 MiB would not fit: not yet.
  EXPECT_FALSE(m->OptimizerRestoreNeeded());

  // The sampling round ends and releases its cache: now it fits (20 + 40).
  m->Set(MemoryCategory::kKvCache, 0);
  EXPECT_TRUE(m->optimizer_offloaded());
  EXPECT_TRUE(m->OptimizerRestoreNeeded());
  // The room is reserved at once; a second answer is false.
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizer), 40 * kMiB + 4096);
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizerHost), 0);
  EXPECT_FALSE(m->OptimizerRestoreNeeded());
  EXPECT_FALSE(m->optimizer_offloaded());
  m->OptimizerRestored(40 * kMiB);
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizer), 40 * kMiB);
  EXPECT_EQ(m->InUse(), 60 * kMiB);

  // The card never went over its budget, by the books (the largest figure
  // was the reservation for the state as measured: 20 MiB + 40 MiB + 4 KiB).
  EXPECT_EQ(m->PeakInUse(), 60 * kMiB + 4096);
  EXPECT_EQ(m->Peak(MemoryCategory::kKvCache), 12 * kMiB);
  EXPECT_EQ(m->Peak(MemoryCategory::kOptimizerHost), 40 * kMiB + 4096);
  EXPECT_EQ(m->Peak(MemoryCategory::kOptimizer), 40 * kMiB + 4096);

  // The next round offloads again.
  EXPECT_EQ(m->RequestKvCache(12 * kMiB).offload_bytes, 40 * kMiB);
}

TEST(CardMemoryManagerTest, ActivationsCanOffloadToo) {
  auto m = TrainerCard(OffloadPolicy::kAuto);
  MemoryDecision d = m->RequestActivations(44 * kMiB);  // 20 + 44 = 64
  EXPECT_EQ(d.outcome, Outcome::kGrantedAfterOffload);
  EXPECT_EQ(d.offload_bytes, 40 * kMiB);
  EXPECT_EQ(m->InUse(), 64 * kMiB);
}

TEST(CardMemoryManagerTest, RefusesWhenOffloadingIsNotEnough) {
  auto m = TrainerCard(OffloadPolicy::kAuto, 3);
  MemoryDecision d = m->RequestKvCache(44 * kMiB + 1);  // 20 + 44 MiB + 1
  EXPECT_EQ(d.outcome, Outcome::kRefused);
  EXPECT_EQ(d.message,
            "card 3: KV cache needs 44.0 MiB more; budget 64.0 MiB, in use "
            "60.0 MiB: weights 20.0, optimizer 40.0; short by 40.0 MiB; "
            "offloading the optimizer state (40.0 MiB) would not be enough");
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizer), 40 * kMiB);
  EXPECT_EQ(m->Get(MemoryCategory::kKvCache), 0);
}

TEST(CardMemoryManagerTest, UnlimitedBudgetNeverRefuses) {
  CardMemoryManager m(0, 0, OffloadPolicy::kAuto);
  const int64_t tib = int64_t{1} << 40;
  m.Set(MemoryCategory::kWeights, tib);
  m.Set(MemoryCategory::kOptimizer, 2 * tib);
  EXPECT_EQ(m.RequestKvCache(3 * tib).outcome, Outcome::kGranted);
  EXPECT_EQ(m.RequestActivations(4 * tib).outcome, Outcome::kGranted);
  EXPECT_EQ(m.InUse(), 10 * tib);
  EXPECT_EQ(m.Get(MemoryCategory::kOptimizerHost), 0);
  EXPECT_FALSE(m.OptimizerRestoreNeeded());
  EXPECT_EQ(m.Snapshot().at("budget"), 0);
}

TEST(CardMemoryManagerTest, ManualOffloadAndRestoreMoveTheBooks) {
  auto m = TrainerCard(OffloadPolicy::kNever);
  m->OptimizerOffloaded(50 * kMiB);  // more than there is: all 40 move
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizer), 0);
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizerHost), 40 * kMiB);
  m->OptimizerRestored(10 * kMiB);
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizer), 10 * kMiB);
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizerHost), 30 * kMiB);
}

TEST(CardMemoryManagerTest, SnapshotHasEveryCategoryPeaksAndBudget) {
  auto m = TrainerCard(OffloadPolicy::kAuto);
  m->Set(MemoryCategory::kSnapshot, 1 * kMiB);
  m->Set(MemoryCategory::kGradients, 2 * kMiB);
  m->Set(MemoryCategory::kActivations, 3 * kMiB);
  m->Set(MemoryCategory::kActivations, 0);
  EXPECT_EQ(m->RequestKvCache(5 * kMiB).outcome, Outcome::kGrantedAfterOffload);
  m->OptimizerOffloaded(40 * kMiB);
  const std::map<std::string, int64_t> expected = {
      {"weights", 20 * kMiB},
      {"snapshot", 1 * kMiB},
      {"optimizer", 0},
      {"gradients", 2 * kMiB},
      {"activations", 0},
      {"kv_cache", 5 * kMiB},
      {"optimizer_host", 40 * kMiB},
      {"peak_weights", 20 * kMiB},
      {"peak_snapshot", 1 * kMiB},
      {"peak_optimizer", 40 * kMiB},
      {"peak_gradients", 2 * kMiB},
      {"peak_activations", 3 * kMiB},
      {"peak_kv_cache", 5 * kMiB},
      {"peak_optimizer_host", 40 * kMiB},
      {"in_use", 28 * kMiB},
      {"peak_total", 66 * kMiB},  // 20 + 40 + 1 + 2 + 3, set by hand
      {"budget", 64 * kMiB},
  };
  EXPECT_EQ(m->Snapshot(), expected);
  EXPECT_EQ(m->DebugString(),
            "card 0: in use 28.0 MiB: weights 20.0, snapshot 1.0, gradients "
            "2.0, kv_cache 5.0 MiB; budget 64.0 MiB, optimizer_host 40.0 MiB, "
            "peak 66.0 MiB, offload auto");
}

TEST(CardMemoryManagerTest, WaitOptimizerRestoreWaitsForRoom) {
  auto m = TrainerCard(OffloadPolicy::kAuto);
  // Nothing offloaded: nothing to wait for.
  absl::StatusOr<int64_t> r = m->WaitOptimizerRestore(RealClock(), absl::Now());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 0);

  ASSERT_EQ(m->RequestKvCache(12 * kMiB).outcome,
            Outcome::kGrantedAfterOffload);
  m->OptimizerOffloaded(40 * kMiB);
  r = m->WaitOptimizerRestore(RealClock(),
                              absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(r.status(),
            absl::DeadlineExceededError(
                "card 0: optimizer state (40.0 MiB) cannot come back: budget "
                "64.0 MiB, in use 32.0 MiB: weights 20.0, kv_cache 12.0"));

  // The trainer is blocked in WaitOptimizerRestore (the KV cache takes the
  // room) when the rollout frees the cache; that wakes it and it reserves.
  CondVarWaitWatch watch(*m);
  std::atomic<bool> returned{false};
  std::thread trainer([&] {
    r = m->WaitOptimizerRestore(RealClock(), absl::Now() + kLong);
    returned.store(true);
  });
  const bool blocked = watch.AwaitWaits(1, kLong);
  EXPECT_TRUE(blocked) << "WaitOptimizerRestore never blocked";
  EXPECT_FALSE(returned.load());
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizer), 0);  // nothing reserved yet
  m->Set(MemoryCategory::kKvCache, 0);
  trainer.join();
  ASSERT_TRUE(blocked);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 40 * kMiB);
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizer), 40 * kMiB);
  m->OptimizerRestored(*r);
  EXPECT_EQ(m->InUse(), 60 * kMiB);
}

// The restore's deadline is a time on the clock passed in (the card's): a
// FakeClock's deadline ends the wait when the test moves that clock.
TEST(CardMemoryManagerTest, WaitOptimizerRestoreDeadlineIsOnTheGivenClock) {
  auto m = TrainerCard(OffloadPolicy::kAuto);
  ASSERT_EQ(m->RequestKvCache(12 * kMiB).outcome,
            Outcome::kGrantedAfterOffload);
  m->OptimizerOffloaded(40 * kMiB);
  FakeClock clock;
  CondVarWaitWatch watch(*m);
  std::atomic<bool> returned{false};
  absl::StatusOr<int64_t> r;
  std::thread trainer([&] {
    r = m->WaitOptimizerRestore(clock, clock.Now() + absl::Minutes(1));
    returned.store(true);
  });
  const bool blocked = watch.AwaitWaits(3, kLong);
  EXPECT_TRUE(blocked) << "WaitOptimizerRestore never blocked";
  EXPECT_FALSE(returned.load());
  clock.Advance(absl::Minutes(1));
  trainer.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
}

// Fused mode: the rollout thread's request needs an offload that only the
// trainer's thread may carry out; the rollout waits for it, the trainer does
// it between steps, then waits for the room to bring the state back.
TEST(CardMemoryManagerTest, FusedRolloutWaitsForTheTrainerToOffload) {
  auto m = TrainerCard(OffloadPolicy::kAuto);
  EXPECT_TRUE(m->WaitOptimizerOffloaded(RealClock(), absl::Now())
                  .ok());  // none pending

  ASSERT_EQ(m->RequestKvCache(12 * kMiB).outcome,
            Outcome::kGrantedAfterOffload);
  EXPECT_EQ(m->WaitOptimizerOffloaded(RealClock(),
                                      absl::Now() + absl::Milliseconds(10)),
            absl::DeadlineExceededError(
                "card 0: the optimizer state (40.0 MiB) was not offloaded in "
                "time; the trainer carries it out between steps"));

  // The rollout is blocked in WaitOptimizerOffloaded when the trainer,
  // between steps, carries the offload out and confirms it.
  CondVarWaitWatch watch(*m);
  std::atomic<bool> returned{false};
  absl::Status offloaded;
  std::thread rollout([&] {
    offloaded = m->WaitOptimizerOffloaded(RealClock(), absl::Now() + kLong);
    returned.store(true);
  });
  const bool blocked = watch.AwaitWaits(1, kLong);
  EXPECT_TRUE(blocked) << "WaitOptimizerOffloaded never blocked";
  EXPECT_FALSE(returned.load());
  EXPECT_TRUE(m->offload_in_flight());
  m->OptimizerOffloaded(40 * kMiB);
  rollout.join();
  ASSERT_TRUE(blocked);
  EXPECT_TRUE(offloaded.ok()) << offloaded;
  EXPECT_FALSE(m->offload_in_flight());
  EXPECT_EQ(m->Get(MemoryCategory::kOptimizerHost), 40 * kMiB);
  EXPECT_EQ(m->InUse(), 32 * kMiB);
}

// Two threads change the books while a third reads them; run under the
// normal build (and under TSan where available). Every snapshot is
// consistent and the end state is exact.
TEST(CardMemoryManagerTest, ConcurrentSetAndRequestKeepTheBooksConsistent) {
  constexpr int kRounds = 20000;
  CardMemoryManager m(0, 64 * kMiB, OffloadPolicy::kNever);
  m.Set(MemoryCategory::kWeights, 20 * kMiB);
  m.Set(MemoryCategory::kOptimizer, 28 * kMiB);
  std::thread trainer([&] {
    for (int i = 0; i < kRounds; ++i) {
      m.Set(MemoryCategory::kGradients, i % 2 == 0 ? 16 * kMiB : 0);
    }
  });
  int granted = 0;
  int refused = 0;
  std::thread rollout([&] {
    for (int i = 0; i < kRounds; ++i) {
      // Fits unless the gradients are held: 20 + 28 + 16 + 16 = 80 > 64.
      MemoryDecision d = m.RequestKvCache(16 * kMiB);
      (d.granted() ? granted : refused)++;
      ASSERT_EQ(m.RequestKvCache(0).outcome, Outcome::kGranted);
    }
  });
  for (int i = 0; i < 2000; ++i) {
    const std::map<std::string, int64_t> s = m.Snapshot();
    ASSERT_EQ(s.at("in_use"), s.at("weights") + s.at("snapshot") +
                                  s.at("optimizer") + s.at("gradients") +
                                  s.at("activations") + s.at("kv_cache"));
    ASSERT_LE(s.at("kv_cache"), 16 * kMiB);
  }
  trainer.join();
  rollout.join();
  EXPECT_EQ(granted + refused, kRounds);
  EXPECT_EQ(m.Get(MemoryCategory::kGradients), 0);
  EXPECT_EQ(m.Get(MemoryCategory::kKvCache), 0);
  EXPECT_EQ(m.InUse(), 48 * kMiB);
  EXPECT_GE(m.PeakInUse(), 64 * kMiB);
  EXPECT_LE(m.PeakInUse(), 80 * kMiB);
  EXPECT_EQ(m.Peak(MemoryCategory::kGradients), 16 * kMiB);
}

TEST(FormatCardMemoryTest, ShowsCategoriesInStableOrder) {
  auto m = TrainerCard(OffloadPolicy::kAuto);
  m->Set(MemoryCategory::kSnapshot, 20 * kMiB);
  m->Set(MemoryCategory::kGradients, 20 * kMiB);
  m->Set(MemoryCategory::kActivations, 3 * kMiB + kMiB / 2);
  m->Set(MemoryCategory::kActivations, 0);
  EXPECT_EQ(FormatCardMemory(0, m->Snapshot()),
            "card 0 memory: weights 20.0 MiB, snapshot 20.0 MiB, optimizer "
            "40.0 MiB, gradients 20.0 MiB, activations 3.5 MiB (peak), "
            "kv_cache 0.0 MiB; in use 100.0 MiB (peak 103.5 MiB), budget "
            "64.0 MiB");
  // Offloaded state appears next to the optimizer.
  m->Set(MemoryCategory::kSnapshot, 0);
  m->Set(MemoryCategory::kGradients, 0);
  ASSERT_EQ(m->RequestKvCache(8 * kMiB).outcome, Outcome::kGrantedAfterOffload);
  EXPECT_THAT(FormatCardMemory(1, m->Snapshot()),
              HasSubstr("card 1 memory: weights 20.0 MiB, snapshot 0.0 MiB, "
                        "optimizer 0.0 MiB, optimizer_host 40.0 MiB, "
                        "gradients 0.0 MiB"));
}

TEST(FormatCardMemoryTest, HandlesPartialUnknownAndEmptyMaps) {
  EXPECT_EQ(FormatCardMemory(0, {}), "");
  EXPECT_EQ(FormatCardMemory(2, {{"kv_cache", 3 * kMiB},
                                 {"weights", kMiB / 10},
                                 {"zz_extra", 2 * kMiB},
                                 {"activations", kMiB},
                                 {"budget", 0}}),
            "card 2 memory: weights 0.1 MiB, activations 1.0 MiB, kv_cache "
            "3.0 MiB, zz_extra 2.0 MiB; budget unlimited");
}

}  // namespace
}  // namespace fusionrl
