#include "core/stalesync.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/fake_clock.h"
#include "tests/support/wait_watch.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Generous deadline for waits that must succeed; short one for waits that
// must time out.
constexpr absl::Duration kLong = absl::Seconds(30);
constexpr absl::Duration kShort = absl::Milliseconds(30);

// Runs one blocking gate call on a thread of its own, so that the test can
// wait until it is blocked (CondVarWaitWatch) before releasing it. The
// destructor joins: every call given here has a deadline, so a test that
// stops early still ends.
class Waiter {
 public:
  explicit Waiter(std::function<absl::Status()> call)
      : thread_([this, call = std::move(call)] {
          status_ = call();
          returned_.store(true);
        }) {}
  ~Waiter() {
    if (thread_.joinable()) thread_.join();
  }

  bool returned() const { return returned_.load(); }
  absl::Status Join() {
    thread_.join();
    return status_;
  }

 private:
  absl::Status status_;
  std::atomic<bool> returned_{false};
  std::thread thread_;
};

// Admits until the gate refuses; returns how many were admitted.
int AdmitAll(PolicyLagGate& gate) {
  int n = 0;
  while (gate.TryAdmit()) ++n;
  return n;
}

// ---------------------------------------------------------------------------
// PolicyLagGate

TEST(StaleSyncPolicyLagTest, CreateValidates) {
  EXPECT_TRUE(PolicyLagGate::Create(0, 1).ok());
  absl::StatusOr<std::unique_ptr<PolicyLagGate>> gate =
      PolicyLagGate::Create(-1, 4);
  ASSERT_FALSE(gate.ok());
  EXPECT_EQ(gate.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(gate.status().message()),
              HasSubstr("max_policy_lag: must be >= 0, got -1"));
  gate = PolicyLagGate::Create(1, 0);
  ASSERT_FALSE(gate.ok());
  EXPECT_THAT(std::string(gate.status().message()),
              HasSubstr("groups_per_step: must be >= 1, got 0"));
  gate = PolicyLagGate::Create(1, 2, -3);
  ASSERT_FALSE(gate.ok());
  EXPECT_THAT(std::string(gate.status().message()),
              HasSubstr("initial_version: must be >= 0, got -3"));
}

TEST(StaleSyncPolicyLagTest, ZeroLagAdmitsExactlyGPerVersion) {
  constexpr int kG = 4;
  PolicyLagGate gate(/*max_policy_lag=*/0, kG);
  for (int64_t v = 0; v < 5; ++v) {
    SCOPED_TRACE(v);
    gate.OnVersion(v);
    EXPECT_EQ(gate.Admissible(), kG);
    int64_t behaviour = -1;
    for (int i = 0; i < kG; ++i) {
      ASSERT_TRUE(gate.TryAdmit(&behaviour));
      EXPECT_EQ(behaviour, v);
    }
    EXPECT_EQ(gate.Admissible(), 0);
    EXPECT_FALSE(gate.TryAdmit());
    EXPECT_EQ(gate.started(), (v + 1) * kG);
  }
}

TEST(StaleSyncPolicyLagTest, LagTwoAdmitsThreeStepsBeforeFirstVersion) {
  constexpr int kG = 8;
  PolicyLagGate gate(/*max_policy_lag=*/2, kG);
  EXPECT_EQ(gate.Admissible(), 3 * kG);
  EXPECT_EQ(AdmitAll(gate), 3 * kG);
  EXPECT_EQ(gate.started(), 3 * kG);
  EXPECT_EQ(gate.version(), 0);
}

TEST(StaleSyncPolicyLagTest, OnVersionReleasesExactlyGMore) {
  constexpr int kG = 5;
  PolicyLagGate gate(/*max_policy_lag=*/2, kG);
  EXPECT_EQ(AdmitAll(gate), 3 * kG);
  for (int64_t v = 1; v <= 4; ++v) {
    gate.OnVersion(v);
    EXPECT_EQ(gate.Admissible(), kG);
    EXPECT_EQ(AdmitAll(gate), kG);
  }
  // A jump by two versions releases 2G.
  gate.OnVersion(6);
  EXPECT_EQ(AdmitAll(gate), 2 * kG);
}

TEST(StaleSyncPolicyLagTest, OlderOrRepeatedVersionsAreIgnored) {
  constexpr int kG = 2;
  PolicyLagGate gate(/*max_policy_lag=*/1, kG);
  gate.OnVersion(3);
  EXPECT_EQ(gate.version(), 3);
  EXPECT_EQ(gate.Admissible(), 5 * kG);
  gate.OnVersion(2);  // late announcement: ignored
  gate.OnVersion(3);  // repeated: no-op
  gate.OnVersion(-1);
  EXPECT_EQ(gate.version(), 3);
  EXPECT_EQ(gate.Admissible(), 5 * kG);
}

