// The public job API (include/fusionrl/job.h, observer.h, cluster.h): a
// StepObserver sees every step, evaluation and checkpoint in order on the
// observer thread and can stop the job; a Job handle reports progress,
// cancels and waits with a deadline; a job submitted to a ControllerServer
// with WorkerAgents in this process runs to the end.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/test_util.h"
#include "fusionrl/cluster.h"
#include "fusionrl/job.h"
#include "fusionrl/observer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;

JobConfig TinyJob(const std::string& out, int steps) {
  JobConfig c;
  c.name = "handle-test";
  c.num_threads = 1;
  c.output_dir = ::testing::TempDir() + "/" + out;
  c.model = testing_util::TinyModelConfig();
  c.task.name = "reverse";
  c.task.min_digits = 1;
  c.task.max_digits = 3;
  c.task.eval_size = 10;
  c.rollout.prompts_per_step = 4;
  c.rollout.group_size = 2;
  c.rollout.max_new_tokens = 4;
  c.run.total_steps = steps;
  return c;
}

// Everything an observer saw, and on which thread.
class Recorder : public StepObserver {
 public:
  ObserverAction OnStep(const StepMetrics& m) override {
    std::lock_guard<std::mutex> lock(mu_);
    steps.push_back(m.step);
    jsons.push_back(m.json);
    threads.push_back(std::this_thread::get_id());
    if (job != nullptr) progress_calls.push_back(job->Progress().step);
    entropy_seen = entropy_seen || m.fields.count("entropy") > 0;
    return stop_at > 0 && m.step >= stop_at ? ObserverAction::kStop
                                            : ObserverAction::kContinue;
  }
  ObserverAction OnEval(const EvalMetrics& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    evals.push_back(e.step);
    return ObserverAction::kContinue;
  }
  void OnCheckpoint(const CheckpointInfo& c) override {
    std::lock_guard<std::mutex> lock(mu_);
    checkpoints.push_back(c.path);
  }

  int64_t stop_at = 0;
  Job* job = nullptr;  // for calls back into the handle
  std::mutex mu_;
  std::vector<int64_t> steps, evals, progress_calls;
  std::vector<std::string> jsons, checkpoints;
  std::vector<std::thread::id> threads;
  bool entropy_seen = false;
};

std::vector<std::string> MetricsLines(const std::string& output_dir) {
  std::ifstream in(output_dir + "/metrics.jsonl");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(JobHandleTest, ObserverSeesEveryStepEvalAndCheckpointInOrder) {
  JobConfig c = TinyJob("observer", 6);
  c.run.eval_every = 3;
  c.run.checkpoint_every = 2;
  Recorder rec;
  RunOptions options;
  options.observer = &rec;
  options.poll_interval = absl::Milliseconds(20);
  auto job = Job::Start(c, options);
  ASSERT_TRUE(job.ok()) << job.status();
  {
    std::lock_guard<std::mutex> lock(rec.mu_);
    rec.job = job->get();  // the observer calls back into the handle
  }
  absl::StatusOr<JobSummary> summary = (*job)->Wait(absl::Minutes(5));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->steps, 6);
  EXPECT_FALSE(summary->interrupted);
  // Each step once, in order, with the very record metrics.jsonl holds.
  EXPECT_EQ(rec.steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(rec.jsons, MetricsLines(c.output_dir));
  EXPECT_TRUE(rec.entropy_seen);
  // One thread for every callback, not the caller's.
  for (const auto& t : rec.threads) EXPECT_EQ(t, rec.threads.front());
  EXPECT_NE(rec.threads.front(), std::this_thread::get_id());
  // The initial evaluation and the periodic ones.
  ASSERT_GE(rec.evals.size(), 2u);
  EXPECT_EQ(rec.evals[0], 0);
  EXPECT_EQ(rec.evals[1], 3);
  // step_2, step_4, step_6 and the final one; every path exists.
  ASSERT_GE(rec.checkpoints.size(), 3u);
  EXPECT_THAT(rec.checkpoints[0], HasSubstr("step_2"));
  for (const std::string& p : rec.checkpoints) {
    EXPECT_TRUE(std::filesystem::exists(p)) << p;
  }
  // Wait returned after the last callback; Progress says it is done.
  EXPECT_EQ((*job)->Progress().phase, JobPhase::kSucceeded);
  EXPECT_EQ((*job)->Progress().step, 6);
}

TEST(JobHandleTest, AnObserverStopEndsTheJobCancelledWithACheckpoint) {
  JobConfig c = TinyJob("observer-stop", 200);
  Recorder rec;
  rec.stop_at = 2;
  RunOptions options;
  options.observer = &rec;
  options.poll_interval = absl::Milliseconds(20);
  absl::StatusOr<JobSummary> summary = RunRlJob(c, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->interrupted);
  EXPECT_GE(summary->steps, 2);
  EXPECT_LT(summary->steps, 200);
  EXPECT_TRUE(std::filesystem::exists(summary->checkpoint_dir))
      << summary->checkpoint_dir;
  EXPECT_EQ(static_cast<int64_t>(MetricsLines(c.output_dir).size()),
            summary->steps);
}

TEST(JobHandleTest, CancelStopsARunningJobAndWaitHasADeadline) {
  auto job = Job::Start(TinyJob("cancel", 1000));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT((*job)->id(), HasSubstr("job-"));
  absl::StatusOr<JobSummary> early = (*job)->Wait(absl::Milliseconds(1));
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(early.status().message(), HasSubstr((*job)->id()));
  const absl::Time by = absl::Now() + absl::Minutes(2);
  while ((*job)->Progress().step < 1 && absl::Now() < by) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GE((*job)->Progress().step, 1);
  EXPECT_EQ((*job)->Progress().phase, JobPhase::kRunning);
  ASSERT_TRUE((*job)->Cancel().ok());
  ASSERT_TRUE((*job)->Cancel().ok());  // idempotent
  absl::StatusOr<JobSummary> summary = (*job)->Wait(absl::Minutes(2));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->interrupted);
  EXPECT_LT(summary->steps, 1000);
  EXPECT_EQ((*job)->Progress().phase, JobPhase::kCancelled);
}

