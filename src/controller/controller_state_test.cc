// A controller restarted with its state directory continues its jobs: the
// nodes keep their ids, a job continues from its last committed step (a
// step spanning nodes is replanned, a single node's is kept), every prompt
// group is trained once and metrics.jsonl holds every step once; a
// damaged journal tail is dropped, not believed.
#include "controller/controller_state.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/fake_clock.h"
#include "core/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;

std::string JobYaml(const std::string& out, int super_nodes, int steps) {
  return absl::StrCat(R"(name: restart
model: {d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64, max_seq_len: 24}
task: {name: reverse, eval_size: 10, min_digits: 1, max_digits: 3}
rollout: {prompts_per_step: 4, group_size: 2, max_new_tokens: 5}
placement: {super_nodes: )",
                      super_nodes, R"(, cards_per_super_node: 1}
run: {eval_every: 0, total_steps: )",
                      steps, "}\noutput_dir: \"", out, "\"\n");
}

// One controller process: registry, manager and state over `dir`.
struct Process {
  Process(FakeClock& clock, const std::string& dir)
      : registry(clock, absl::Seconds(10)), jobs(registry, clock) {
    auto s = ControllerState::Open(dir, registry, jobs);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) state = *std::move(s);
  }
  NodeRegistry registry;
  JobManager jobs;
  std::unique_ptr<ControllerState> state;
};

class ControllerStateTest : public ::testing::Test {
 protected:
  ControllerStateTest() : clock_(absl::FromUnixSeconds(1000)) {
    dir_ = ::testing::TempDir() + "/controller-state";
    out_ = ::testing::TempDir() + "/controller-state-out";
    std::filesystem::remove_all(dir_);
    std::filesystem::remove_all(out_);
    process_ = std::make_unique<Process>(clock_, dir_);
  }

  // A controller crash: the process goes, its directory stays.
  void Restart() {
    process_.reset();
    process_ = std::make_unique<Process>(clock_, dir_);
    ASSERT_NE(process_->state, nullptr);
  }

  std::string AddNode(const std::string& super_node) {
    NodeSpec spec;
    spec.host = "h";
    spec.super_node = super_node;
    spec.cards = {CardSpec{0, "cpu", 0}};
    auto id = process_->registry.Register(spec);
    EXPECT_TRUE(id.ok()) << id.status();
    process_->state->NodeChanged(*id);
    process_->jobs.Schedule();
    return *id;
  }

  std::string Submit(int super_nodes, int steps,
                     const std::vector<std::string>& overrides = {}) {
    JobSubmission submission;
    auto config = ParseJobConfig(JobYaml(out_, super_nodes, steps), "job.yaml",
                                 overrides);
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return "";
    submission.config = *std::move(config);
    auto id = process_->jobs.Submit(std::move(submission));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or("");
  }

  StepPlan Plan(const std::string& job, const std::string& node, int64_t step) {
    auto plan =
        process_->jobs.GetStepPlan(job, node, 0, step, absl::ZeroDuration());
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.value_or(StepPlan());
  }

  absl::StatusOr<bool> Finish(const std::string& job, const std::string& node,
                              const StepPlan& plan) {
    StepReport r;
    r.job_id = job;
    r.node_id = node;
    r.step = plan.step;
    r.attempt = plan.attempt;
    if (plan.rank == 0) r.metrics = {{"step", static_cast<double>(plan.step)}};
    return process_->jobs.FinishStep(r, absl::ZeroDuration());
  }

  // The "step" of every metrics.jsonl line.
  std::vector<int64_t> MetricsSteps() {
    std::vector<int64_t> steps;
    std::ifstream in(out_ + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const size_t at = line.find("\"step\":");
      steps.push_back(
          at == std::string::npos ? -1 : std::stoll(line.substr(at + 7)));
    }
    return steps;
  }

  JobStatus Status(const std::string& job) {
    auto st = process_->jobs.Status(job);
    EXPECT_TRUE(st.ok()) << st.status();
    return st.value_or(JobStatus());
  }

  FakeClock clock_;
  std::string dir_, out_;
  std::unique_ptr<Process> process_;
};