TEST(StaleSyncPolicyLagTest, InitialVersionCountsFromTheResumePoint) {
  constexpr int kG = 3;
  PolicyLagGate gate(/*max_policy_lag=*/1, kG, /*initial_version=*/100);
  EXPECT_EQ(gate.version(), 100);
  int64_t behaviour = -1;
  ASSERT_TRUE(gate.TryAdmit(&behaviour));
  EXPECT_EQ(behaviour, 100);
  EXPECT_EQ(AdmitAll(gate), 2 * kG - 1);
  gate.OnVersion(101);
  EXPECT_EQ(AdmitAll(gate), kG);
}

TEST(StaleSyncPolicyLagTest, TrainableIsZeroToSStaleness) {
  PolicyLagGate gate(/*max_policy_lag=*/2, 4);
  EXPECT_TRUE(gate.Trainable(5, 5));
  EXPECT_TRUE(gate.Trainable(3, 5));
  EXPECT_FALSE(gate.Trainable(2, 5));
  EXPECT_FALSE(gate.Trainable(6, 5));  // newer than the trainer
  PolicyLagGate sync(/*max_policy_lag=*/0, 4);
  EXPECT_TRUE(sync.Trainable(7, 7));
  EXPECT_FALSE(sync.Trainable(6, 7));
}

TEST(StaleSyncPolicyLagTest, RecordDroppedFreesASlot) {
  constexpr int kG = 4;
  PolicyLagGate gate(/*max_policy_lag=*/0, kG);
  EXPECT_EQ(AdmitAll(gate), kG);
  gate.RecordDropped();
  gate.RecordDropped();
  EXPECT_EQ(gate.over_stale_dropped(), 2);
  EXPECT_EQ(gate.Admissible(), 2);
  EXPECT_EQ(AdmitAll(gate), 2);
  EXPECT_EQ(gate.started(), kG + 2);
  // More drops than started groups are ignored.
  PolicyLagGate empty(/*max_policy_lag=*/0, kG);
  empty.RecordDropped();
  EXPECT_EQ(empty.over_stale_dropped(), 0);
  EXPECT_EQ(empty.Admissible(), kG);
}

