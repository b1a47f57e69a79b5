#include "worker/card_turns.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/fake_clock.h"

namespace fusionrl {
namespace {

using Mode = CardTurns::Mode;

// The modes of `n` steps whose seconds are `concurrent` or `interleaved`
// by the mode each ran in.
std::vector<Mode> Schedule(CardTurns& turns, int n, double concurrent,
                           double interleaved) {
  std::vector<Mode> modes;
  for (int i = 0; i < n; ++i) {
    modes.push_back(turns.mode());
    turns.StepDone(modes.back() == Mode::kConcurrent ? concurrent
                                                     : interleaved,
                   /*tokens=*/1);
  }
  return modes;
}

// After one warm-up step the card runs probe_steps steps in each mode, keeps
// the faster one, and probes again reprobe_every steps later.
TEST(CardTurnsTest, ProbesBothModesAndKeepsTheFaster) {
  for (const bool interleaving_wins : {false, true}) {
    CardTurns turns({/*automatic=*/true, Mode::kConcurrent,
                     /*probe_steps=*/4, /*reprobe_every=*/10},
                    RealClock());
    const std::vector<Mode> modes = Schedule(
        turns, 30, /*concurrent=*/interleaving_wins ? 2.0 : 1.0,
        /*interleaved=*/interleaving_wins ? 1.0 : 2.0);
    const Mode won =
        interleaving_wins ? Mode::kInterleaved : Mode::kConcurrent;
    for (int i = 0; i < 30; ++i) {
      Mode want = won;
      if (i < 5) want = Mode::kConcurrent;                // warm-up, probe
      else if (i < 9) want = Mode::kInterleaved;          // probe
      else if (i >= 19 && i < 23) want = Mode::kConcurrent;   // probe again
      else if (i >= 23 && i < 27) want = Mode::kInterleaved;
      EXPECT_EQ(modes[i], want) << "step " << i << " interleaving_wins "
                                << interleaving_wins;
    }
  }
}

// The first step of each probe window is not counted: a slow transition
// step does not decide the probe.
TEST(CardTurnsTest, TheFirstStepOfAWindowIsNotCounted) {
  CardTurns turns({true, Mode::kConcurrent, 4, 10}, RealClock());
  turns.StepDone(1.0, 1);  // warm-up
  for (int i = 0; i < 4; ++i) turns.StepDone(1.0, 1);  // concurrent
  // Interleaved: a slow first step, then faster ones.
  turns.StepDone(100.0, 1);
  for (int i = 0; i < 3; ++i) turns.StepDone(0.5, 1);
  EXPECT_EQ(turns.mode(), Mode::kInterleaved);
}

// Steps are compared by seconds per rollout token: a step of long answers
// is not held against the mode it ran in.
TEST(CardTurnsTest, StepsAreComparedPerToken) {
  CardTurns turns({true, Mode::kConcurrent, 4, 10}, RealClock());
  turns.StepDone(1.0, 100);  // warm-up
  // Concurrent: 1 s for 100 tokens (0.01 s a token).
  for (int i = 0; i < 4; ++i) turns.StepDone(1.0, 100);
  // Interleaved: shorter steps, but of fewer tokens (0.02 s a token).
  for (int i = 0; i < 4; ++i) turns.StepDone(0.8, 40);
  EXPECT_EQ(turns.mode(), Mode::kConcurrent);
}

TEST(CardTurnsTest, FixedModeNeverProbes) {
  CardTurns turns({false, Mode::kInterleaved, 4, 10}, RealClock());
  const std::vector<Mode> modes = Schedule(turns, 20, 1.0, 5.0);
  for (Mode m : modes) EXPECT_EQ(m, Mode::kInterleaved);
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