TEST_F(ControllerStateTest, ATwoNodeJobContinuesFromItsLastCommittedStep) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string job = Submit(2, 4);
  StepPlan pa = Plan(job, a, 0), pb = Plan(job, b, 0);
  ASSERT_EQ(pa.kind, PlanKind::kTrain);
  // Step 1 commits once both finished (FinishStep waits for the other; the
  // first call's deadline is now, so it answers not-committed-yet).
  (void)Finish(job, a, pa);
  ASSERT_TRUE(Finish(job, b, pb).value_or(false));
  const StepPlan a2 = Plan(job, a, 2);
  ASSERT_EQ(a2.step, 2);
  EXPECT_EQ(Status(job).step, 1);

  Restart();  // mid step 2

  JobStatus st = Status(job);
  EXPECT_EQ(st.phase, JobPhase::kRunning) << st.message;
  EXPECT_EQ(st.step, 1);
  EXPECT_EQ(st.groups_trained, 4);
  EXPECT_EQ(process_->registry.alive_count(), 2);
  // Step 2 spanned two nodes: replanned as attempt 2, same groups, a new
  // rendezvous generation; a's old attempt is refused.
  EXPECT_FALSE(Finish(job, a, a2).value_or(true));
  pa = Plan(job, a, 2);
  pb = Plan(job, b, 2);
  EXPECT_EQ(pa.attempt, 2);
  EXPECT_EQ(pa.groups, a2.groups);
  EXPECT_GT(pa.rendezvous_generation, a2.rendezvous_generation);
  bool event = false;
  const JobStatus restarted = Status(job);
  for (const JobEvent& e : restarted.events) {
    event = event || absl::StrContains(e.text, "controller restarted");
  }
  EXPECT_TRUE(event);
  for (int64_t step = 2; step <= 4; ++step) {
    pa = Plan(job, a, step);
    pb = Plan(job, b, step);
    (void)Finish(job, a, pa);
    ASSERT_TRUE(Finish(job, b, pb).value_or(false)) << step;
    if (step == 3) Restart();  // between steps too
  }
  const StepPlan end = Plan(job, a, 5);
  ASSERT_EQ(end.kind, PlanKind::kEnd);
  StepReport done;
  done.job_id = job;
  done.node_id = a;
  done.step = end.step;
  ASSERT_TRUE(process_->jobs.FinishStep(done, absl::ZeroDuration()).ok());
  st = Status(job);
  EXPECT_EQ(st.phase, JobPhase::kSucceeded) << st.message;
  EXPECT_EQ(st.groups_trained, 16);
  EXPECT_EQ(st.groups_submitted, 16);
  EXPECT_THAT(MetricsSteps(), ::testing::ElementsAre(1, 2, 3, 4));
  // A finished job is remembered as finished.
  Restart();
  EXPECT_EQ(Status(job).phase, JobPhase::kSucceeded);
  // New ids and jobs never reuse old ones.
  const std::string c = AddNode("c");
  EXPECT_EQ(c, "node-3");
  EXPECT_EQ(Submit(1, 1), "job-2");
}

TEST_F(ControllerStateTest, ASingleNodeStepInFlightIsKeptAndCommitsOnce) {
  const std::string a = AddNode("a");
  const std::string job = Submit(1, 2);
  const StepPlan p1 = Plan(job, a, 0);
  ASSERT_EQ(p1.kind, PlanKind::kTrain);
  Restart();  // the card trains step 1 meanwhile
  // Its plan is the same one, and its report commits it.
  const StepPlan again = Plan(job, a, 1);
  EXPECT_EQ(again.attempt, p1.attempt);
  EXPECT_EQ(again.groups, p1.groups);
  ASSERT_TRUE(Finish(job, a, p1).value_or(false));
  Restart();  // after the commit: a retried report is still "committed"
  EXPECT_TRUE(Finish(job, a, p1).value_or(false));
  EXPECT_EQ(Status(job).step, 1);
  EXPECT_EQ(Status(job).groups_trained, 4);
  const StepPlan p2 = Plan(job, a, 2);
  ASSERT_TRUE(Finish(job, a, p2).value_or(false));
  EXPECT_THAT(MetricsSteps(), ::testing::ElementsAre(1, 2));
}

