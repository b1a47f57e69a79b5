#include "core/node_registry.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/fake_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

constexpr absl::Duration kTimeout = absl::Seconds(10);

NodeSpec MakeSpec(const std::string& super_node = "sn-a", int num_cards = 2) {
  NodeSpec spec;
  spec.host = "10.0.0.1";
  spec.super_node = super_node;
  spec.host_memory_bytes = int64_t{64} << 30;
  for (int i = 0; i < num_cards; ++i) {
    spec.cards.push_back({i, absl::StrCat("cuda:", i), int64_t{80} << 30});
  }
  return spec;
}

std::string MustRegister(NodeRegistry& registry,
                         const NodeSpec& spec = MakeSpec()) {
  absl::StatusOr<std::string> id = registry.Register(spec);
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? *id : "";
}

std::vector<std::string> Ids(const std::vector<NodeView>& views) {
  std::vector<std::string> ids;
  for (const NodeView& v : views) ids.push_back(v.id);
  return ids;
}

TEST(NodeRegistryTest, RegisterReturnsSequentialIdsAndStoresSpec) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  EXPECT_EQ(MustRegister(registry), "node-1");
  clock.Advance(absl::Seconds(1));
  NodeSpec spec = MakeSpec("sn-b", 3);
  spec.host = "worker-7";
  EXPECT_EQ(MustRegister(registry, spec), "node-2");

  std::optional<NodeView> view = registry.Get("node-2");
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->id, "node-2");
  EXPECT_EQ(view->spec.host, "worker-7");
  EXPECT_EQ(view->spec.super_node, "sn-b");
  ASSERT_EQ(view->spec.cards.size(), 3u);
  EXPECT_EQ(view->spec.cards[2].device, "cuda:2");
  EXPECT_EQ(view->spec.cards[2].memory_bytes, int64_t{80} << 30);
  EXPECT_EQ(view->spec.host_memory_bytes, int64_t{64} << 30);
  EXPECT_EQ(view->state, NodeState::kAlive);
  EXPECT_EQ(view->registered, FakeClock::kStart + absl::Seconds(1));
  EXPECT_EQ(view->last_heartbeat, view->registered);
  EXPECT_EQ(view->heartbeat_age, absl::ZeroDuration());
  EXPECT_EQ(view->heartbeats, 0u);
  EXPECT_EQ(registry.alive_count(), 2);
}

TEST(NodeRegistryTest, RegisterRejectsEachBadField) {
  struct Case {
    std::function<void(NodeSpec&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](NodeSpec& s) { s.host = ""; }, "host: must not be empty"},
      {[](NodeSpec& s) { s.super_node = ""; }, "super_node: must not be empty"},
      {[](NodeSpec& s) { s.super_node = "sn a"; },
       "super_node: must match [A-Za-z0-9._-]{1,64}, got 'sn a'"},
      {[](NodeSpec& s) { s.super_node = "sn/a"; },
       "super_node: must match [A-Za-z0-9._-]{1,64}, got 'sn/a'"},
      {[](NodeSpec& s) { s.super_node = std::string(65, 'x'); },
       "super_node: must match [A-Za-z0-9._-]{1,64}"},
      {[](NodeSpec& s) { s.host_memory_bytes = -1; },
       "host_memory_bytes: must be >= 0, got -1"},
      {[](NodeSpec& s) { s.cards.clear(); },
       "cards: must list 1..1024 cards, got 0"},
      {[](NodeSpec& s) {
         s.cards.clear();
         for (int i = 0; i < 1025; ++i) s.cards.push_back({i, "cpu", 0});
       },
       "cards: must list 1..1024 cards, got 1025"},
      {[](NodeSpec& s) { s.cards[1].index = 0; },
       "cards[1].index: duplicate card index 0"},
      {[](NodeSpec& s) { s.cards[0].index = -1; },
       "cards[0].index: must be >= 0, got -1"},
      {[](NodeSpec& s) { s.cards[1].device = ""; },
       "cards[1].device: must not be empty"},
      {[](NodeSpec& s) { s.cards[0].memory_bytes = -5; },
       "cards[0].memory_bytes: must be >= 0, got -5"},
  };
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    NodeSpec spec = MakeSpec();
    c.mutate(spec);
    absl::StatusOr<std::string> id = registry.Register(spec);
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(id.status().message()), StartsWith(c.message));
  }
  // Nothing was added and no id was spent.
  EXPECT_THAT(registry.List(), IsEmpty());
  EXPECT_EQ(MustRegister(registry), "node-1");
}

