// The card loop against a scripted controller (FakeWorkClient): commits,
// a rolled-back attempt, an injected collective error, the fused rollout
// thread's policy-lag admission.
#include "worker/card_runner.h"

#include <ATen/ATen.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/fake_clock.h"
#include "core/memory_manager.h"
#include "engine/jobs/job_setup.h"
#include "engine/model/test_util.h"
#include "engine/rollout/rollout.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "worker/fake_work_client.h"
#include "worker/fused_rollout.h"
#include "worker/plan_rendezvous.h"
#include "worker/step/group_sampler.h"
#include "worker/step/rollout_prefetch.h"
#include "worker/step/staleness_filter.h"
#include "worker/step/step_snapshot.h"

namespace fusionrl {
namespace {

JobConfig TinyJob(const std::string& out, int steps) {
  JobConfig c;
  c.name = "card-test";
  c.num_threads = 1;  // bitwise-reproducible reductions
  c.output_dir = ::testing::TempDir() + "/card_runner_test/" + out;
  c.model = testing_util::TinyModelConfig();
  c.model.init_std = 0.02;
  c.task.name = "reverse";
  c.task.min_digits = 1;
  c.task.max_digits = 3;
  c.task.eval_size = 8;
  c.rollout.prompts_per_step = 4;
  c.rollout.group_size = 4;
  c.rollout.max_new_tokens = 5;
  c.optim.lr = 1e-3;
  c.run.total_steps = steps;
  c.run.collective_timeout_seconds = 60;
  return c;
}

struct CardRun {
  absl::Status status;
  std::vector<StepReport> reports;
  std::vector<std::pair<int64_t, int>> committed;
};

CardRun RunOneCard(const JobConfig& config, FakeWorkClient& fake,
                   int64_t freeze_rollout_snapshot_before_step = 0) {
  std::filesystem::remove_all(config.output_dir);
  CardCounters counters;
  PlanRendezvous::Options ro;
  ro.job_id = "job-1";
  ro.node_id = "node-1";
  ro.timeout = absl::Seconds(60);
  PlanRendezvous rendezvous(fake, ro, nullptr, RealClock());
  CardJob job;
  job.client = &fake;
  job.rendezvous = &rendezvous;
  job.node_id = "node-1";
  job.super_node = "sn-0";
  job.job_id = "job-1";
  job.config = &config;
  job.threads = 1;
  job.counters = &counters;
  job.debug_freeze_rollout_snapshot_before_step =
      freeze_rollout_snapshot_before_step;
  CardRun run;
  run.status = RunCard(job);
  run.reports = fake.reports();
  run.committed = fake.committed();
  return run;
}

double Metric(const StepReport& r, const std::string& key) {
  for (const auto& [k, v] : r.metrics) {
    if (k == key) return v;
  }
  ADD_FAILURE() << "no metric " << key << " in the report of step " << r.step;
  return -1;
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(CardRunnerTest, CommitsEveryStepThenWritesTheFinalCheckpoint) {
  const JobConfig config = TinyJob("clean", 3);
  FakeWorkClient fake(3, config.rollout.prompts_per_step);
  fake.WaitPlansFirst(2);  // the card asks again until the step is planned
  const CardRun run = RunOneCard(config, fake);
  ASSERT_TRUE(run.status.ok()) << run.status;
  const std::vector<std::pair<int64_t, int>> want = {{1, 1}, {2, 1}, {3, 1}};
  EXPECT_EQ(run.committed, want);
  ASSERT_EQ(run.reports.size(), 4u);  // three steps and the end
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Metric(run.reports[i], "step"), i + 1);
    EXPECT_EQ(Metric(run.reports[i], "policy_version"), i + 1);
    EXPECT_EQ(run.reports[i].policy_version, i + 1);
    EXPECT_EQ(run.reports[i].rollout_tokens,
              static_cast<int64_t>(Metric(run.reports[i], "rollout_tokens")));
  }
  EXPECT_EQ(run.reports.back().checkpoint_dir,
            config.output_dir + "/checkpoints/final");
  EXPECT_TRUE(std::filesystem::exists(config.output_dir +
                                      "/checkpoints/final/model.pt"));
}

class AbortedAttemptTest : public ::testing::TestWithParam<bool> {};

TEST_P(AbortedAttemptTest, IsRolledBackAndRunAgain) {
  const bool at_first_round = GetParam();
  const JobConfig clean_config = TinyJob("no-abort", 3);
  FakeWorkClient clean(3, clean_config.rollout.prompts_per_step);
  const CardRun a = RunOneCard(clean_config, clean);
  ASSERT_TRUE(a.status.ok()) << a.status;

  const JobConfig config = TinyJob("abort", 3);
  FakeWorkClient fake(3, config.rollout.prompts_per_step);
  fake.AbortFirstAttemptOf(2, at_first_round);
  const CardRun b = RunOneCard(config, fake);
  ASSERT_TRUE(b.status.ok()) << b.status;
  const std::vector<std::pair<int64_t, int>> want = {{1, 1}, {2, 2}, {3, 1}};
  EXPECT_EQ(b.committed, want);
  EXPECT_GT(fake.reduce_calls(), 0);
  // Attempt 1 of step 2 (trained to its end unless aborted at its first
  // round) left nothing behind: the weights are those of the run that never
  // saw it, bit for bit.
  const std::string wa =
      FileBytes(clean_config.output_dir + "/checkpoints/final/model.pt");
  const std::string wb =
      FileBytes(config.output_dir + "/checkpoints/final/model.pt");
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "final weights differ after the rollback";
  const StepReport& step2 = b.reports[at_first_round ? 1 : 2];
  EXPECT_EQ(step2.step, 2);
  EXPECT_EQ(Metric(step2, "attempt"), 2);
  EXPECT_EQ(step2.policy_version, 2);
}

INSTANTIATE_TEST_SUITE_P(CardRunnerTest, AbortedAttemptTest,
                         ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "AtFirstReduceRound"
                                             : "AfterTraining";
                         });

