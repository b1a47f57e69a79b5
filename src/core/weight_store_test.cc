#include "core/weight_store.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "core/fake_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string Payload(int64_t version, size_t size = 100) {
  std::string s(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    s[i] = static_cast<char>(version * 31 + static_cast<int64_t>(i) * 7);
  }
  return s;
}

TEST(WeightStoreTest, GetsNewestAndExactVersions) {
  FakeClock clock;
  WeightStore store(clock, 3);
  ASSERT_TRUE(store.Put("job-1", 1, "sn-a", Payload(1)).ok());
  clock.Advance(absl::Seconds(5));
  ASSERT_TRUE(store.Put("job-1", 2, "sn-b", Payload(2, 50)).ok());

  absl::StatusOr<WeightVersion> newest = store.Get("job-1", 0);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->job_id, "job-1");
  EXPECT_EQ(newest->version, 2);
  EXPECT_EQ(newest->super_node, "sn-b");
  EXPECT_EQ(*newest->bytes, Payload(2, 50));
  EXPECT_EQ(newest->crc32c, Crc32c(Payload(2, 50)));
  EXPECT_EQ(newest->published, FakeClock::kStart + absl::Seconds(5));

  absl::StatusOr<WeightVersion> first = store.Get("job-1", 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->version, 1);
  EXPECT_EQ(first->super_node, "sn-a");
  EXPECT_EQ(*first->bytes, Payload(1));
  EXPECT_EQ(first->published, FakeClock::kStart);

  EXPECT_THAT(store.Versions("job-1"), ElementsAre(1, 2));
  EXPECT_EQ(store.total_bytes(), 150);
  EXPECT_THAT(store.Jobs(), ElementsAre("job-1"));
}

TEST(WeightStoreTest, JobsAreIndependent) {
  FakeClock clock;
  WeightStore store(clock, 2);
  ASSERT_TRUE(store.Put("job-1", 5, "sn-a", Payload(5)).ok());
  ASSERT_TRUE(store.Put("job-2", 1, "sn-a", Payload(1)).ok());
  EXPECT_EQ(store.Get("job-2", 0)->version, 1);
  EXPECT_EQ(store.Get("job-1", 0)->version, 5);
  EXPECT_THAT(store.Jobs(), ElementsAre("job-1", "job-2"));
}

// What the controller adds to a job's controller_tensor_bytes: the bytes
// of its versions stored and handed out, per job, kept after the job's
// versions are removed; idempotent re-publishes, refused puts and misses
// count nothing.
TEST(WeightStoreTest, CountsEachJobsBytesInAndOut) {
  FakeClock clock;
  WeightStore store(clock, 2);
  EXPECT_EQ(store.job_bytes("job-1"), 0);
  ASSERT_TRUE(store.Put("job-1", 1, "sn-a", Payload(1, 100)).ok());
  ASSERT_TRUE(store.Put("job-1", 2, "sn-a", Payload(2, 40)).ok());
  ASSERT_TRUE(store.Put("job-2", 1, "sn-a", Payload(1, 7)).ok());
  EXPECT_TRUE(store.Put("job-1", 1, "sn-a", Payload(1, 100)).ok());
  EXPECT_FALSE(store.Put("job-1", 1, "sn-a", Payload(3, 100)).ok());
  ASSERT_TRUE(store.Get("job-1", 0).ok());  // 40 out
  ASSERT_TRUE(store.Get("job-1", 1).ok());  // 100 out
  EXPECT_FALSE(store.Get("job-1", 9).ok());
  EXPECT_EQ(store.job_bytes("job-1"), 100 + 40 + 40 + 100);
  EXPECT_EQ(store.job_bytes("job-2"), 7);
  ASSERT_TRUE(store.RemoveJob("job-1").ok());
  EXPECT_EQ(store.job_bytes("job-1"), 280);
}