TEST(NodeRegistryTest, RegisterAcceptsEdgeValues) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  NodeSpec spec;
  spec.host = "h";
  spec.super_node = std::string(63, 'a') + "Z";  // 64 chars
  spec.cards = {{7, "cpu", 0}, {0, "cpu", 0}};   // any order, gaps allowed
  EXPECT_TRUE(registry.Register(spec).ok());
  spec.super_node = "A-z_0.9";
  spec.cards.clear();
  for (int i = 0; i < 1024; ++i) spec.cards.push_back({i, "cpu", 0});
  EXPECT_TRUE(registry.Register(spec).ok());
}

TEST(NodeRegistryTest, IdsAreNeverReused) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  const std::string a = MustRegister(registry);
  const std::string b = MustRegister(registry);
  ASSERT_TRUE(registry.Deregister(b).ok());
  EXPECT_EQ(MustRegister(registry), "node-3");
  clock.Advance(kTimeout + absl::Seconds(1));
  EXPECT_THAT(registry.SweepLost(), ElementsAre(a, "node-3"));
  ASSERT_TRUE(registry.Deregister(a).ok());
  EXPECT_EQ(MustRegister(registry), "node-4");
}

TEST(NodeRegistryTest, HeartbeatsKeepANodeAliveAcrossManySweeps) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  const std::string id = MustRegister(registry);
  for (int i = 0; i < 100; ++i) {
    clock.Advance(kTimeout);  // exactly at the limit every time
    ASSERT_THAT(registry.SweepLost(), IsEmpty()) << "round " << i;
    ASSERT_TRUE(registry.Heartbeat(id).ok());
  }
  std::optional<NodeView> view = registry.Get(id);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->state, NodeState::kAlive);
  EXPECT_EQ(view->heartbeats, 100u);
  EXPECT_EQ(view->last_heartbeat, FakeClock::kStart + 100 * kTimeout);
}

TEST(NodeRegistryTest, NodeIsLostStrictlyAfterTheTimeout) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  const std::string id = MustRegister(registry);
  clock.Advance(absl::Seconds(3));
  ASSERT_TRUE(registry.Heartbeat(id).ok());

  clock.Advance(kTimeout);  // exactly the timeout since the heartbeat
  EXPECT_THAT(registry.SweepLost(), IsEmpty());
  EXPECT_EQ(registry.Get(id)->state, NodeState::kAlive);
  EXPECT_EQ(registry.alive_count(), 1);

  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(registry.SweepLost(), ElementsAre(id));
  std::optional<NodeView> view = registry.Get(id);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->state, NodeState::kLost);
  EXPECT_EQ(view->lost_at, clock.Now());
  EXPECT_EQ(view->heartbeat_age, kTimeout + absl::Milliseconds(1));
  EXPECT_EQ(registry.alive_count(), 0);
}

TEST(NodeRegistryTest, LateHeartbeatBeforeTheSweepIsAccepted) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  const std::string id = MustRegister(registry);
  clock.Advance(kTimeout * 3);
  EXPECT_TRUE(registry.Heartbeat(id).ok());
  EXPECT_THAT(registry.SweepLost(), IsEmpty());
}

TEST(NodeRegistryTest, HeartbeatFromLostNodeIsFailedPrecondition) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  const std::string id = MustRegister(registry);
  clock.Advance(absl::Seconds(11));
  ASSERT_THAT(registry.SweepLost(), ElementsAre(id));
  clock.Advance(absl::Seconds(5));

  absl::Status status = registry.Heartbeat(id);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(status.message());
  EXPECT_THAT(message, StartsWith("node-1 was declared lost at "));
  EXPECT_THAT(message, HasSubstr("1970-01-12T13:46:51"));  // kStart + 11s
  EXPECT_THAT(message, HasSubstr("no heartbeat for 11s, timeout 10s"));
  EXPECT_THAT(message, HasSubstr("; register again"));
  // It stays lost, and the heartbeat was not counted.
  EXPECT_EQ(registry.Get(id)->state, NodeState::kLost);
  EXPECT_EQ(registry.Get(id)->heartbeats, 0u);
  // Registering again gives a new id.
  EXPECT_EQ(MustRegister(registry), "node-2");
  EXPECT_EQ(registry.alive_count(), 1);
}