// StaleSync clock skew: the controller is killed right after it committed
// a step (journaled) and before the card heard the answer. The restarted
// controller rolls the job back to its last committed weight sync and
// answers the card's retried report "not committed" (its attempt was rolled
// back). When the killed step was itself a sync step, that sync is the
// roll-back target: the card must have kept it although the answer said
// "not committed" (the cluster test saw "roll-back to the weight sync of
// step 8: this card kept those of steps 0, 4 only"). Either way the job
// goes on from the sync and ends with the weights of the run that never
// rolled back, bit for bit.
class SkewedControllerRestartTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SkewedControllerRestartTest, RollsBackToTheSyncTheCardKept) {
  const int64_t restart_after = GetParam();
  const JobConfig clean_config = TinyJob("skew-no-restart", 4);
  FakeWorkClient clean(4, clean_config.rollout.prompts_per_step);
  clean.Skewed(/*sync_every=*/2);
  const CardRun a = RunOneCard(clean_config, clean);
  ASSERT_TRUE(a.status.ok()) << a.status;
  const std::vector<std::pair<int64_t, int>> want_clean = {
      {1, 1}, {2, 1}, {3, 1}, {4, 1}};
  EXPECT_EQ(a.committed, want_clean);

  const JobConfig config =
      TinyJob(absl::StrCat("skew-restart-after-", restart_after), 4);
  FakeWorkClient fake(4, config.rollout.prompts_per_step);
  fake.Skewed(/*sync_every=*/2, restart_after);
  const CardRun b = RunOneCard(config, fake);
  ASSERT_TRUE(b.status.ok()) << b.status;
  // Steps up to the restart committed in attempt 1; the job went on from
  // the sync of step 2 in attempt 2.
  std::vector<std::pair<int64_t, int>> want;
  for (int64_t step = 1; step <= restart_after; ++step) {
    want.push_back({step, 1});
  }
  for (int64_t step = 3; step <= 4; ++step) want.push_back({step, 2});
  EXPECT_EQ(b.committed, want);
  const StepReport& rerun = b.reports[restart_after];
  EXPECT_EQ(rerun.step, 3);
  EXPECT_EQ(rerun.attempt, 2);
  EXPECT_EQ(rerun.policy_version, 3);
  const std::string wa =
      FileBytes(clean_config.output_dir + "/checkpoints/final/model.pt");
  const std::string wb =
      FileBytes(config.output_dir + "/checkpoints/final/model.pt");
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "final weights differ after the roll-back";
}

INSTANTIATE_TEST_SUITE_P(CardRunnerTest, SkewedControllerRestartTest,
                         ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return info.param == 2 ? "AfterASyncStep"
                                                  : "AfterALaterStep";
                         });

TEST(CardRunnerTest, AnInjectedReduceErrorBecomesTheJobsError) {
  const JobConfig config = TinyJob("reduce-error", 3);
  FakeWorkClient fake(3, config.rollout.prompts_per_step);
  fake.FailReduceAt(2, absl::InternalError("injected reduce failure"));
  const CardRun run = RunOneCard(config, fake);
  ASSERT_FALSE(run.status.ok());
  EXPECT_TRUE(absl::StrContains(run.status.message(), "injected reduce"))
      << run.status;
  const std::vector<std::pair<int64_t, int>> want = {{1, 1}};
  EXPECT_EQ(run.committed, want);
  // The failure is reported to the controller, naming the step.
  ASSERT_EQ(run.reports.size(), 2u);
  EXPECT_EQ(run.reports[1].step, 2);
  EXPECT_TRUE(
      absl::StrContains(run.reports[1].error.message(), "injected reduce"))
      << run.reports[1].error;
}

TEST(CardRunnerTest, FusedRunTrainsWithinThePolicyLag) {
  JobConfig config = TinyJob("fused", 5);
  config.placement.mode = PlacementMode::kFused;
  config.num_threads = 2;
  config.stalesync.max_policy_lag = 1;
  config.algorithm.decoupled_loss = true;
  FakeWorkClient fake(5, config.rollout.prompts_per_step);
  const CardRun run = RunOneCard(config, fake);
  ASSERT_TRUE(run.status.ok()) << run.status;
  ASSERT_EQ(run.committed.size(), 5u);
  double histogram = 0;
  for (int i = 0; i < 5; ++i) {
    const StepReport& r = run.reports[i];
    EXPECT_LE(Metric(r, "max_staleness"), 1) << "step " << r.step;
    EXPECT_EQ(Metric(r, "over_stale_samples"), 0) << "step " << r.step;
    histogram = Metric(r, "staleness_0") + Metric(r, "staleness_1");
    EXPECT_EQ(histogram,
              config.rollout.prompts_per_step * config.rollout.group_size);
  }
}

// A sample over the policy lag reaches the trainer (forced: the rollout
// thread's snapshot misses version 1, so step 2 is sampled by version 0
// while the trainer is at 1, staleness 1 > s = 0). The card must notice it
// and, per stalesync.over_stale, sample the groups again from the live
// policy or drop them (and, with every group dropped, take no optimizer
// step). Steps 1 and 3 are not affected.
class OverStaleRolloutTest : public ::testing::TestWithParam<OverStalePolicy> {
};