TEST(WeightStoreTest, RejectsVersionsThatAreNotNewer) {
  FakeClock clock;
  WeightStore store(clock, 3);
  ASSERT_TRUE(store.Put("job-1", 5, "sn-a", Payload(5)).ok());
  absl::Status older = store.Put("job-1", 3, "sn-a", Payload(3));
  EXPECT_EQ(older.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(older.message(),
            "job-1: version 3 is not newer than the newest stored version 5");
  // Gaps are fine; filling one later is not.
  ASSERT_TRUE(store.Put("job-1", 8, "sn-a", Payload(8)).ok());
  EXPECT_EQ(store.Put("job-1", 6, "sn-a", Payload(6)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.Versions("job-1"), ElementsAre(5, 8));
  EXPECT_EQ(store.stats().rejected_puts, 2);
}

TEST(WeightStoreTest, RejectsBadArguments) {
  FakeClock clock;
  WeightStore store(clock, 3);
  EXPECT_EQ(store.Put("job-1", 0, "sn-a", "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Put("job-1", -2, "sn-a", "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Put("", 1, "sn-a", "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Get("job-1", -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(store.Jobs(), IsEmpty());
}

TEST(WeightStoreTest, RepublishingIdenticalBytesIsIdempotent) {
  FakeClock clock;
  WeightStore store(clock, 3);
  ASSERT_TRUE(store.Put("job-1", 4, "sn-a", Payload(4)).ok());
  ASSERT_TRUE(store.Put("job-1", 5, "sn-a", Payload(5)).ok());
  clock.Advance(absl::Seconds(1));
  // The newest and an older kept version may both be retried.
  EXPECT_TRUE(store.Put("job-1", 5, "sn-a", Payload(5)).ok());
  EXPECT_TRUE(store.Put("job-1", 4, "sn-a", Payload(4)).ok());
  EXPECT_THAT(store.Versions("job-1"), ElementsAre(4, 5));
  EXPECT_EQ(store.Get("job-1", 5)->published, FakeClock::kStart);  // unchanged
  EXPECT_EQ(store.total_bytes(), 200);
  WeightStore::Stats stats = store.stats();
  EXPECT_EQ(stats.puts, 2);
  EXPECT_EQ(stats.duplicate_puts, 2);
  EXPECT_EQ(stats.bytes_in, 200);
}

TEST(WeightStoreTest, RepublishingDifferentBytesIsAlreadyExists) {
  FakeClock clock;
  WeightStore store(clock, 3);
  ASSERT_TRUE(store.Put("job-1", 5, "sn-a", Payload(5)).ok());
  absl::Status other_bytes = store.Put("job-1", 5, "sn-a", Payload(6));
  EXPECT_EQ(other_bytes.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(other_bytes.message(), HasSubstr("different bytes"));
  // Same size, one byte different: the CRC differs, still caught.
  std::string flipped = Payload(5);
  flipped[50] ^= 1;
  EXPECT_EQ(store.Put("job-1", 5, "sn-a", flipped).code(),
            absl::StatusCode::kAlreadyExists);
  absl::Status other_node = store.Put("job-1", 5, "sn-b", Payload(5));
  EXPECT_EQ(other_node.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(other_node.message(), HasSubstr("another super node"));
  EXPECT_EQ(*store.Get("job-1", 5)->bytes, Payload(5));
}

TEST(WeightStoreTest, ExpectedCrcMismatchIsDataLossAndStoresNothing) {
  FakeClock clock;
  WeightStore store(clock, 3);
  const std::string bytes = Payload(1);
  absl::Status status =
      store.Put("job-1", 1, "sn-a", bytes, Crc32c(bytes) ^ 0x1u);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("job-1 version 1: CRC-32C"));
  EXPECT_THAT(store.Versions("job-1"), IsEmpty());
  EXPECT_EQ(store.total_bytes(), 0);
  EXPECT_TRUE(store.Put("job-1", 1, "sn-a", bytes, Crc32c(bytes)).ok());
}

TEST(WeightStoreTest, EvictionKeepsTheNewestN) {
  FakeClock clock;
  WeightStore store(clock, 3);
  for (int64_t v = 1; v <= 6; ++v) {
    ASSERT_TRUE(store.Put("job-1", v, "sn-a", Payload(v, 10 * v)).ok());
  }
  EXPECT_THAT(store.Versions("job-1"), ElementsAre(4, 5, 6));
  EXPECT_EQ(store.total_bytes(), 40 + 50 + 60);
  EXPECT_EQ(store.stats().evictions, 3);
  // An evicted version cannot come back either.
  EXPECT_EQ(store.Put("job-1", 2, "sn-a", Payload(2, 20)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(WeightStoreTest, KeepOneHoldsOnlyTheNewest) {
  FakeClock clock;
  WeightStore store(clock, 1);
  ASSERT_TRUE(store.Put("job-1", 1, "sn-a", Payload(1)).ok());
  ASSERT_TRUE(store.Put("job-1", 2, "sn-a", Payload(2)).ok());
  EXPECT_THAT(store.Versions("job-1"), ElementsAre(2));
  EXPECT_EQ(store.total_bytes(), 100);
}

TEST(WeightStoreTest, NotFoundMessagesNameWhatIsKept) {
  FakeClock clock;
  WeightStore store(clock, 3);
  absl::StatusOr<WeightVersion> none = store.Get("job-9", 0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(none.status().message(), "job-9 has no weights");
  EXPECT_EQ(store.Get("job-9", 3).status().message(), "job-9 has no weights");

  for (int64_t v = 1; v <= 6; ++v) {
    ASSERT_TRUE(store.Put("job-1", v, "sn-a", Payload(v)).ok());
  }
  absl::StatusOr<WeightVersion> evicted = store.Get("job-1", 2);
  EXPECT_EQ(evicted.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(evicted.status().message(),
            "job-1 has no version 2; kept: 4, 5, 6");
  EXPECT_EQ(store.Get("job-1", 7).status().message(),
            "job-1 has no version 7; kept: 4, 5, 6");
  EXPECT_EQ(store.stats().misses, 4);
}

TEST(WeightStoreTest, RemoveJobForgetsItsVersions) {
  FakeClock clock;
  WeightStore store(clock, 3);
  ASSERT_TRUE(store.Put("job-1", 7, "sn-a", Payload(7)).ok());
  ASSERT_TRUE(store.Put("job-2", 1, "sn-a", Payload(1, 30)).ok());
  absl::StatusOr<WeightVersion> held = store.Get("job-1", 7);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(store.RemoveJob("job-1").ok());
  EXPECT_EQ(store.RemoveJob("job-1").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get("job-1", 0).status().message(), "job-1 has no weights");
  EXPECT_EQ(store.total_bytes(), 30);
  EXPECT_EQ(*held->bytes, Payload(7));
  // A removed job starts afresh.
  EXPECT_TRUE(store.Put("job-1", 1, "sn-a", Payload(1)).ok());
}

TEST(WeightStoreTest, EvictedBytesStayAliveForAReader) {
  FakeClock clock;
  WeightStore store(clock, 1);
  ASSERT_TRUE(store.Put("job-1", 1, "sn-a", Payload(1, 4096)).ok());
  absl::StatusOr<WeightVersion> reader = store.Get("job-1", 1);
  ASSERT_TRUE(reader.ok());
  std::weak_ptr<const std::string> watch = reader->bytes;
  ASSERT_TRUE(store.Put("job-1", 2, "sn-a", Payload(2, 4096)).ok());
  EXPECT_THAT(store.Versions("job-1"), ElementsAre(2));
  ASSERT_FALSE(watch.expired());
  EXPECT_EQ(*reader->bytes, Payload(1, 4096));
  EXPECT_EQ(Crc32c(*reader->bytes), reader->crc32c);
  reader = absl::NotFoundError("dropped");  // the last holder lets go
  EXPECT_TRUE(watch.expired());
}

TEST(WeightStoreTest, CountsBytesInAndOut) {
  FakeClock clock;
  WeightStore store(clock, 2);
  ASSERT_TRUE(store.Put("job-1", 1, "sn-a", Payload(1, 10)).ok());
  ASSERT_TRUE(store.Put("job-1", 2, "sn-a", Payload(2, 20)).ok());
  ASSERT_TRUE(store.Get("job-1", 0).ok());
  ASSERT_TRUE(store.Get("job-1", 1).ok());
  WeightStore::Stats stats = store.stats();
  EXPECT_EQ(stats.puts, 2);
  EXPECT_EQ(stats.gets, 2);
  EXPECT_EQ(stats.bytes_in, 30);
  EXPECT_EQ(stats.bytes_out, 30);
}

TEST(WeightStoreTest, DebugStringHasOneLinePerJob) {
  FakeClock clock;
  WeightStore store(clock, 2);
  EXPECT_EQ(store.DebugString(), "");
  ASSERT_TRUE(store.Put("job-1", 1, "sn-a", "abc").ok());
  ASSERT_TRUE(store.Put("job-1", 2, "sn-b", "123456789").ok());
  ASSERT_TRUE(store.Put("job-2", 1, "sn-a", "").ok());
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(store.DebugString(),
            "job-1 kept=1,2 newest=2 super_node=sn-b bytes=12 "
            "crc32c=0xe3069283 age=1.5s\n"
            "job-2 kept=1 newest=1 super_node=sn-a bytes=0 "
            "crc32c=0x00000000 age=1.5s\n");
}

// Writers publish increasing versions of their own job while readers fetch
// the newest and check every payload they get against its CRC. (The locking
// itself is checked by clang's -Wthread-safety; TSan cannot see through the
// uninstrumented system Abseil's Mutex.)
TEST(WeightStoreTest, ConcurrentPutsAndGetsStayConsistent) {
  FakeClock clock;
  WeightStore store(clock, 3);
  constexpr int kJobs = 3;
  constexpr int64_t kVersions = 200;
  constexpr int kReaders = 3;
  std::atomic<bool> done{false};
  std::atomic<int> readers_started{0};
  std::atomic<int> readers_reading{0};  // readers past their first read
  std::atomic<int64_t> reads{0};
  std::atomic<int64_t> bad{0};
  std::vector<std::thread> threads;
  for (int j = 0; j < kJobs; ++j) {
    threads.emplace_back([&, j] {
      // Start writing only once every reader runs, so they overlap.
      while (readers_started.load() < kReaders) std::this_thread::yield();
      const std::string job = absl::StrCat("job-", j);
      for (int64_t v = 1; v <= kVersions; ++v) {
        absl::Status s = store.Put(job, v, "sn-a", Payload(v, 64 + v));
        if (!s.ok()) ADD_FAILURE() << s;
        // The rest is written while every reader reads, however the
        // threads are scheduled (a loaded machine once ran the writers to
        // the end before any reader got a version).
        while (v == 1 && readers_reading.load() < kReaders) {
          std::this_thread::yield();
        }
      }
    });
  }
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&, r] {
      readers_started.fetch_add(1);
      const std::string job = absl::StrCat("job-", r % kJobs);
      int64_t last_seen = 0;
      while (!done.load()) {
        absl::StatusOr<WeightVersion> got = store.Get(job, 0);
        if (!got.ok()) continue;  // nothing published yet
        reads.fetch_add(1);
        if (last_seen == 0) readers_reading.fetch_add(1);  // the first read
        if (got->version < last_seen ||
            *got->bytes != Payload(got->version, 64 + got->version) ||
            Crc32c(*got->bytes) != got->crc32c) {
          bad.fetch_add(1);
        }
        last_seen = got->version;
        store.Versions(job);
        store.total_bytes();
      }
    });
  }
  for (int j = 0; j < kJobs; ++j) threads[j].join();
  done.store(true);
  for (size_t i = kJobs; i < threads.size(); ++i) threads[i].join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(reads.load(), 0);
  for (int j = 0; j < kJobs; ++j) {
    EXPECT_THAT(store.Versions(absl::StrCat("job-", j)),
                ElementsAre(kVersions - 2, kVersions - 1, kVersions));
  }
  int64_t expected_bytes = 0;
  for (int64_t v = kVersions - 2; v <= kVersions; ++v) expected_bytes += 64 + v;
  EXPECT_EQ(store.total_bytes(), kJobs * expected_bytes);
  EXPECT_EQ(store.stats().puts, kJobs * kVersions);
}

// Racing publishers of the same version: exactly one stores it, the others
// get OK (identical bytes) or AlreadyExists (different bytes).
TEST(WeightStoreTest, RacingPublishersOfOneVersionAgree) {
  FakeClock clock;
  WeightStore store(clock, 3);
  constexpr int kThreads = 6;
  std::atomic<int> ok{0};
  std::atomic<int> exists{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half offer payload A, half payload B.
      absl::Status s =
          store.Put("job-1", 1, "sn-a", Payload(t % 2 == 0 ? 1 : 2));
      if (s.ok()) ok.fetch_add(1);
      if (s.code() == absl::StatusCode::kAlreadyExists) exists.fetch_add(1);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), kThreads / 2);
  EXPECT_EQ(exists.load(), kThreads / 2);
  EXPECT_EQ(store.stats().puts, 1);
}

}  // namespace
}  // namespace fusionrl
