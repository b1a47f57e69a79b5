#include "controller/rendezvous_store.h"

#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "core/fake_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;

TEST(RendezvousStoreTest, SetGetAddCheckDeleteWithStoreSemantics) {
  FakeClock clock;
  RendezvousStore store(clock);
  const absl::Time now = clock.Now();
  ASSERT_TRUE(store.Set("job-1/1", "addr/0", "10.0.0.1:4000").ok());
  EXPECT_EQ(*store.Get("job-1/1", "addr/0", now), "10.0.0.1:4000");
  // Scopes are separate: the same key of another generation is not there.
  EXPECT_EQ(store.Get("job-1/2", "addr/0", now).status().code(),
            absl::StatusCode::kDeadlineExceeded);

  EXPECT_EQ(*store.Add("job-1/1", "arrived", 1), 1);
  EXPECT_EQ(*store.Add("job-1/1", "arrived", 2), 3);
  EXPECT_EQ(*store.Get("job-1/1", "arrived", now), "3");  // decimal text
  EXPECT_EQ(store.Add("job-1/1", "addr/0", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);

  EXPECT_TRUE(*store.Check("job-1/1", {"addr/0", "arrived"}));
  EXPECT_FALSE(*store.Check("job-1/1", {"addr/0", "addr/1"}));
  EXPECT_EQ(store.NumKeys("job-1/1"), 2);
  EXPECT_TRUE(*store.Delete("job-1/1", "arrived"));
  EXPECT_FALSE(*store.Delete("job-1/1", "arrived"));
  EXPECT_EQ(store.NumKeys("job-1/1"), 1);
}

TEST(RendezvousStoreTest, CompareSetFollowsTcpStore) {
  FakeClock clock;
  RendezvousStore store(clock);
  // Absent and expected empty: stored.
  EXPECT_EQ(*store.CompareSet("j/1", "k", "", "a"), "a");
  // Mismatch: the current value comes back, nothing changes.
  EXPECT_EQ(*store.CompareSet("j/1", "k", "x", "b"), "a");
  // Match: replaced.
  EXPECT_EQ(*store.CompareSet("j/1", "k", "a", "b"), "b");
  // Absent and expected not empty: `expected` comes back, nothing stored.
  EXPECT_EQ(*store.CompareSet("j/1", "other", "x", "y"), "x");
  EXPECT_FALSE(*store.Check("j/1", {"other"}));
}

TEST(RendezvousStoreTest, GetWaitsForTheKeyAndEndsAtTheDeadline) {
  FakeClock clock;
  RendezvousStore store(clock);
  const absl::Time deadline = clock.Now() + absl::Seconds(30);
  absl::StatusOr<std::string> got;
  std::thread reader([&] { got = store.Get("job-1/1", "addr/1", deadline); });
  ASSERT_TRUE(store.Set("job-1/1", "addr/1", "peer").ok());
  reader.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "peer");

  // Nobody sets it: the wait ends when the clock passes the deadline, and
  // the error names the key.
  absl::Status waited;
  const absl::Time soon = clock.Now() + absl::Seconds(5);
  std::thread waiter([&] { waited = store.Wait("job-1/1", {"addr/2"}, soon); });
  clock.Advance(absl::Seconds(6));
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(waited.message(), HasSubstr("addr/2"));
}

TEST(RendezvousStoreTest, ClosingAGenerationAbortsItsWaitersAndItsCalls) {
  FakeClock clock;
  RendezvousStore store(clock);
  ASSERT_TRUE(store.Set("job-1/1", "addr/0", "a").ok());
  absl::Status waited;
  absl::Notification started;
  std::thread waiter([&] {
    started.Notify();
    // A deadline far away: only the close can end this wait.
    waited = store.Wait("job-1/1", {"addr/1"}, clock.Now() + absl::Hours(1));
  });
  started.WaitForNotification();
  store.CloseScope("job-1/1");
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(waited.message(), HasSubstr("job-1/1"));
  // The keys are gone and every later call is refused the same way.
  EXPECT_EQ(store.NumKeys("job-1/1"), 0);
  EXPECT_EQ(store.Set("job-1/1", "addr/1", "b").code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(store.Check("job-1/1", {"addr/0"}).status().code(),
            absl::StatusCode::kAborted);
  // The next generation is open; a generation closed before anyone used it
  // is refused too.
  EXPECT_TRUE(store.Set("job-1/2", "addr/0", "a").ok());
  store.CloseScope("job-1/3");
  EXPECT_EQ(store.Add("job-1/3", "n", 1).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(store.open_scopes(), 1);
}

TEST(RendezvousStoreTest, ForgetsTheOldestTombstonesPastTheLimit) {
  FakeClock clock;
  RendezvousStore store(clock);
  for (size_t g = 0; g <= RendezvousStore::kMaxClosedScopes; ++g) {
    store.CloseScope("job-1/" + std::to_string(g));
  }
  // Generation 0 was forgotten (the controller never hands it out again);
  // generation 1 is still a tombstone.
  EXPECT_TRUE(store.Set("job-1/0", "k", "v").ok());
  EXPECT_EQ(store.Set("job-1/1", "k", "v").code(), absl::StatusCode::kAborted);
}

TEST(RendezvousStoreTest, RefusesOversizedKeysAndValues) {
  FakeClock clock;
  RendezvousStore store(clock);
  EXPECT_EQ(store.Set("j/1", "", "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set("", "k", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      store.Set("j/1", std::string(RendezvousStore::kMaxKeyBytes + 1, 'k'), "v")
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store
                .Set("j/1", "k",
                     std::string(RendezvousStore::kMaxValueBytes + 1, 'v'))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.NumKeys("j/1"), 0);
}

}  // namespace
}  // namespace fusionrl