TEST_P(OverStaleRolloutTest, IsRegeneratedOrDropped) {
  const bool drop = GetParam() == OverStalePolicy::kDrop;
  JobConfig config = TinyJob(drop ? "over-stale-drop" : "over-stale-regen", 3);
  config.placement.mode = PlacementMode::kFused;
  config.num_threads = 2;
  config.stalesync.max_policy_lag = 0;
  config.stalesync.over_stale = GetParam();
  FakeWorkClient fake(3, config.rollout.prompts_per_step);
  const CardRun run = RunOneCard(config, fake, /*freeze before step*/ 3);
  ASSERT_TRUE(run.status.ok()) << run.status;
  ASSERT_EQ(run.committed.size(), 3u);
  const double per_step =
      config.rollout.prompts_per_step * config.rollout.group_size;
  const StepReport& s1 = run.reports[0];
  const StepReport& s2 = run.reports[1];
  const StepReport& s3 = run.reports[2];
  for (const StepReport* r : {&s1, &s3}) {
    EXPECT_EQ(Metric(*r, "over_stale_samples"), 0) << "step " << r->step;
    EXPECT_EQ(Metric(*r, "rollout_thread_samples"), per_step);
    EXPECT_EQ(Metric(*r, "trained_groups"), config.rollout.prompts_per_step);
  }
  // Step 2: every sample came over the lag, with its groups' ids.
  const double ids_of_step2 = 4 + 5 + 6 + 7;
  EXPECT_EQ(Metric(s2, "trained_group_id_sum"), drop ? 0 : ids_of_step2);
  EXPECT_EQ(Metric(s2, "over_stale_samples"), per_step);
  EXPECT_EQ(Metric(s2, "max_staleness"), 0);  // nothing over it is trained
  EXPECT_EQ(Metric(s2, "rollout_thread_samples"), 0);
  if (drop) {
    // Nothing trained (the trainer then takes no optimizer step; its
    // version still advances once per step: trainer_test).
    EXPECT_EQ(Metric(s2, "trained_groups"), 0);
    EXPECT_EQ(Metric(s2, "staleness_0"), 0);
  } else {
    // Sampled again here: the same groups, trained at staleness 0.
    EXPECT_EQ(Metric(s2, "trained_groups"), config.rollout.prompts_per_step);
    EXPECT_EQ(Metric(s2, "staleness_0"), per_step);
  }
  EXPECT_EQ(s2.policy_version, 2);
  EXPECT_EQ(s3.policy_version, 3);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, OverStaleRolloutTest,
    ::testing::Values(OverStalePolicy::kRegenerate, OverStalePolicy::kDrop),
    [](const ::testing::TestParamInfo<OverStalePolicy>& info) {
      return std::string(info.param == OverStalePolicy::kDrop ? "Drop"
                                                              : "Regenerate");
    });

// --- FusedRollout alone: admission by PolicyLagRule ------------------------

class RecordingSampler {
 public:
  FusedRollout::SampleFn Fn() {
    return [this](RolloutEngine&, const std::vector<StepGroups>& steps, int,
                  int64_t version, const GroupSampler::DeliverFn& deliver,
                  const GroupSampler::SegmentEndFn&) -> absl::Status {
      std::vector<RolloutBatch> batches;
      {
        absl::MutexLock l(&mu_);
        std::vector<int64_t> round;
        for (const StepGroups& step : steps) {
          round.push_back(step.step);
          sampled_.push_back({step.step, version});
          RolloutBatch b;
          b.groups = step.groups;
          for (uint64_t g : step.groups) {
            Sample s;
            s.group_id = g;
            s.behaviour_version = version;
            b.samples.push_back(s);
          }
          batches.push_back(std::move(b));
        }
        rounds_.push_back(round);
      }
      for (size_t k = 0; k < steps.size(); ++k) {
        deliver(steps[k].step, std::move(batches[k]));
      }
      if (hold_first_round_ && Rounds().size() == 1) {
        release_.WaitForNotificationWithTimeout(absl::Seconds(10));
      }
      return absl::OkStatus();
    };
  }
  // The first round, once delivered, does not return until Release():
  // what is published meanwhile is there when the next round is formed.
  void HoldFirstRound() { hold_first_round_ = true; }
  void Release() { release_.Notify(); }
  // The steps of each round, in order.
  std::vector<std::vector<int64_t>> Rounds() {
    absl::MutexLock l(&mu_);
    return rounds_;
  }
  // Waits until `n` batches were sampled (or 10 s).
  std::vector<std::pair<int64_t, int64_t>> WaitFor(size_t n) {
    absl::MutexLock l(&mu_);
    auto enough = [this, n] { return sampled_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return sampled_;
  }
  std::vector<std::pair<int64_t, int64_t>> Sampled() {
    absl::MutexLock l(&mu_);
    return sampled_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<int64_t, int64_t>> sampled_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<int64_t>> rounds_ ABSL_GUARDED_BY(mu_);
  bool hold_first_round_ = false;
  absl::Notification release_;
};

StepPlan TrainPlan(int64_t step, int per_step) {
  StepPlan p;
  p.kind = PlanKind::kTrain;
  p.step = step;
  for (int i = 0; i < per_step; ++i) {
    p.groups.push_back(static_cast<uint64_t>((step - 1) * per_step + i));
  }
  return p;
}

TEST(FusedRolloutTest, AdmitsStepsOnlyWithinThePolicyLag) {
  auto policy = testing_util::TinyModel();
  auto snapshot = policy->CloneFrozen();
  auto engine =
      std::make_unique<RolloutEngine>(*snapshot, 0, std::vector<int>{1});
  RecordingSampler sampler;
  FusedRollout::Options o;
  o.max_policy_lag = 1;
  o.prompts_per_step = 2;
  o.timeout = absl::Seconds(10);
  FusedRollout fused(std::move(snapshot), std::move(engine), o, sampler.Fn(),
                     nullptr, RealClock());
  fused.Publish(policy->parameters(), 0);
  // Step 1 (version 0 trains it): the thread may run one step ahead.
  absl::StatusOr<RolloutBatch> b1 = fused.Take(TrainPlan(1, 2));
  ASSERT_TRUE(b1.ok()) << b1.status();
  EXPECT_EQ(b1->groups, (std::vector<uint64_t>{0, 1}));
  auto seen = sampler.WaitFor(2);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], std::make_pair(int64_t{2}, int64_t{0}));
  // Step 3 needs version >= 1: the thread waits for it, having sampled
  // nothing more.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (fused.waiting_for_step() != 3 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(fused.waiting_for_step(), 3);
  EXPECT_EQ(sampler.Sampled().size(), 2u);
  fused.Publish(policy->parameters(), 1);
  seen = sampler.WaitFor(3);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[2], std::make_pair(int64_t{3}, int64_t{1}));
  absl::StatusOr<RolloutBatch> b2 = fused.Take(TrainPlan(2, 2));
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(b2->groups, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(b2->samples.front().behaviour_version, 0);  // staleness 1 at v1
  // A replanned step (other groups) drops the prediction and samples anew.
  StepPlan replanned = TrainPlan(3, 2);
  replanned.groups = {40, 41};
  fused.Publish(policy->parameters(), 2);
  absl::StatusOr<RolloutBatch> b3 = fused.Take(replanned);
  ASSERT_TRUE(b3.ok()) << b3.status();
  EXPECT_EQ(b3->groups, (std::vector<uint64_t>{40, 41}));
  EXPECT_EQ(b3->samples.front().behaviour_version, 2);
  fused.Stop();
}