TEST(JobHandleTest, BadInputIsRefusedBeforeAnythingStarts) {
  JobConfig c = TinyJob("bad", 2);
  c.rollout.group_size = 0;
  auto job = Job::Start(c);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("rollout.group_size"));
  RunOptions options;
  options.poll_interval = absl::ZeroDuration();
  auto zero = Job::Start(TinyJob("bad2", 2), options);
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(zero.status().message(), HasSubstr("poll_interval"));
  EXPECT_FALSE(std::filesystem::exists(c.output_dir));
}

TEST(ClusterApiTest, AJobSubmittedToAControllerServerRunsOnItsWorkers) {
  ControllerServerOptions copts;
  copts.http_address = "127.0.0.1:0";
  auto controller = ControllerServer::Start(copts);
  ASSERT_TRUE(controller.ok()) << controller.status();
  EXPECT_THAT((*controller)->address(), HasSubstr("127.0.0.1:"));
  EXPECT_THAT((*controller)->http_address(), HasSubstr("127.0.0.1:"));
  std::vector<std::unique_ptr<WorkerAgent>> workers;
  for (const char* sn : {"a", "b"}) {
    WorkerAgentOptions w;
    w.controller_address = (*controller)->address();
    w.super_node = sn;
    w.threads = 1;
    auto worker = WorkerAgent::Start(w);
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(*std::move(worker));
  }
  JobConfig c = TinyJob("cluster-api", 4);
  c.placement.super_nodes = 2;
  c.stalesync.max_clock_skew = 1;
  Recorder rec;
  RunOptions options;
  options.observer = &rec;
  options.poll_interval = absl::Milliseconds(50);
  auto job = Job::Submit((*controller)->address(), c, options);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<JobSummary> summary = (*job)->Wait(absl::Minutes(5));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->steps, 4);
  EXPECT_EQ(rec.steps, (std::vector<int64_t>{1, 2, 3, 4}));
  for (auto& w : workers) {
    EXPECT_FALSE(w->Done());
    EXPECT_TRUE(w->Stop().ok());
    EXPECT_TRUE(w->Done());
  }
  (*controller)->Shutdown(absl::Seconds(5));
}

TEST(ClusterApiTest, BadOptionsAndUnreachableControllersAreNamed) {
  WorkerAgentOptions w;
  auto no_address = WorkerAgent::Start(w);
  ASSERT_FALSE(no_address.ok());
  EXPECT_THAT(no_address.status().message(), HasSubstr("controller_address"));
  w.controller_address = "127.0.0.1:1";
  w.super_node = "bad name";
  auto bad_name = WorkerAgent::Start(w);
  ASSERT_FALSE(bad_name.ok());
  EXPECT_THAT(bad_name.status().message(), HasSubstr("super_node"));
  ControllerServerOptions copts;
  copts.listen_address = "";
  EXPECT_EQ(ControllerServer::Start(copts).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing listens on port 1.
  auto job = Job::Submit("127.0.0.1:1", TinyJob("nowhere", 2));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(job.status().message(), HasSubstr("127.0.0.1:1"));
}

}  // namespace
}  // namespace fusionrl