// StaleSync clock skew: the controller is killed after it committed a
// weight sync (the journal holds the commit) and before the node whose
// report committed it heard the answer. The restarted controller rolls the
// job back to that very sync and answers the retried report "not
// committed" (an attempt it rolled back), so a card must keep a sync it
// finished whatever the answer
// (CardRunnerTest/SkewedControllerRestartTest).
TEST_F(ControllerStateTest,
       ASkewedJobRollsBackToTheSyncWhoseCommitsAnswerWasLost) {
  const std::string a = AddNode("a"), b = AddNode("b");
  const std::string job =
      Submit(2, 4, {"stalesync.max_clock_skew=1", "run.checkpoint_every=2"});
  for (int64_t step = 1; step <= 2; ++step) {
    const StepPlan pa = Plan(job, a, step == 1 ? 0 : step);
    const StepPlan pb = Plan(job, b, step == 1 ? 0 : step);
    ASSERT_EQ(pa.kind, PlanKind::kTrain);
    ASSERT_EQ(pb.kind, PlanKind::kTrain);
    ASSERT_TRUE(pa.exchange_updates);
    EXPECT_EQ(pa.sync_weights, step == 2);
    EXPECT_EQ(pa.rollback_to_step, -1);
    ASSERT_TRUE(Finish(job, a, pa).value_or(false));
    if (step < 2) {
      ASSERT_TRUE(Finish(job, b, pb).value_or(false));
      continue;
    }
    ASSERT_TRUE(Finish(job, b, pb).ok());  // commits the sync of step 2...
    EXPECT_EQ(Status(job).step, 2);
    Restart();  // ...and its answer is lost: b retries
    EXPECT_FALSE(Finish(job, b, pb).value_or(true));
  }
  // Both go on from the sync b was told did not commit.
  for (const std::string& node : {a, b}) {
    const StepPlan p3 = Plan(job, node, 3);
    ASSERT_EQ(p3.kind, PlanKind::kTrain);
    EXPECT_EQ(p3.step, 3);
    EXPECT_EQ(p3.attempt, 2);
    EXPECT_EQ(p3.rollback_to_step, 2);
  }
  EXPECT_EQ(Status(job).step, 2);
  EXPECT_THAT(MetricsSteps(), ::testing::ElementsAre(1, 2));
}

// A crash inside a compaction, after the new snapshot was renamed into
// place and before the journal was emptied: the journal's records are all
// in the snapshot already and must not be applied again (a job state older
// than the snapshot's would undo a commit).
TEST_F(ControllerStateTest,
       ACrashBetweenSnapshotAndJournalTruncationLosesNothing) {
  const std::string a = AddNode("a");
  const std::string job = Submit(1, 3);
  ASSERT_TRUE(Finish(job, a, Plan(job, a, 0)).value_or(false));
  // Records older than the snapshot below (up to step 1), as a journal
  // whose emptying the crash prevented holds.
  std::filesystem::copy_file(dir_ + "/journal", dir_ + "/journal.before");
  ASSERT_TRUE(Finish(job, a, Plan(job, a, 2)).value_or(false));
  Restart();  // compacts: the snapshot holds steps 1 and 2
  EXPECT_EQ(Status(job).step, 2);
  process_.reset();
  std::filesystem::rename(dir_ + "/journal.before", dir_ + "/journal");
  Restart();
  EXPECT_EQ(Status(job).step, 2);
  EXPECT_EQ(Status(job).groups_trained, 8);
  ASSERT_TRUE(Finish(job, a, Plan(job, a, 3)).value_or(false));
  EXPECT_THAT(MetricsSteps(), ::testing::ElementsAre(1, 2, 3));
}

TEST_F(ControllerStateTest, ADamagedJournalTailIsDroppedAndTheRestRestored) {
  const std::string a = AddNode("a");
  const std::string job = Submit(1, 3);
  ASSERT_TRUE(Finish(job, a, Plan(job, a, 0)).value_or(false));
  process_.reset();
  {
    // A crash in the middle of a write: half a record at the end.
    std::ofstream f(dir_ + "/journal", std::ios::app | std::ios::binary);
    f.write("\x40\x00\x00\x00garbage", 11);
  }
  process_ = std::make_unique<Process>(clock_, dir_);
  ASSERT_NE(process_->state, nullptr);
  EXPECT_EQ(Status(job).step, 1);
  EXPECT_EQ(Status(job).phase, JobPhase::kRunning);
  // A damaged snapshot is refused outright.
  process_.reset();
  {
    std::fstream f(dir_ + "/snapshot",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    f.put('X');
  }
  NodeRegistry registry(clock_, absl::Seconds(10));
  JobManager jobs(registry, clock_);
  auto s = ControllerState::Open(dir_, registry, jobs);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("damaged"));
}

}  // namespace
}  // namespace fusionrl
