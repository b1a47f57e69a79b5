#include "worker/step/card_turns.h"

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

// After one warm-up step the card runs a block in each mode (2 settling +
// 3 counted steps here), keeps the faster one, and probes again
// reprobe_every steps later.
TEST(CardTurnsTest, ProbesBothModesAndKeepsTheFaster) {
  for (const bool interleaving_wins : {false, true}) {
    CardTurns turns({/*automatic=*/true, C, /*settle_steps=*/2,
                     /*counted_steps=*/3, /*reprobe_every=*/10},
                    RealClock());
    const std::vector<Mode> modes =
        Schedule(turns, 40, [&](Mode m, int) -> std::pair<double, int64_t> {
          return {(m == I) == interleaving_wins ? 1.0 : 2.0, 100};
        });
    const Mode won = interleaving_wins ? I : C;
    for (int i = 0; i < 40; ++i) {
      Mode want = won;
      if (i < 6) want = C;              // warm-up, the C block
      if (i >= 6 && i < 11) want = I;   // the I block
      if (i >= 21 && i < 26) want = C;  // probe again
      if (i >= 26 && i < 31) want = I;
      EXPECT_EQ(modes[i], want)
          << "step " << i << " interleaving_wins " << interleaving_wins;
    }
  }
}

// A block's first steps are not counted: switching to interleaved, the
// trainer first takes the batches the rollout sampled ahead while both
// ran at once (fast steps), and only then runs at the interleaved pace.
TEST(CardTurnsTest, StepsWhileThePipelineSettlesAreNotCounted) {
  CardTurns turns({true, C, 2, 3, 100}, RealClock());
  const std::vector<Mode> modes =
      Schedule(turns, 12, [&](Mode m, int step) -> std::pair<double, int64_t> {
        if (m == C) return {1.0, 100};
        // The I block: steps 6 and 7 drain the pipeline, then 1.5 s a step.
        return {step < 8 ? 0.2 : 1.5, 100};
      });
  EXPECT_EQ(turns.mode(), C);
}

// Steps are weighed by the rollout tokens they generated: a mode whose
// steps were shorter because their batches were (the policy's answers
// shortening) does not win for that.
TEST(CardTurnsTest, StepsAreWeighedByTheirTokens) {
  CardTurns turns({true, C, 0, 4, 100}, RealClock());
  Schedule(turns, 9, [&](Mode m, int) -> std::pair<double, int64_t> {
    // Concurrent: 0.01 s a token; interleaved: 0.8 s for 40 (0.02).
    return m == C ? std::pair<double, int64_t>{1.0, 100}
                  : std::pair<double, int64_t>{0.8, 40};
  });
  EXPECT_EQ(turns.mode(), C);
}

TEST(CardTurnsTest, FixedModeNeverProbes) {
  CardTurns turns({false, Mode::kInterleaved, 3, 3, 10}, RealClock());
  const std::vector<Mode> modes =
      Schedule(turns, 20, [](Mode m, int) -> std::pair<double, int64_t> {
        return {m == I ? 5.0 : 1.0, 100};
      });
  for (Mode m : modes) EXPECT_EQ(m, I);
}

// Interleaved, the trainer waits for the decode step in flight, and the
// rollout's next step waits until the trainer gives the card back.
TEST(CardTurnsTest, InterleavedRolesTakeTurns) {
  CardTurns turns({false, Mode::kInterleaved, 3, 3, 10}, RealClock());
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
  CardTurns turns({false, Mode::kConcurrent, 3, 3, 10}, RealClock());
  const absl::Time far = absl::Now() + absl::Seconds(60);
  ASSERT_TRUE(turns.RolloutStep(far).ok());
  ASSERT_TRUE(turns.TrainerEnter(far).ok());
  ASSERT_TRUE(turns.RolloutStep(far).ok());
  turns.TrainerExit();
}

// Every wait has a deadline.
TEST(CardTurnsTest, WaitsEndAtTheirDeadline) {
  FakeClock clock;
  CardTurns turns({false, Mode::kInterleaved, 3, 3, 10}, clock);
  ASSERT_TRUE(turns.TrainerEnter(clock.Now() + absl::Seconds(5)).ok());
  absl::Status status;
  std::thread rollout(
      [&] { status = turns.RolloutStep(clock.Now() + absl::Seconds(5)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  clock.Advance(absl::Seconds(6));
  rollout.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  turns.TrainerExit();

  CardTurns other({false, Mode::kInterleaved, 3, 3, 10}, clock);
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