// Just-in-time admission (rollout_version jit, s = 3): once the card has
// measured a training step (10 s from Take to Publish on the fake clock)
// and a step's rollout (`rollout` seconds), the 5th step of the frame waits
// for version v0 + 4 - d, d = ceil(1.2 x rollout / 10) in 1..3, and samples
// from the newest version then. A fast rollout (2 s: d = 1) is admitted two
// versions later than the lag allows; a slow one (25 s: d = 3) as early as
// the lag allows. Admitting one version earlier (or later) than d fails.
class JustInTimeAdmissionTest
    : public ::testing::TestWithParam<std::pair<double, int64_t>> {};

TEST_P(JustInTimeAdmissionTest, WaitsAsLongAsTheMeasuredTimesAllow) {
  const auto [rollout_seconds, lag] = GetParam();
  FakeClock clock;
  auto policy = testing_util::TinyModel();
  auto snapshot = policy->CloneFrozen();
  auto engine =
      std::make_unique<RolloutEngine>(*snapshot, 0, std::vector<int>{1});
  RecordingSampler sampler;
  FusedRollout::SampleFn recording = sampler.Fn();
  FusedRollout::Options o;
  o.max_policy_lag = 3;
  o.lagged = false;
  o.just_in_time = true;
  o.prompts_per_step = 2;
  o.max_steps_per_round = 4;  // steps 1..4 in one round: one measurement
  o.timeout = absl::Seconds(10);
  FusedRollout fused(
      std::move(snapshot), std::move(engine), o,
      [&, r = rollout_seconds](
          RolloutEngine& e, const std::vector<StepGroups>& steps, int rank,
          int64_t version, const GroupSampler::DeliverFn& deliver,
          const GroupSampler::SegmentEndFn& end) {
        // The round takes `r` seconds a step, before it hands anything over.
        clock.Advance(absl::Seconds(r * static_cast<double>(steps.size())));
        return recording(e, steps, rank, version, deliver, end);
      },
      nullptr, clock);
  fused.Publish(policy->parameters(), 0);
  // Nothing measured yet: steps 1..4 are admitted as the lag s allows.
  absl::StatusOr<RolloutBatch> b1 = fused.Take(TrainPlan(1, 2));
  ASSERT_TRUE(b1.ok()) << b1.status();
  EXPECT_EQ(b1->admission_lag, 3);
  ASSERT_EQ(sampler.WaitFor(4).size(), 4u);
  auto waiting_for_5 = [&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (fused.waiting_for_step() != 5 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return fused.waiting_for_step() == 5 && sampler.Sampled().size() == 4;
  };
  // Train steps 1..4, 10 s each; step 5 (i = 4) starts at version 4 - d.
  for (int64_t v = 1; v <= 4 - lag; ++v) {
    if (v > 1) {
      ASSERT_TRUE(fused.Take(TrainPlan(v, 2)).ok());
    }
    clock.Advance(absl::Seconds(10));
    ASSERT_TRUE(waiting_for_5()) << "before version " << v;
    fused.Publish(policy->parameters(), v);
  }
  auto seen = sampler.WaitFor(5);
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen[4], std::make_pair(int64_t{5}, 4 - lag));
  for (int64_t step = 4 - lag + 1; step <= 5; ++step) {
    absl::StatusOr<RolloutBatch> b = fused.Take(TrainPlan(step, 2));
    ASSERT_TRUE(b.ok()) << b.status();
    if (step == 5) {
      EXPECT_EQ(b->admission_lag, lag);
      EXPECT_EQ(b->samples.front().behaviour_version, 4 - lag);
    }
    clock.Advance(absl::Seconds(10));
    fused.Publish(policy->parameters(), step);
  }
  fused.Stop();
}