TEST(NodeRegistryTest, UnknownIdsAreNotFound) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  MustRegister(registry);
  for (const char* id : {"node-2", "node-0", "node-01", "node-", "", "1",
                         "node-1x", "node-99999999999999999999999"}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(registry.Heartbeat(id).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(registry.Deregister(id).code(), absl::StatusCode::kNotFound);
    EXPECT_FALSE(registry.Get(id).has_value());
  }
  EXPECT_THAT(std::string(registry.Heartbeat("node-7").message()),
              HasSubstr("unknown node id 'node-7'"));
  EXPECT_EQ(registry.alive_count(), 1);
}

TEST(NodeRegistryTest, DeregisterForgetsTheNode) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  const std::string a = MustRegister(registry);
  const std::string b = MustRegister(registry);
  ASSERT_TRUE(registry.Deregister(a).ok());
  EXPECT_FALSE(registry.Get(a).has_value());
  EXPECT_EQ(registry.Heartbeat(a).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Deregister(a).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.alive_count(), 1);
  EXPECT_THAT(Ids(registry.List()), ElementsAre(b));

  // A lost node can be forgotten too; the alive count is not touched twice.
  clock.Advance(kTimeout + absl::Seconds(1));
  ASSERT_THAT(registry.SweepLost(), ElementsAre(b));
  EXPECT_EQ(registry.alive_count(), 0);
  ASSERT_TRUE(registry.Deregister(b).ok());
  EXPECT_EQ(registry.alive_count(), 0);
  EXPECT_THAT(registry.List(), IsEmpty());
  // A deregistered node is never reported lost.
  clock.Advance(kTimeout * 5);
  EXPECT_THAT(registry.SweepLost(), IsEmpty());
}

TEST(NodeRegistryTest, ListIsInIdOrderWithAges) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  std::vector<std::string> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(MustRegister(registry));
  clock.Advance(absl::Seconds(4));
  ASSERT_TRUE(registry.Heartbeat("node-10").ok());
  clock.Advance(absl::Seconds(2));
  ASSERT_TRUE(registry.Heartbeat("node-2").ok());
  clock.Advance(absl::Milliseconds(500));

  const std::vector<NodeView> views = registry.List();
  // node-10 sorts after node-9, not after node-1.
  EXPECT_EQ(Ids(views), ids);
  ASSERT_EQ(views.size(), 12u);
  EXPECT_EQ(views[0].heartbeat_age, absl::Milliseconds(6500));
  EXPECT_EQ(views[1].heartbeat_age, absl::Milliseconds(500));
  EXPECT_EQ(views[9].heartbeat_age, absl::Milliseconds(2500));
  EXPECT_EQ(views[9].heartbeats, 1u);
  EXPECT_EQ(views[11].heartbeat_age, absl::Milliseconds(6500));
  for (const NodeView& v : views) {
    EXPECT_EQ(v.registered, FakeClock::kStart);
    EXPECT_EQ(v.state, NodeState::kAlive);
  }
}

TEST(NodeRegistryTest, SweepLostReturnsEachLostNodeOnce) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  const std::string a = MustRegister(registry);
  clock.Advance(absl::Seconds(5));
  const std::string b = MustRegister(registry);
  const std::string c = MustRegister(registry);
  clock.Advance(absl::Seconds(6));  // a: 11s, b and c: 6s
  ASSERT_TRUE(registry.Heartbeat(c).ok());
  EXPECT_THAT(registry.SweepLost(), ElementsAre(a));
  EXPECT_THAT(registry.SweepLost(), IsEmpty());
  clock.Advance(absl::Seconds(5));  // b: 11s, c: 5s
  EXPECT_THAT(registry.SweepLost(), ElementsAre(b));
  clock.Advance(absl::Seconds(6));  // c: 11s
  EXPECT_THAT(registry.SweepLost(), ElementsAre(c));
  clock.Advance(absl::Hours(1));
  EXPECT_THAT(registry.SweepLost(), IsEmpty());
  EXPECT_EQ(registry.alive_count(), 0);
  EXPECT_EQ(registry.List().size(), 3u);  // lost nodes stay listed
}