TEST(StaleSyncPolicyLagTest, WaitAdmitTimesOutNamingWhatItWaitsFor) {
  constexpr int kG = 8;
  PolicyLagGate gate(/*max_policy_lag=*/2, kG);
  gate.OnVersion(3);
  EXPECT_EQ(AdmitAll(gate), 6 * kG);
  const absl::Time start = absl::Now();
  absl::Status status = gate.WaitAdmit(RealClock(), absl::Now() + kShort);
  EXPECT_GE(absl::Now() - start, kShort - absl::Milliseconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(status.message(),
            "policy lag s=2: 48 groups started, version 3 allows 48; "
            "waiting for version 4");
  EXPECT_EQ(gate.started(), 6 * kG);  // nothing counted
  // A deadline already past returns at once.
  EXPECT_EQ(gate.WaitAdmit(RealClock(), absl::InfinitePast()).code(),
            absl::StatusCode::kDeadlineExceeded);
}

// A deadline is a time on the clock the caller passes: WaitAdmit on a
// FakeClock ignores real time (its deadline, in 1970, is long past in real
// time) and ends when the test moves the fake clock past the deadline.
TEST(StaleSyncPolicyLagTest, WaitAdmitDeadlineIsATimeOnTheGivenClock) {
  PolicyLagGate gate(/*max_policy_lag=*/0, /*groups_per_step=*/2);
  EXPECT_EQ(AdmitAll(gate), 2);
  FakeClock clock;
  CondVarWaitWatch watch(gate);
  Waiter rollout(
      [&] { return gate.WaitAdmit(clock, clock.Now() + absl::Hours(1)); });
  // Three waits: it read the fake clock again after a real-time poll.
  ASSERT_TRUE(watch.AwaitWaits(3, kLong)) << "WaitAdmit never blocked";
  EXPECT_FALSE(rollout.returned());
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(rollout.Join().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(gate.started(), 2);
}

// The rollout is blocked in WaitAdmit (the gate is full at version 0) when
// the trainer publishes version 1; the publication wakes it and admits it
// at version 1.
TEST(StaleSyncPolicyLagTest, WaitAdmitReturnsWhenAnotherThreadPublishes) {
  constexpr int kG = 2;
  PolicyLagGate gate(/*max_policy_lag=*/0, kG);
  EXPECT_EQ(AdmitAll(gate), kG);
  CondVarWaitWatch watch(gate);
  int64_t behaviour = -1;
  Waiter rollout([&] {
    return gate.WaitAdmit(RealClock(), absl::Now() + kLong, &behaviour);
  });
  ASSERT_TRUE(watch.AwaitWaits(1, kLong)) << "WaitAdmit never blocked";
  EXPECT_FALSE(rollout.returned());
  EXPECT_EQ(gate.started(), kG);
  gate.OnVersion(1);
  EXPECT_TRUE(rollout.Join().ok());
  EXPECT_EQ(behaviour, 1);
  EXPECT_EQ(gate.started(), kG + 1);
}

// The rollout is blocked in WaitAdmit (s = 1, two groups started) when the
// trainer gives one back; the freed slot admits it.
TEST(StaleSyncPolicyLagTest, WaitAdmitReturnsWhenAnotherThreadDrops) {
  PolicyLagGate gate(/*max_policy_lag=*/1, 1);
  EXPECT_EQ(AdmitAll(gate), 2);
  CondVarWaitWatch watch(gate);
  Waiter rollout(
      [&] { return gate.WaitAdmit(RealClock(), absl::Now() + kLong); });
  ASSERT_TRUE(watch.AwaitWaits(1, kLong)) << "WaitAdmit never blocked";
  EXPECT_FALSE(rollout.returned());
  gate.RecordDropped();
  EXPECT_TRUE(rollout.Join().ok());
  EXPECT_EQ(gate.started(), 3);
}

// Close() cancels a rollout that is blocked in WaitAdmit.
TEST(StaleSyncPolicyLagTest, CloseCancelsWaiters) {
  PolicyLagGate gate(/*max_policy_lag=*/0, 1);
  EXPECT_EQ(AdmitAll(gate), 1);
  CondVarWaitWatch watch(gate);
  Waiter rollout(
      [&] { return gate.WaitAdmit(RealClock(), absl::Now() + kLong); });
  ASSERT_TRUE(watch.AwaitWaits(1, kLong)) << "WaitAdmit never blocked";
  EXPECT_FALSE(rollout.returned());
  gate.Close();
  absl::Status status = rollout.Join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(gate.closed());
  gate.OnVersion(5);
  EXPECT_FALSE(gate.TryAdmit());
  EXPECT_EQ(gate.Admissible(), 0);
}

// Random interleavings of one rollout (admit, later finish, in admission
// order) and one trainer (take G finished groups FIFO, train, publish the
// next version). No trained group is ever more than s versions stale and
// the run always completes its steps.
TEST(StaleSyncPolicyLagTest, FifoTrainingNeverExceedsLagAndNeverDeadlocks) {
  constexpr int kRuns = 200;
  constexpr int64_t kSteps = 40;
  int64_t max_staleness_seen = 0;
  for (int run = 0; run < kRuns; ++run) {
    std::mt19937 rng(run);
    const int64_t s = std::uniform_int_distribution<int>(0, 4)(rng);
    const int g = std::uniform_int_distribution<int>(1, 6)(rng);
    SCOPED_TRACE(absl::StrCat("run ", run, " s=", s, " G=", g));
    PolicyLagGate gate(s, g);
    std::deque<int64_t> in_flight;  // admitted, rollout running (FIFO)
    std::deque<int64_t> finished;   // rollout done, waiting for the trainer
    int64_t version = 0;
    int64_t trained_groups = 0;
    while (version < kSteps) {
      const bool can_admit = gate.Admissible() > 0;
      const bool can_finish = !in_flight.empty();
      const bool can_train = static_cast<int>(finished.size()) >= g;
      ASSERT_TRUE(can_admit || can_finish || can_train)
          << "deadlock at version " << version << ": " << gate.DebugString();
      switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
        case 0:
          if (can_admit) {
            int64_t behaviour = -1;
            ASSERT_TRUE(gate.TryAdmit(&behaviour));
            ASSERT_EQ(behaviour, version);
            in_flight.push_back(behaviour);
          } else {
            ASSERT_FALSE(gate.TryAdmit());
          }
          break;
        case 1:
          if (can_finish) {
            finished.push_back(in_flight.front());
            in_flight.pop_front();
          }
          break;
        case 2:
          if (can_train) {
            for (int i = 0; i < g; ++i) {
              const int64_t staleness = version - finished.front();
              finished.pop_front();
              ASSERT_GE(staleness, 0);
              ASSERT_LE(staleness, s);
              ASSERT_TRUE(gate.Trainable(version - staleness, version));
              max_staleness_seen = std::max(max_staleness_seen, staleness);
              ++trained_groups;
            }
            gate.OnVersion(++version);
          }
          break;
      }
    }
    EXPECT_EQ(trained_groups, kSteps * g);
    EXPECT_EQ(gate.over_stale_dropped(), 0);
    // Never more than (s + 1) * G groups admitted and not yet trained.
    EXPECT_LE(gate.started() - trained_groups, (s + 1) * g);
  }
  // The bound is reached, not just respected.
  EXPECT_GE(max_staleness_seen, 2);
}

// Rollouts finish in random order (long tails), so the trainer checks
// Trainable() and drops over-stale groups. The run still always completes
// and every trained group is within the bound.
TEST(StaleSyncPolicyLagTest, OutOfOrderCompletionWithDropsNeverDeadlocks) {
  constexpr int kRuns = 200;
  constexpr int64_t kSteps = 30;
  int64_t total_dropped = 0;
  for (int run = 0; run < kRuns; ++run) {
    std::mt19937 rng(1000 + run);
    const int64_t s = std::uniform_int_distribution<int>(0, 3)(rng);
    const int g = std::uniform_int_distribution<int>(1, 5)(rng);
    SCOPED_TRACE(absl::StrCat("run ", run, " s=", s, " G=", g));
    PolicyLagGate gate(s, g);
    std::vector<int64_t> in_flight;
    std::deque<int64_t> finished;  // in completion order
    int64_t version = 0;
    int64_t trained_groups = 0;
    int64_t dropped = 0;
    while (version < kSteps) {
      // The trainer drops what became over-stale while waiting.
      for (auto it = finished.begin(); it != finished.end();) {
        if (gate.Trainable(*it, version)) {
          ++it;
        } else {
          it = finished.erase(it);
          gate.RecordDropped();
          ++dropped;
        }
      }
      const bool can_admit = gate.Admissible() > 0;
      const bool can_finish = !in_flight.empty();
      const bool can_train = static_cast<int>(finished.size()) >= g;
      ASSERT_TRUE(can_admit || can_finish || can_train)
          << "deadlock at version " << version << ": " << gate.DebugString();
      // Finishing is rarer than admitting, so groups linger in flight.
      const int action = std::uniform_int_distribution<int>(0, 5)(rng);
      if (action <= 2 && can_admit) {
        int64_t behaviour = -1;
        ASSERT_TRUE(gate.TryAdmit(&behaviour));
        in_flight.push_back(behaviour);
      } else if (action <= 4 && can_finish) {
        const size_t i =
            std::uniform_int_distribution<size_t>(0, in_flight.size() - 1)(rng);
        finished.push_back(in_flight[i]);
        in_flight.erase(in_flight.begin() + i);
      } else if (can_train) {
        for (int i = 0; i < g; ++i) {
          ASSERT_TRUE(gate.Trainable(finished.front(), version));
          finished.pop_front();
          ++trained_groups;
        }
        gate.OnVersion(++version);
      }
    }
    EXPECT_EQ(trained_groups, kSteps * g);
    EXPECT_EQ(gate.over_stale_dropped(), dropped);
    total_dropped += dropped;
  }
  // Out-of-order completion does produce over-stale groups.
  EXPECT_GT(total_dropped, 0);
}

// Real threads: one rollout thread blocks in WaitAdmit, one trainer thread
// takes G groups FIFO and publishes versions; Close() releases the rollout
// at the end.
TEST(StaleSyncPolicyLagTest, ThreadedProducerConsumerRespectsLag) {
  constexpr int64_t kS = 1;
  constexpr int kG = 3;
  constexpr int64_t kSteps = 50;
  PolicyLagGate gate(kS, kG);
  absl::Mutex mu;
  std::deque<int64_t> queue;  // behaviour versions, in admission order
  std::atomic<int64_t> max_staleness{0};
  std::atomic<bool> bad{false};

  std::thread rollout([&] {
    while (true) {
      int64_t behaviour = -1;
      absl::Status status =
          gate.WaitAdmit(RealClock(), absl::Now() + kLong, &behaviour);
      if (!status.ok()) {
        if (status.code() != absl::StatusCode::kCancelled) bad = true;
        return;
      }
      absl::MutexLock lock(&mu);
      queue.push_back(behaviour);
    }
  });
  std::thread trainer([&] {
    for (int64_t version = 0; version < kSteps; ++version) {
      std::vector<int64_t> batch;
      {
        absl::MutexLock lock(&mu);
        auto full = [&queue] { return static_cast<int>(queue.size()) >= kG; };
        if (!mu.AwaitWithTimeout(absl::Condition(&full), kLong)) {
          bad = true;
          return;
        }
        for (int i = 0; i < kG; ++i) {
          batch.push_back(queue.front());
          queue.pop_front();
        }
      }
      for (int64_t behaviour : batch) {
        const int64_t staleness = version - behaviour;
        if (staleness < 0 || staleness > kS) bad = true;
        if (staleness > max_staleness) max_staleness = staleness;
      }
      gate.OnVersion(version + 1);
    }
  });
  trainer.join();
  gate.Close();
  rollout.join();
  EXPECT_FALSE(bad);
  EXPECT_LE(max_staleness.load(), kS);
  EXPECT_LE(gate.started(), (kS + kSteps + 1) * kG);
  EXPECT_GE(gate.started(), kSteps * kG);
}

// ---------------------------------------------------------------------------
// ClockSkewGate

TEST(StaleSyncClockSkewTest, CreateValidates) {
  EXPECT_TRUE(ClockSkewGate::Create(0, {"sn-a"}).ok());
  struct Case {
    int64_t k;
    std::vector<std::string> names;
    int64_t initial;
    std::string message;
  };
  const std::vector<Case> cases = {
      {-1, {"a"}, 0, "max_clock_skew: must be >= 0, got -1"},
      {0, {"a"}, -2, "initial_clock: must be >= 0, got -2"},
      {0, {}, 0, "super_nodes: must not be empty"},
      {0, {"a", ""}, 0, "super_nodes[1]: must not be empty"},
      {0, {"a", "b", "a"}, 0, "super_nodes[2]: duplicate name 'a'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    absl::StatusOr<std::unique_ptr<ClockSkewGate>> gate =
        ClockSkewGate::Create(c.k, c.names, c.initial);
    ASSERT_FALSE(gate.ok());
    EXPECT_EQ(gate.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(gate.status().message(), c.message);
  }
}

TEST(StaleSyncClockSkewTest, ZeroSkewIsABarrier) {
  ClockSkewGate gate(/*max_clock_skew=*/0, {"sn-a", "sn-b", "sn-c"});
  EXPECT_TRUE(gate.MayStart("sn-a"));
  ASSERT_TRUE(gate.Advance("sn-a", 1).ok());
  EXPECT_FALSE(gate.MayStart("sn-a"));  // b and c still at 0
  ASSERT_TRUE(gate.Advance("sn-b", 1).ok());
  EXPECT_FALSE(gate.MayStart("sn-a"));
  EXPECT_FALSE(gate.MayStart("sn-b"));
  EXPECT_TRUE(gate.MayStart("sn-c"));
  ASSERT_TRUE(gate.Advance("sn-c", 1).ok());
  for (const char* name : {"sn-a", "sn-b", "sn-c"}) {
    EXPECT_TRUE(gate.MayStart(name)) << name;
    EXPECT_EQ(gate.Clock(name), 1);
  }
  EXPECT_EQ(gate.MaxSkewSeen(), 1);
}

TEST(StaleSyncClockSkewTest, SkewOneAllowsOneStepAheadNotTwo) {
  ClockSkewGate gate(/*max_clock_skew=*/1, {"sn-a", "sn-b"});
  ASSERT_TRUE(gate.Advance("sn-a", 1).ok());
  EXPECT_TRUE(gate.MayStart("sn-a"));  // 1 - 0 <= 1: may start step 2
  ASSERT_TRUE(gate.Advance("sn-a", 2).ok());
  EXPECT_FALSE(gate.MayStart("sn-a"));  // 2 - 0 > 1
  // Finishing a step it was not allowed to start is refused.
  absl::Status status = gate.Advance("sn-a", 3);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("slowest super node sn-b is at clock 0"));
  EXPECT_EQ(gate.Clock("sn-a"), 2);
  ASSERT_TRUE(gate.Advance("sn-b", 1).ok());
  EXPECT_TRUE(gate.MayStart("sn-a"));
  EXPECT_EQ(gate.MaxSkewSeen(), 2);
}

TEST(StaleSyncClockSkewTest, AdvanceErrorsNameTheNode) {
  ClockSkewGate gate(/*max_clock_skew=*/3, {"sn-a", "sn-b"});
  absl::Status status = gate.Advance("sn-x", 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("sn-x"));
  status = gate.Advance("sn-a", 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "super node sn-a is at clock 0; it may only advance to 1, got 2");
  EXPECT_FALSE(gate.Advance("sn-a", 0).ok());
  ASSERT_TRUE(gate.Advance("sn-a", 1).ok());
  gate.Remove("sn-a");
  status = gate.Advance("sn-a", 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("sn-a was removed at clock 1"));
  EXPECT_EQ(gate.Clock("sn-a"), 1);
  EXPECT_EQ(gate.Clock("sn-x"), -1);
  EXPECT_FALSE(gate.MayStart("sn-a"));
  EXPECT_FALSE(gate.MayStart("sn-x"));
}

TEST(StaleSyncClockSkewTest, RemoveUnblocks) {
  ClockSkewGate gate(/*max_clock_skew=*/0, {"sn-a", "sn-b", "sn-c"});
  ASSERT_TRUE(gate.Advance("sn-a", 1).ok());
  ASSERT_TRUE(gate.Advance("sn-b", 1).ok());
  EXPECT_FALSE(gate.MayStart("sn-a"));
  gate.Remove("sn-c");  // lost at clock 0
  EXPECT_TRUE(gate.MayStart("sn-a"));
  EXPECT_TRUE(gate.MayStart("sn-b"));
  EXPECT_THAT(gate.LiveNodes(), ElementsAre("sn-a", "sn-b"));
  EXPECT_EQ(gate.MinClock(), 1);
  gate.Remove("sn-c");  // repeated: ignored
  gate.Remove("sn-x");  // unknown: ignored
  // The last live node is never held back.
  gate.Remove("sn-b");
  ASSERT_TRUE(gate.Advance("sn-a", 2).ok());
  ASSERT_TRUE(gate.Advance("sn-a", 3).ok());
  EXPECT_TRUE(gate.MayStart("sn-a"));
}

TEST(StaleSyncClockSkewTest, RollBackSetsLiveClocksAndKeepsTheSkewSeen) {
  ClockSkewGate gate(/*max_clock_skew=*/1, {"a", "b", "c"});
  ASSERT_TRUE(gate.Advance("a", 1).ok());
  ASSERT_TRUE(gate.Advance("a", 2).ok());  // 1 ahead when it started
  EXPECT_FALSE(gate.MayStart("a"));
  ASSERT_TRUE(gate.Advance("b", 1).ok());
  gate.Remove("c");  // lost at clock 0
  EXPECT_EQ(gate.MaxSkewSeen(), 2);
  gate.RollBack(0);
  EXPECT_EQ(gate.Clock("a"), 0);
  EXPECT_EQ(gate.Clock("b"), 0);
  EXPECT_EQ(gate.Clock("c"), 0);
  EXPECT_EQ(gate.MaxSkewSeen(), 2);
  EXPECT_TRUE(gate.MayStart("a"));
  EXPECT_FALSE(gate.MayStart("c"));
  // The rule holds from the rolled-back clocks on.
  ASSERT_TRUE(gate.Advance("a", 1).ok());
  ASSERT_TRUE(gate.Advance("a", 2).ok());
  EXPECT_FALSE(gate.MayStart("a"));
  EXPECT_EQ(gate.Advance("a", 3).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StaleSyncClockSkewTest, WaitMayStartTimesOutNamingTheSlowNode) {
  ClockSkewGate gate(/*max_clock_skew=*/1, {"sn-a", "sn-b", "sn-c"});
  for (const char* name : {"sn-a", "sn-b", "sn-c"}) {
    ASSERT_TRUE(gate.Advance(name, 1).ok());
  }
  ASSERT_TRUE(gate.Advance("sn-a", 2).ok());
  ASSERT_TRUE(gate.Advance("sn-b", 2).ok());
  ASSERT_TRUE(gate.Advance("sn-a", 3).ok());  // 2 - 1 <= 1
  // a=3 b=2 c=1: a leads c by 2.
  absl::Status status =
      gate.WaitMayStart("sn-a", RealClock(), absl::Now() + kShort);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(status.message(),
            "super node sn-a at clock 3 may not start step 4: slowest super "
            "node sn-c is at clock 1 (max_clock_skew k=1)");
  EXPECT_EQ(gate.WaitMayStart("sn-x", RealClock(), absl::Now() + kShort).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      gate.WaitMayStart("sn-c", RealClock(), absl::InfinitePast()).ok());
}

TEST(StaleSyncClockSkewTest, WaitMayStartDeadlineIsATimeOnTheGivenClock) {
  ClockSkewGate gate(/*max_clock_skew=*/0, {"sn-a", "sn-b"});
  ASSERT_TRUE(gate.Advance("sn-a", 1).ok());  // a waits for b
  FakeClock clock;
  CondVarWaitWatch watch(gate);
  Waiter a([&] {
    return gate.WaitMayStart("sn-a", clock, clock.Now() + absl::Minutes(5));
  });
  ASSERT_TRUE(watch.AwaitWaits(3, kLong)) << "WaitMayStart never blocked";
  EXPECT_FALSE(a.returned());
  clock.Advance(absl::Minutes(5));
  absl::Status status = a.Join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
}

// k = 0. a, at clock 1, is blocked in WaitMayStart by b and c (at 0): b's
// Advance wakes it, and it waits again for c; c's Remove releases it. Then
// a, at clock 2, is blocked by b alone, and b's Advance releases it.
TEST(StaleSyncClockSkewTest, WaitMayStartWakesOnAdvanceAndOnRemove) {
  ClockSkewGate gate(/*max_clock_skew=*/0, {"sn-a", "sn-b", "sn-c"});
  ASSERT_TRUE(gate.Advance("sn-a", 1).ok());
  {
    CondVarWaitWatch watch(gate);
    Waiter a([&] {
      return gate.WaitMayStart("sn-a", RealClock(), absl::Now() + kLong);
    });
    ASSERT_TRUE(watch.AwaitWaits(1, kLong)) << "WaitMayStart never blocked";
    EXPECT_FALSE(a.returned());
    ASSERT_TRUE(gate.Advance("sn-b", 1).ok());
    // Woken by the Advance, a looks again and waits for c.
    ASSERT_TRUE(watch.AwaitWaits(2, kLong)) << "b's Advance did not wake a";
    EXPECT_FALSE(a.returned());
    EXPECT_FALSE(gate.MayStart("sn-a"));
    gate.Remove("sn-c");
    EXPECT_TRUE(a.Join().ok());
  }
  ASSERT_TRUE(gate.Advance("sn-a", 2).ok());
  {
    CondVarWaitWatch watch(gate);
    Waiter a([&] {
      return gate.WaitMayStart("sn-a", RealClock(), absl::Now() + kLong);
    });
    ASSERT_TRUE(watch.AwaitWaits(1, kLong)) << "WaitMayStart never blocked";
    EXPECT_FALSE(a.returned());
    ASSERT_TRUE(gate.Advance("sn-b", 2).ok());
    EXPECT_TRUE(a.Join().ok());
  }
  EXPECT_EQ(gate.Clock("sn-c"), 0);
}

// a is blocked in WaitMayStart by b when a itself is removed (lost): the
// wait fails, naming it.
TEST(StaleSyncClockSkewTest, WaitMayStartFailsWhenTheWaiterIsRemoved) {
  ClockSkewGate gate(/*max_clock_skew=*/0, {"sn-a", "sn-b"});
  ASSERT_TRUE(gate.Advance("sn-a", 1).ok());
  CondVarWaitWatch watch(gate);
  Waiter a([&] {
    return gate.WaitMayStart("sn-a", RealClock(), absl::Now() + kLong);
  });
  ASSERT_TRUE(watch.AwaitWaits(1, kLong)) << "WaitMayStart never blocked";
  EXPECT_FALSE(a.returned());
  gate.Remove("sn-a");
  absl::Status status = a.Join();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("sn-a was removed"));
}

// Deterministic simulation of random interleavings: at each step a random
// node that may start runs one step (sometimes a random node is lost, and
// sometimes a node tries to advance without permission). The skew never
// exceeds k + 1 and every live node reaches the target.
TEST(StaleSyncClockSkewTest, RandomInterleavingsKeepSkewWithinKPlusOne) {
  constexpr int kRuns = 200;
  constexpr int64_t kTarget = 30;
  int runs_at_bound = 0;
  for (int run = 0; run < kRuns; ++run) {
    std::mt19937 rng(run);
    const int64_t k = std::uniform_int_distribution<int>(0, 3)(rng);
    const int n = std::uniform_int_distribution<int>(1, 6)(rng);
    std::vector<std::string> names;
    for (int i = 0; i < n; ++i) names.push_back(absl::StrCat("sn-", i));
    SCOPED_TRACE(absl::StrCat("run ", run, " k=", k, " n=", n));
    ClockSkewGate gate(k, names);
    std::vector<bool> live(n, true);
    while (true) {
      std::vector<int> runnable;
      std::vector<int> blocked;
      bool all_done = true;
      for (int i = 0; i < n; ++i) {
        if (!live[i] || gate.Clock(names[i]) >= kTarget) continue;
        all_done = false;
        (gate.MayStart(names[i]) ? runnable : blocked).push_back(i);
      }
      if (all_done) break;
      ASSERT_FALSE(runnable.empty()) << "deadlock: " << gate.DebugString();
      const int dice = std::uniform_int_distribution<int>(0, 99)(rng);
      if (dice == 0 && n > 1) {
        const int i = std::uniform_int_distribution<int>(0, n - 1)(rng);
        gate.Remove(names[i]);
        live[i] = false;
      } else if (dice < 5 && !blocked.empty()) {
        const int i = blocked[std::uniform_int_distribution<size_t>(
            0, blocked.size() - 1)(rng)];
        const int64_t c = gate.Clock(names[i]);
        ASSERT_EQ(gate.Advance(names[i], c + 1).code(),
                  absl::StatusCode::kFailedPrecondition);
        ASSERT_EQ(gate.Clock(names[i]), c);
      } else {
        const int i = runnable[std::uniform_int_distribution<size_t>(
            0, runnable.size() - 1)(rng)];
        ASSERT_TRUE(gate.Advance(names[i], gate.Clock(names[i]) + 1).ok());
      }
      ASSERT_LE(gate.MaxSkewSeen(), k + 1);
    }
    for (int i = 0; i < n; ++i) {
      if (live[i]) {
        EXPECT_EQ(gate.Clock(names[i]), kTarget) << names[i];
      }
    }
    EXPECT_LE(gate.MaxSkewSeen(), k + 1);
    if (gate.MaxSkewSeen() == k + 1) ++runs_at_bound;
  }
  // The bound is reached, not just respected.
  EXPECT_GT(runs_at_bound, kRuns / 4);
}

// Real threads, one per super node, each looping WaitMayStart / Advance
// with random tiny pauses.
TEST(StaleSyncClockSkewTest, ThreadedNodesReachTargetWithinSkew) {
  for (int64_t k : {0, 1, 3}) {
    SCOPED_TRACE(k);
    constexpr int kNodes = 4;
    constexpr int64_t kTarget = 40;
    std::vector<std::string> names;
    for (int i = 0; i < kNodes; ++i) names.push_back(absl::StrCat("sn-", i));
    ClockSkewGate gate(k, names);
    std::atomic<bool> bad{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < kNodes; ++i) {
      threads.emplace_back([&, i] {
        std::mt19937 rng(i * 7 + k);
        for (int64_t c = 1; c <= kTarget; ++c) {
          if (!gate.WaitMayStart(names[i], RealClock(), absl::Now() + kLong)
                   .ok()) {
            bad = true;
            return;
          }
          if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) {
            absl::SleepFor(absl::Microseconds(
                std::uniform_int_distribution<int>(0, 300)(rng)));
          }
          if (!gate.Advance(names[i], c).ok()) {
            bad = true;
            return;
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_FALSE(bad);
    for (const std::string& name : names) EXPECT_EQ(gate.Clock(name), kTarget);
    EXPECT_LE(gate.MaxSkewSeen(), k + 1);
  }
}

}  // namespace
}  // namespace fusionrl

namespace fusionrl {
namespace {

// Lagged sampling with m steps sharing a version: each block of m steps
// (from the frame's start) samples from the version its last step is
// admitted at, so a step is s - m + 1 .. s versions old once the pipeline
// is full, never more than s, never a version its trainer has not
// published (staleness >= 0 at m = s + 1); m = 1 is the plain lagged rule.
TEST(StaleSyncRuleTest, LaggedSampleVersionSharesAVersionPerBlock) {
  for (int64_t v0 : {0, 7}) {
    for (int64_t s = 0; s <= 4; ++s) {
      for (int64_t m = 1; m <= s + 1; ++m) {
        SCOPED_TRACE(absl::StrCat("v0=", v0, " s=", s, " m=", m));
        for (int64_t i = 0; i < 40; ++i) {
          const int64_t v = LaggedSampleVersion(v0, i, s, m);
          const int64_t staleness = v0 + i - v;
          EXPECT_GE(v, std::max(v0, AdmitVersion(v0, i, s))) << i;
          EXPECT_LE(staleness, s) << i;
          if (m == 1) {
            EXPECT_EQ(v, std::max(v0, v0 + i - s)) << i;
          }
          // Past the pipeline's start the block's steps are exactly
          // s - m + 1 .. s old, in order.
          if (i >= s + m) {
            EXPECT_EQ(staleness, s - m + 1 + i % m) << i;
          }
          if (i % m != 0) {
            EXPECT_EQ(v, LaggedSampleVersion(v0, i - 1, s, m)) << i;
          }
        }
      }
    }
  }
  // Steps before the frame (negative index) belong to the block below.
  EXPECT_EQ(LaggedSampleVersion(10, -1, 2, 2), 10);
}

// The policy-lag rule, defined once (AdmitVersion / StepsAdmitted) for the
// gate and the fused rollout. Written against the literal rule, so that
// loosening it by one version in the shared definition fails here.
TEST(AdmissionRuleTest, StepIStartsAtVersionV0PlusIMinusSAndNotBefore) {
  for (int64_t s = 0; s <= 3; ++s) {
    for (int64_t v0 : {0, 7}) {
      for (int64_t i = 0; i <= 6; ++i) {
        EXPECT_EQ(AdmitVersion(v0, i, s), v0 + i - s);
        const int64_t at = std::max(v0, v0 + i - s);
        EXPECT_GT(StepsAdmitted(v0, at, s), i) << "s=" << s << " i=" << i;
        if (v0 + i - s - 1 >= v0) {
          EXPECT_LE(StepsAdmitted(v0, v0 + i - s - 1, s), i)
              << "step " << i << " admitted one version early, s=" << s;
        }
      }
    }
  }
}

TEST(AdmissionRuleTest, GateAdmitsExactlyTheGroupsOfTheAdmittedSteps) {
  constexpr int kGroups = 3;
  for (int64_t s = 0; s <= 2; ++s) {
    PolicyLagGate gate(s, kGroups, /*initial_version=*/2);
    int64_t admitted = 0;
    for (int64_t v = 2; v <= 5; ++v) {
      gate.OnVersion(v);
      while (gate.TryAdmit()) ++admitted;
      // Steps 0 .. v - v0 + s of the frame, G groups each; not one more.
      EXPECT_EQ(admitted, (v - 2 + s + 1) * kGroups) << "s=" << s << " v=" << v;
    }
  }
}

}  // namespace
}  // namespace fusionrl