INSTANTIATE_TEST_SUITE_P(FastAndSlowRollout, JustInTimeAdmissionTest,
                         ::testing::Values(std::make_pair(2.0, int64_t{1}),
                                           std::make_pair(25.0, int64_t{3})),
                         [](const auto& info) {
                           return info.param.second == 1
                                      ? std::string("FastRolloutLag1")
                                      : std::string("SlowRolloutLag3");
                         });

// Several steps sampled in one engine call (continuous batching across
// steps) give each step the batch a call of its own gives it: the same
// tokens and rewards, log-probs to float rounding, every step delivered
// once, and the rounds' seconds summing to the call's.
TEST(GroupSamplerTest, StepsSampledTogetherEqualStepsSampledAlone) {
  JobConfig config = TinyJob("sampler", 1);
  config.rollout.max_new_tokens = 8;
  absl::StatusOr<JobContext> ctx = PrepareJob(config, "");
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto memory = CardMemoryManager::Create(0, config.memory).value();
  GroupSampler sampler(config, *ctx);
  // A random policy rarely samples eos: stop at one id in ten as well, so
  // that response lengths spread and slots are refilled.
  std::vector<int> stops = ctx->stop_ids;
  const int pad = ctx->tokenizer->pad_id();
  for (int id = 0; id < ctx->tokenizer->vocab_size(); id += 10) {
    if (id != pad) stops.push_back(id);
  }
  RolloutEngine engine(*ctx->policy, pad, stops);
  ASSERT_TRUE(engine.fused());
  const auto no_offload = [](const MemoryDecision&) {
    return absl::OkStatus();
  };
  std::vector<StepGroups> steps;
  for (int64_t step = 4; step <= 6; ++step) {
    steps.push_back({step,
                     TrainPlan(step, config.rollout.prompts_per_step).groups,
                     std::nullopt});
  }
  std::map<int64_t, RolloutBatch> together;
  const absl::Status st = sampler.SampleSteps(
      engine, steps, 0, 3, *memory, no_offload,
      [&](int64_t step, RolloutBatch b) {
        EXPECT_EQ(together.count(step), 0u) << "step " << step << " twice";
        together[step] = std::move(b);
      });
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(together.size(), 3u);
  // One step's sequences decoded at once: the steps shared the slots.
  const int64_t per_step =
      config.rollout.prompts_per_step * config.rollout.group_size;
  EXPECT_LE(engine.last_stats().rows_computed,
            engine.last_stats().decode_steps * per_step);
  int64_t lengths = 0;
  for (const StepGroups& sg : steps) {
    SCOPED_TRACE("step " + std::to_string(sg.step));
    absl::StatusOr<RolloutBatch> alone =
        sampler.Sample(engine, sg.groups, sg.step, 0, 3, *memory, no_offload);
    ASSERT_TRUE(alone.ok()) << alone.status();
    const RolloutBatch& t = together[sg.step];
    EXPECT_EQ(t.groups, alone->groups);
    ASSERT_EQ(t.samples.size(), alone->samples.size());
    for (size_t i = 0; i < t.samples.size(); ++i) {
      EXPECT_EQ(t.samples[i].response_ids, alone->samples[i].response_ids);
      EXPECT_EQ(t.samples[i].reward, alone->samples[i].reward);
      EXPECT_EQ(t.samples[i].behaviour_version, 3);
      ASSERT_EQ(t.samples[i].behaviour_logp.size(),
                alone->samples[i].behaviour_logp.size());
      for (size_t j = 0; j < t.samples[i].behaviour_logp.size(); ++j) {
        EXPECT_NEAR(t.samples[i].behaviour_logp[j],
                    alone->samples[i].behaviour_logp[j], 1e-5);
      }
      lengths += static_cast<int64_t>(t.samples[i].response_ids.size());
    }
    EXPECT_EQ(t.tokens, alone->tokens);
  }
  // Responses of different lengths, or no slot was ever refilled.
  EXPECT_LT(lengths, 3 * per_step * config.rollout.max_new_tokens);
}