TEST(NodeRegistryTest, SweepLostReturnsIdsInIdOrder) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  std::vector<std::string> ids;
  for (int i = 0; i < 11; ++i) ids.push_back(MustRegister(registry));
  clock.Advance(kTimeout + absl::Milliseconds(1));
  EXPECT_EQ(registry.SweepLost(), ids);
}

TEST(NodeRegistryTest, ConcurrentHeartbeatsAreAllCounted) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  constexpr int kThreads = 4;
  constexpr int kBeats = 500;
  std::vector<std::string> ids;
  for (int i = 0; i < kThreads; ++i) ids.push_back(MustRegister(registry));

  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kBeats; ++i) {
        // Every thread beats for every node, and reads and sweeps too.
        if (!registry.Heartbeat(ids[(t + i) % kThreads]).ok()) ++failures;
        if (i % 50 == 0) {
          registry.List();
          registry.SweepLost();
          registry.DebugString();
          clock.Advance(absl::Milliseconds(1));
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  EXPECT_EQ(failures.load(), 0);
  uint64_t total = 0;
  for (const NodeView& v : registry.List()) {
    EXPECT_EQ(v.state, NodeState::kAlive);
    EXPECT_EQ(v.heartbeats, static_cast<uint64_t>(kBeats));
    total += v.heartbeats;
  }
  EXPECT_EQ(total, static_cast<uint64_t>(kThreads * kBeats));
}

TEST(NodeRegistryTest, ConcurrentRegistrationsGetDistinctIds) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  constexpr int kThreads = 4;
  constexpr int kEach = 50;
  std::vector<std::vector<std::string>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        absl::StatusOr<std::string> id = registry.Register(MakeSpec());
        if (id.ok()) got[t].push_back(*id);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<std::string> all;
  for (const auto& ids : got) all.insert(all.end(), ids.begin(), ids.end());
  std::sort(all.begin(), all.end(),
            [](const std::string& a, const std::string& b) {
              return NodeIdLess(a, b);
            });
  ASSERT_EQ(all.size(), static_cast<size_t>(kThreads * kEach));
  for (int i = 0; i < kThreads * kEach; ++i) {
    EXPECT_EQ(all[i], absl::StrCat("node-", i + 1));
  }
  EXPECT_EQ(registry.alive_count(), kThreads * kEach);
}

TEST(NodeRegistryTest, NodeIdLessOrdersByNumber) {
  EXPECT_TRUE(NodeIdLess("node-2", "node-10"));
  EXPECT_FALSE(NodeIdLess("node-10", "node-2"));
  EXPECT_FALSE(NodeIdLess("node-3", "node-3"));
  EXPECT_TRUE(NodeIdLess("node-99", "a"));  // registry ids first
  EXPECT_FALSE(NodeIdLess("a", "node-1"));
  EXPECT_TRUE(NodeIdLess("a", "b"));
}

TEST(NodeRegistryTest, DebugStringHasOneLinePerNode) {
  FakeClock clock;
  NodeRegistry registry(clock, kTimeout);
  EXPECT_EQ(registry.DebugString(), "");
  MustRegister(registry, MakeSpec("sn-a", 2));
  clock.Advance(absl::Seconds(11));
  registry.SweepLost();
  MustRegister(registry, MakeSpec("sn-b", 8));
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(registry.DebugString(),
            "node-1 lost host=10.0.0.1 super_node=sn-a cards=2 "
            "heartbeat_age=12.5s heartbeats=0\n"
            "node-2 alive host=10.0.0.1 super_node=sn-b cards=8 "
            "heartbeat_age=1.5s heartbeats=0\n");
}

TEST(FakeClockTest, StartsAtAFixedTimeAndMovesByHand) {
  FakeClock clock;
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1'000'000));
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now(), absl::FromUnixMillis(1'000'001'500));
  clock.Set(absl::FromUnixSeconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(5));
  const Clock& as_clock = clock;
  EXPECT_EQ(as_clock.Now(), absl::FromUnixSeconds(5));
}

TEST(FakeClockTest, RealClockIsNearAbslNow) {
  const absl::Time before = absl::Now();
  const absl::Time now = RealClock().Now();
  EXPECT_GE(now, before);
  EXPECT_LT(now - before, absl::Minutes(1));
  EXPECT_EQ(&RealClock(), &RealClock());
}

}  // namespace
}  // namespace fusionrl
