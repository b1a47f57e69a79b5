#include "worker/card_turns.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "core/fake_clock.h"

namespace fusionrl {
namespace {

using Mode = CardTurns::Mode;

// Runs `n` steps; cost(mode, step) gives a step's seconds and tokens.
template <class Cost>
std::vector<Mode> Schedule(CardTurns& turns, int n, Cost cost) {
  std::vector<Mode> modes;
  for (int i = 0; i < n; ++i) {
    modes.push_back(turns.mode());
    const auto [seconds, tokens] = cost(modes.back(), i);
    turns.StepDone(seconds, tokens);
  }
  return modes;
}

constexpr Mode C = Mode::kConcurrent;
constexpr Mode I = Mode::kInterleaved;

// After one warm-up step the card runs a probe of 4 steps in each mode
// (C I I C C I I C), keeps the faster one, and probes again reprobe_every
// steps later.
TEST(CardTurnsTest, ProbesBothModesAndKeepsTheFaster) {
  for (const bool interleaving_wins : {false, true}) {
    CardTurns turns({/*automatic=*/true, C, /*probe_steps=*/4,
                     /*reprobe_every=*/10},
                    RealClock());
    const std::vector<Mode> modes =
        Schedule(turns, 30, [&](Mode m, int) -> std::pair<double, int64_t> {
          return {(m == I) == interleaving_wins ? 1.0 : 2.0, 100};
        });
    const Mode won = interleaving_wins ? I : C;
    const std::vector<Mode> probe = {C, I, I, C, C, I, I, C};
    for (int i = 0; i < 30; ++i) {
      Mode want = won;
      if (i == 0) want = C;                         // warm-up
      if (i >= 1 && i < 9) want = probe[i - 1];
      if (i >= 19 && i < 27) want = probe[i - 19];  // probe again
      EXPECT_EQ(modes[i], want) << "step " << i << " interleaving_wins "
                                << interleaving_wins;
    }
  }
}

// Batches drift as the policy learns (answers grow shorter): steps are
// weighed by the tokens they generated and the modes alternate, so a mode
// 5% faster a token wins although its steps fell later and were shorter
// (the median step time of two blocks would pick the other).
TEST(CardTurnsTest, ADriftOfTheBatchesDoesNotDecide) {
  for (const bool interleaving_wins : {false, true}) {
    CardTurns turns({true, C, 4, 100}, RealClock());
    Schedule(turns, 9, [&](Mode m, int step) -> std::pair<double, int64_t> {
      const int64_t tokens = 2000 - 150 * step;
      const double per_token =
          (m == I) == interleaving_wins ? 0.95e-3 : 1.0e-3;
      return {per_token * static_cast<double>(tokens), tokens};
    });
    EXPECT_EQ(turns.mode(), interleaving_wins ? I : C);
  }
}

TEST(CardTurnsTest, FixedModeNeverProbes) {
  CardTurns turns({false, Mode::kInterleaved, 4, 10}, RealClock());
  const std::vector<Mode> modes =
      Schedule(turns, 20, [](Mode m, int) -> std::pair<double, int64_t> {
        return {m == I ? 5.0 : 1.0, 100};
      });
  for (Mode m : modes) EXPECT_EQ(m, I);
}

// Interleaved, the trainer waits for the decode step in flight, and the
// rollout's next step waits until the trainer gives the card back.
TEST(CardTurnsTest, InterleavedRolesTakeTurns) {
  CardTurns turns({false, Mode::kInterleaved, 4, 10}, RealClock());
  const absl::Time far = absl::Now() + absl::Seconds(60);
  ASSERT_TRUE(turns.RolloutStep(far).ok());  // a decode step in flight
  std::atomic<bool> trainer_in{false};
  std::thread trainer([&] {
    ASSERT_TRUE(turns.TrainerEnter(far).ok());
    trainer_in = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(trainer_in.load());  // the decode step has not ended
  std::atomic<bool> rollout_in{false};
  std::thread rollout([&] {
    // Ends the step in flight, then waits for the trainer.
    ASSERT_TRUE(turns.RolloutStep(far).ok());
    rollout_in = true;
  });
  trainer.join();
  EXPECT_TRUE(trainer_in.load());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(rollout_in.load());  // the trainer has the card
  turns.TrainerExit();
  rollout.join();
  EXPECT_TRUE(rollout_in.load());
  turns.RolloutIdle();
  EXPECT_TRUE(turns.TrainerEnter(far).ok());  // nothing in flight
  turns.TrainerExit();
}

// Concurrent, nobody waits.
TEST(CardTurnsTest, ConcurrentRolesNeverWait) {
  CardTurns turns({false, Mode::kConcurrent, 4, 10}, RealClock());
  const absl::Time far = absl::Now() + absl::Seconds(60);
  ASSERT_TRUE(turns.RolloutStep(far).ok());
  ASSERT_TRUE(turns.TrainerEnter(far).ok());
  ASSERT_TRUE(turns.RolloutStep(far).ok());
  turns.TrainerExit();
}

// Every wait has a deadline.
TEST(CardTurnsTest, WaitsEndAtTheirDeadline) {
  FakeClock clock;
  CardTurns turns({false, Mode::kInterleaved, 4, 10}, clock);
  ASSERT_TRUE(turns.TrainerEnter(clock.Now() + absl::Seconds(5)).ok());
  absl::Status status;
  std::thread rollout(
      [&] { status = turns.RolloutStep(clock.Now() + absl::Seconds(5)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  clock.Advance(absl::Seconds(6));
  rollout.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  turns.TrainerExit();

  CardTurns other({false, Mode::kInterleaved, 4, 10}, clock);
  ASSERT_TRUE(other.RolloutStep(clock.Now() + absl::Seconds(5)).ok());
  std::thread trainer(
      [&] { status = other.TrainerEnter(clock.Now() + absl::Seconds(5)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  clock.Advance(absl::Seconds(6));
  trainer.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace fusionrl