// Rounds of several steps: the steps admitted at once that sample from
// one version go to the sampler together (lagged: the first s + 1 steps
// after a reset all sample from v0; newest: every admitted step samples
// from the newest version; lagged with steps_per_version 2: each pair
// samples from the version its second step is admitted at, 0 for steps
// 1-2, then 1 and 3, LaggedSampleVersion); steps of different versions
// never share a round.
TEST(FusedRolloutTest, SamplesTheAdmittedStepsOfOneVersionInOneRound) {
  using Rounds = std::vector<std::vector<int64_t>>;
  struct Case {
    const char* name;
    bool lagged;
    int steps_per_version;
    Rounds rounds;
    std::vector<int64_t> versions;  // of steps 2..6
  };
  const Case cases[] = {
      {"lagged", true, 1, {{1, 2, 3}, {4}, {5}, {6}}, {0, 0, 1, 2, 3}},
      {"newest", false, 1, {{1, 2, 3}, {4, 5, 6}}, {0, 0, 3, 3, 3}},
      {"lagged, 2 steps per version",
       true,
       2,
       {{1, 2}, {3, 4}, {5, 6}},
       {0, 1, 1, 3, 3}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto policy = testing_util::TinyModel();
    auto snapshot = policy->CloneFrozen();
    auto engine =
        std::make_unique<RolloutEngine>(*snapshot, 0, std::vector<int>{1});
    RecordingSampler sampler;
    sampler.HoldFirstRound();
    FusedRollout::Options o;
    o.max_policy_lag = 2;
    o.lagged = c.lagged;
    o.steps_per_version = c.steps_per_version;
    o.prompts_per_step = 2;
    o.max_steps_per_round = 3;
    o.timeout = absl::Seconds(10);
    FusedRollout fused(std::move(snapshot), std::move(engine), o, sampler.Fn(),
                       nullptr, RealClock());
    fused.Publish(policy->parameters(), 0);
    absl::StatusOr<RolloutBatch> b1 = fused.Take(TrainPlan(1, 2));
    ASSERT_TRUE(b1.ok()) << b1.status();
    // Versions 1..3 arrive while the first round is still in the sampler:
    // the later steps are admitted at once when the next round is formed.
    for (int v = 1; v <= 3; ++v) fused.Publish(policy->parameters(), v);
    sampler.Release();
    ASSERT_EQ(sampler.WaitFor(6).size(), 6u);
    EXPECT_EQ(sampler.Rounds(), c.rounds);
    for (int64_t step = 2; step <= 6; ++step) {
      absl::StatusOr<RolloutBatch> b = fused.Take(TrainPlan(step, 2));
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(b->groups, TrainPlan(step, 2).groups);
      EXPECT_EQ(b->samples.front().behaviour_version, c.versions[step - 2])
          << "step " << step;
    }
    fused.Stop();
  }
}

TEST(FusedRolloutTest, TakeTimesOutNamingTheStep) {
  auto policy = testing_util::TinyModel();
  auto snapshot = policy->CloneFrozen();
  auto engine =
      std::make_unique<RolloutEngine>(*snapshot, 0, std::vector<int>{1});
  FusedRollout::Options o;
  o.max_policy_lag = 0;
  o.prompts_per_step = 1;
  o.timeout = absl::Milliseconds(300);
  FusedRollout fused(
      std::move(snapshot), std::move(engine), o,
      [](RolloutEngine&, const std::vector<StepGroups>& steps, int, int64_t,
         const GroupSampler::DeliverFn& deliver,
         const GroupSampler::SegmentEndFn&) -> absl::Status {
        for (const StepGroups& s : steps) deliver(s.step, RolloutBatch{});
        return absl::OkStatus();
      },
      nullptr, RealClock());
  fused.Publish(policy->parameters(), 0);
  ASSERT_TRUE(fused.Take(TrainPlan(1, 1)).ok());
  // Step 2 needs version 1 at lag 0, which never comes.
  absl::StatusOr<RolloutBatch> b = fused.Take(TrainPlan(2, 1));
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(b.status())) << b.status();
  EXPECT_TRUE(absl::StrContains(b.status().message(), "step 2"));
}

// Weights whose every element is `v`: a version whose snapshot is
// recognisable by any one of its values.
std::vector<at::Tensor> WeightsOf(PolicyModel& policy, float v) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : policy.parameters()) {
    out.push_back(at::full_like(p, v));
  }
  return out;
}

// Samples nothing, records (step, the snapshot's weights' value) and tags
// the samples with the version it was told.
class SnapshotSampler {
 public:
  explicit SnapshotSampler(PolicyModel* snapshot) : snapshot_(snapshot) {}
  FusedRollout::SampleFn Fn() {
    return [this](RolloutEngine&, const std::vector<StepGroups>& steps, int,
                  int64_t version, const GroupSampler::DeliverFn& deliver,
                  const GroupSampler::SegmentEndFn&) -> absl::Status {
      const float value =
          snapshot_->parameters().front().flatten()[0].item<float>();
      for (const StepGroups& sg : steps) {
        const int64_t step = sg.step;
        {
          absl::MutexLock l(&mu_);
          sampled_.push_back({step, value});
        }
        RolloutBatch b;
        b.groups = sg.groups;
        for (uint64_t g : sg.groups) {
          Sample s;
          s.group_id = g;
          s.behaviour_version = version;
          s.response_ids = {static_cast<int>(step), 7};
          s.behaviour_logp = {-0.5f, -float(step)};
          s.reward = static_cast<double>(version);
          b.samples.push_back(s);
        }
        b.Recount();
        deliver(step, std::move(b));
      }
      return absl::OkStatus();
    };
  }
  std::vector<std::pair<int64_t, float>> WaitFor(size_t n) {
    absl::MutexLock l(&mu_);
    auto enough = [this, n] { return sampled_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return sampled_;
  }

 private:
  PolicyModel* snapshot_;
  absl::Mutex mu_;
  std::vector<std::pair<int64_t, float>> sampled_ ABSL_GUARDED_BY(mu_);
};

// rollout_version lagged: step t samples from exactly version t - 1 - s,
// even when newer versions were published before its round started; the
// snapshot holds that version's weights, not just its number.
TEST(FusedRolloutTest, LaggedSamplesFromTheOldestVersionTheLagAllows) {
  auto policy = testing_util::TinyModel();
  auto snapshot = policy->CloneFrozen();
  PolicyModel* snap = snapshot.get();
  auto engine =
      std::make_unique<RolloutEngine>(*snapshot, 0, std::vector<int>{1});
  SnapshotSampler sampler(snap);
  FusedRollout::Options o;
  o.max_policy_lag = 2;
  o.prompts_per_step = 1;
  o.timeout = absl::Seconds(10);
  o.snapshot_version = -1;  // the snapshot holds none of the versions below
  // Steps 1..3 share a round; 4..6, admitted together once versions 1..3
  // are published, sample from three versions and must not.
  o.max_steps_per_round = 3;
  FusedRollout fused(std::move(snapshot), std::move(engine), o, sampler.Fn(),
                     nullptr, RealClock());
  fused.Publish(WeightsOf(*policy, 0), 0);
  ASSERT_TRUE(fused.Take(TrainPlan(1, 1)).ok());
  // Steps 1..3 sample from version 0; step 4 waits for version 1.
  ASSERT_EQ(sampler.WaitFor(3).size(), 3u);
  for (int v = 1; v <= 3; ++v) fused.Publish(WeightsOf(*policy, v), v);
  const auto seen = sampler.WaitFor(6);
  ASSERT_GE(seen.size(), 6u);
  const std::vector<std::pair<int64_t, float>> want = {{1, 0}, {2, 0}, {3, 0},
                                                       {4, 1}, {5, 2}, {6, 3}};
  const std::vector<std::pair<int64_t, float>> first6(seen.begin(),
                                                      seen.begin() + 6);
  EXPECT_EQ(first6, want);
  for (int64_t step = 2; step <= 6; ++step) {
    absl::StatusOr<RolloutBatch> b = fused.Take(TrainPlan(step, 1));
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->samples.front().behaviour_version,
              std::max<int64_t>(0, step - 3));
  }
  fused.Stop();
}

// A checkpoint after step 1 at version 1 (lag 2): Pending() hands out the
// batches of steps 2 and 3 (sampled from version 0, which a resume no
// longer has) and not step 4's (version 1, the checkpoint's own). A new
// rollout restored from them serves steps 2 and 3 without sampling and
// samples step 4 from version 1; the file in between keeps every field.
TEST(FusedRolloutTest, PendingAndRestoreContinueThePipeline) {
  auto policy = testing_util::TinyModel();
  FusedRollout::Options o;
  o.max_policy_lag = 2;
  o.prompts_per_step = 1;
  o.timeout = absl::Seconds(10);
  auto make = [&](SnapshotSampler** out_sampler) {
    auto snapshot = policy->CloneFrozen();
    auto engine =
        std::make_unique<RolloutEngine>(*snapshot, 0, std::vector<int>{1});
    *out_sampler = new SnapshotSampler(snapshot.get());
    return std::make_unique<FusedRollout>(
        std::move(snapshot), std::move(engine), o, (*out_sampler)->Fn(),
        nullptr, RealClock());
  };
  SnapshotSampler* first_sampler = nullptr;
  auto first = make(&first_sampler);
  std::unique_ptr<SnapshotSampler> own_first(first_sampler);
  first->Publish(WeightsOf(*policy, 0), 0);
  ASSERT_TRUE(first->Take(TrainPlan(1, 1)).ok());
  absl::StatusOr<std::optional<RolloutPrefetch>> pending = first->Pending(1, 1);
  ASSERT_TRUE(pending.ok()) << pending.status();
  ASSERT_TRUE(pending->has_value());
  RolloutPrefetch saved = **pending;
  first->Stop();
  ASSERT_EQ(saved.batches.size(), 2u);
  EXPECT_EQ(saved.batches.begin()->first, 2);
  EXPECT_EQ(saved.base_step, 1);
  EXPECT_EQ(saved.frame_version, 0);
  saved.checkpoint_step = 1;
  saved.weights_crc32c = 1234;

  const std::string path = RolloutPrefetchPath(
      ::testing::TempDir() + "/prefetch-roundtrip/checkpoints", 1, 0);
  ASSERT_TRUE(WriteRolloutPrefetch(path, saved).ok());
  absl::StatusOr<RolloutPrefetch> read = ReadRolloutPrefetch(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->weights_crc32c, 1234u);
  EXPECT_EQ(read->base_groups, saved.base_groups);
  ASSERT_EQ(read->batches.size(), 2u);
  for (const auto& [step, batch] : saved.batches) {
    const RolloutBatch& got = read->batches.at(step);
    ASSERT_EQ(got.samples.size(), batch.samples.size());
    EXPECT_EQ(got.samples[0].response_ids, batch.samples[0].response_ids);
    EXPECT_EQ(got.samples[0].behaviour_logp, batch.samples[0].behaviour_logp);
    EXPECT_EQ(got.samples[0].behaviour_version, 0);
    EXPECT_EQ(got.tokens, batch.tokens);
  }

  SnapshotSampler* second_sampler = nullptr;
  auto second = make(&second_sampler);
  std::unique_ptr<SnapshotSampler> own_second(second_sampler);
  second->Publish(WeightsOf(*policy, 1), 1);
  second->Restore(*std::move(read));
  for (int64_t step = 2; step <= 3; ++step) {
    absl::StatusOr<RolloutBatch> b = second->Take(TrainPlan(step, 1));
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->samples[0].response_ids[0], step);
    EXPECT_EQ(b->samples[0].behaviour_version, 0);
  }
  const auto seen = second_sampler->WaitFor(1);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front(), std::make_pair(int64_t{4}, 1.0f));
  second->Stop();
}

TEST(RolloutPrefetchTest, DamagedOrMissingFilesAreNamed) {
  const std::string dir = ::testing::TempDir() + "/prefetch-damaged";
  std::filesystem::remove_all(dir);
  const std::string path = RolloutPrefetchPath(dir, 4, 1);
  EXPECT_TRUE(absl::StrContains(path, "rollout/step_4/card_1.pb")) << path;
  EXPECT_TRUE(absl::IsNotFound(ReadRolloutPrefetch(path).status()));
  RolloutPrefetch p;
  p.checkpoint_step = 4;
  p.batches[5].groups = {1};
  p.batches[7].groups = {3};  // step 6 missing
  ASSERT_TRUE(WriteRolloutPrefetch(path, p).ok());
  absl::Status st = ReadRolloutPrefetch(path).status();
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "step 7")) << st;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "\xff\xff\xff";
  st = ReadRolloutPrefetch(path).status();
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), path)) << st;
}

// --- StalenessFilter --------------------------------------------------------

std::vector<Sample> Samples(std::vector<std::pair<uint64_t, int64_t>> gv) {
  std::vector<Sample> out;
  for (auto [g, v] : gv) {
    Sample s;
    s.group_id = g;
    s.behaviour_version = v;
    out.push_back(s);
  }
  return out;
}

TEST(StalenessFilterTest, FindsOverStaleGroupsAndDropsOrReplacesThem) {
  const StalenessFilter filter(1);
  std::vector<Sample> s = Samples({{7, 5}, {7, 5}, {8, 3}, {8, 4}, {9, 4}});
  absl::StatusOr<std::vector<uint64_t>> stale = filter.OverStaleGroups(s, 5);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_EQ(*stale, std::vector<uint64_t>{8});  // staleness 2 > 1
  std::vector<Sample> dropped = s;
  StalenessFilter::Drop(dropped, *stale);
  EXPECT_FALSE(dropped[0].excluded);
  EXPECT_TRUE(dropped[2].excluded && dropped[3].excluded);
  EXPECT_FALSE(dropped[4].excluded);
  EXPECT_EQ(StalenessFilter::MaxStaleness(dropped, 5), 1);
  std::vector<Sample> replaced = s;
  StalenessFilter::Replace(replaced, *stale, Samples({{8, 5}, {8, 5}}));
  EXPECT_EQ(replaced[2].behaviour_version, 5);
  EXPECT_EQ(replaced[3].behaviour_version, 5);
  EXPECT_EQ(StalenessFilter::MaxStaleness(replaced, 5), 1);
  EXPECT_TRUE(filter.OverStaleGroups(replaced, 5)->empty());
}

TEST(StalenessFilterTest, RejectsASampleNewerThanTheTrainer) {
  const StalenessFilter filter(2);
  const absl::StatusOr<std::vector<uint64_t>> r =
      filter.OverStaleGroups(Samples({{1, 3}, {2, 6}}), 5);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "prompt group 2"))
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "negative staleness"));
}

// LoRA: the state a weight sync between super nodes copies is 8 bytes of
// length, the adapters' bytes (not the model's), then their AdamW state; a
// peer adopting it gets the adapters, and its merged view their function.
TEST(StepSnapshotTest, LoraStateCarriesTheAdaptersOnly) {
  JobConfig job;
  job.model = testing_util::TinyModelConfig();
  job.model.lora.rank = 4;
  job.model.lora.alpha = 8;
  job.optim.lr = 1e-2;
  job.rollout.group_size = 2;
  auto lead = PolicyModel::Create(job.model, 98, c10::Device("cpu"), 3).value();
  auto trainer = Trainer::Create(*lead, nullptr, job, 0).value();
  std::vector<Sample> batch;
  for (int i = 0; i < 4; ++i) {
    Sample s;
    s.prompt_ids = {1, 5 + i / 2};
    s.response_ids = {20 + i, 2};
    s.behaviour_logp.assign(2, -1.0f);
    s.reward = i % 2;
    batch.push_back(s);
  }
  ASSERT_TRUE(trainer->Step(batch).ok());
  ASSERT_TRUE(trainer->Step(batch).ok());
  absl::StatusOr<std::string> blob = SerializeState(*lead, *trainer);
  ASSERT_TRUE(blob.ok()) << blob.status();
  uint64_t weight_bytes = 0;
  std::memcpy(&weight_bytes, blob->data(), sizeof(weight_bytes));
  EXPECT_EQ(weight_bytes,
            static_cast<uint64_t>(lead->num_trainable_parameters()) * 4);
  EXPECT_LT(weight_bytes * 4,
            static_cast<uint64_t>(lead->num_parameters()) * 4);

  auto peer = PolicyModel::Create(job.model, 98, c10::Device("cpu"), 3).value();
  auto peer_view = peer->CloneFrozen();
  auto peer_trainer = Trainer::Create(*peer, nullptr, job, 0).value();
  ASSERT_TRUE(AdoptState(*blob, *peer, *peer_trainer).ok());
  EXPECT_EQ(WeightsCrc32c(*peer), WeightsCrc32c(*lead));
  peer_view->LoadTrainable(peer->trainable_parameters());
  auto lead_view = lead->CloneFrozen();
  const auto tokens = at::randint(3, 98, {2, 6});
  const auto valid = at::ones({2, 6}, at::kBool);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(
      at::equal(peer_view->Forward(tokens, PositionsFromValid(valid), valid),
                lead_view->Forward(tokens, PositionsFromValid(valid), valid)));
}

}  // namespace
}  // namespace fusionrl
