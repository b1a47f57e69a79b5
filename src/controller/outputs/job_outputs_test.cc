// JobOutputs: the files of a job are written in the order their ops were
// queued, whichever thread flushes, and a job's Close is reported only after
// everything queued before it is on disk.
#include "controller/outputs/job_outputs.h"

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/checkpoint_meta.h"
#include "core/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Result = JobOutputs::Result;

std::string Dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/job-outputs-" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

JobOutputs::OpenSpec Spec(const std::string& dir) {
  JobOutputs::OpenSpec spec;
  spec.output_dir = dir;
  spec.config_yaml = "name: test\n";
  return spec;
}

std::string Step(int64_t step) { return absl::StrCat("{\"step\":", step, "}"); }

TEST(JobOutputsTest, WritesConfigMetricsAndSummaryInQueueOrder) {
  const std::string dir = Dir("basic");
  JobOutputs out;
  out.Open("job-1", Spec(dir));
  out.Append("job-1", Step(1));
  out.Append("job-1", Step(2));
  JobSummary summary;
  summary.kind = "rl";
  summary.steps = 2;
  summary.summary_path = dir + "/summary.json";
  out.Close("job-1", summary);
  EXPECT_EQ(out.pending(), 4);
  // Nothing is written before a flush.
  EXPECT_FALSE(std::filesystem::exists(dir + "/config.yaml"));
  std::vector<Result> results;
  out.Flush([&](const Result& r) { results.push_back(r); });
  EXPECT_EQ(out.pending(), 0);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].kind, Result::Kind::kOpened);
  EXPECT_TRUE(results[0].status.ok()) << results[0].status;
  EXPECT_EQ(results[1].kind, Result::Kind::kClosed);
  EXPECT_TRUE(results[1].wrote_summary);
  EXPECT_THAT(results[1].summary_json, HasSubstr("\"steps\": 2"));
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/checkpoints"));
  EXPECT_EQ(ReadTextFile(dir + "/config.yaml", "config").value_or(""),
            "name: test\n");
  EXPECT_THAT(Lines(dir + "/metrics.jsonl"), ElementsAre(Step(1), Step(2)));
  // Flushing again with nothing queued does nothing.
  out.Flush([&](const Result&) { ADD_FAILURE() << "no op was queued"; });
}

// A job that ends while its writes are pending: its Close is reported only
// after the appends queued before it are on disk, so the manager publishes
// the end only once metrics.jsonl is complete.
TEST(JobOutputsTest, CloseIsReportedAfterThePendingAppends) {
  const std::string dir = Dir("close");
  JobOutputs out;
  out.Open("job-1", Spec(dir));
  for (int s = 1; s <= 50; ++s) out.Append("job-1", Step(s));
  out.Close("job-1", std::nullopt);
  size_t lines_at_close = 0;
  out.Flush([&](const Result& r) {
    if (r.kind == Result::Kind::kClosed) {
      lines_at_close = Lines(dir + "/metrics.jsonl").size();
      EXPECT_FALSE(r.wrote_summary);
      EXPECT_TRUE(r.status.ok());
    }
  });
  EXPECT_EQ(lines_at_close, 50u);
  // After the Close, lines of that job are dropped (the log is closed).
  out.Append("job-1", Step(51));
  out.Flush([](const Result&) {});
  EXPECT_EQ(Lines(dir + "/metrics.jsonl").size(), 50u);
}

// Many threads queue under their own lock (as the manager does under its
// mutex) and flush after releasing it: the file holds the records in the
// order they were queued, and every thread's records are on disk when its
// Flush returns.
TEST(JobOutputsTest, ConcurrentFlushesKeepTheQueueOrder) {
  const std::string dir = Dir("concurrent");
  JobOutputs out;
  out.Open("job-1", Spec(dir));
  out.Flush([](const Result&) {});
  absl::Mutex mu;
  int64_t next = 1;
  constexpr int kThreads = 4, kPerThread = 200;
  std::vector<std::thread> threads;
  std::atomic<int> short_reads{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        int64_t mine = 0;
        {
          absl::MutexLock lock(&mu);
          mine = next++;
          out.Append("job-1", Step(mine));
        }
        out.Flush([](const Result&) {});
        // Everything queued before this Flush (our record included) is on
        // disk now.
        if (Lines(dir + "/metrics.jsonl").size() < static_cast<size_t>(mine)) {
          ++short_reads;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(short_reads.load(), 0);
  const std::vector<std::string> lines = Lines(dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), static_cast<size_t>(kThreads * kPerThread));
  for (size_t i = 0; i < lines.size(); ++i) {
    ASSERT_EQ(lines[i], Step(static_cast<int64_t>(i) + 1)) << "line " << i;
  }
}

// A resumed job in the same output_dir: the first job's Close comes before
// the second job's Open, which keeps the steps up to the checkpoint.
TEST(JobOutputsTest, AResumeInTheSameDirectoryFollowsTheFirstJob) {
  const std::string dir = Dir("resume");
  JobOutputs out;
  out.Open("job-1", Spec(dir));
  for (int s = 1; s <= 5; ++s) out.Append("job-1", Step(s));
  out.Close("job-1", std::nullopt);
  JobOutputs::OpenSpec resume = Spec(dir);
  resume.resume_after_step = 3;
  out.Open("job-2", resume);
  out.Append("job-2", Step(4));
  out.Flush([](const Result& r) { EXPECT_TRUE(r.status.ok()) << r.status; });
  EXPECT_THAT(Lines(dir + "/metrics.jsonl"),
              ElementsAre(Step(1), Step(2), Step(3), Step(4)));
}

TEST(JobOutputsTest, AnOpenThatFailsIsReportedAndItsJobWritesNothing) {
  const std::string file = Dir("not-a-dir");
  ASSERT_TRUE(WriteFileAtomic(file, "x").ok());
  JobOutputs out;
  out.Open("job-1", Spec(file + "/out"));
  out.Append("job-1", Step(1));
  JobSummary summary;
  summary.summary_path = file + "/out/summary.json";
  out.Close("job-1", summary);
  std::vector<Result> results;
  out.Flush([&](const Result& r) { results.push_back(r); });
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(results[0].status.message(), HasSubstr("output_dir"));
  EXPECT_FALSE(results[1].wrote_summary);
  EXPECT_FALSE(results[1].status.ok());
}

TEST(JobOutputsTest, RunTotalsGoNextToTheCheckpointAndReadBack) {
  const std::string dir = Dir("totals");
  const std::string ckpt = dir + "/checkpoints/step_4";
  JobOutputs out;
  out.Open("job-1", Spec(dir));
  out.Flush([](const Result&) {});
  std::filesystem::create_directories(ckpt);
  // Not written yet: nothing to read.
  EXPECT_EQ(ReadRunTotals(ckpt).status().code(), absl::StatusCode::kNotFound);
  RunTotals totals;
  totals.initial_eval_accuracy = 0.25;
  totals.last_eval_accuracy = 0.5;
  totals.rollout_tokens = 12345;
  totals.loop_seconds = 6.75;
  totals.controller_tensor_bytes = 4096;
  out.SaveRunTotals("job-1", ckpt, totals);
  EXPECT_EQ(out.pending(), 1);  // queued, not written
  out.Flush([](const Result&) {});
  absl::StatusOr<RunTotals> read = ReadRunTotals(ckpt);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->initial_eval_accuracy, 0.25);
  EXPECT_EQ(read->last_eval_accuracy, 0.5);
  EXPECT_EQ(read->rollout_tokens, 12345);
  EXPECT_EQ(read->loop_seconds, 6.75);
  EXPECT_EQ(read->controller_tensor_bytes, 4096);
  // A torn run.json is an error, not zeros.
  std::ofstream(ckpt + "/run.json") << "{\"rollout_tokens\": ";
  EXPECT_EQ(ReadRunTotals(ckpt).status().code(), absl::StatusCode::kDataLoss);
}

TEST(JobOutputsTest, RunTotalsOfAnOlderCheckpointComeFromItsMeta) {
  const std::string ckpt = Dir("legacy");
  std::filesystem::create_directories(ckpt);
  std::ofstream(ckpt + "/meta.json")
      << "{\"kind\":\"rl\",\"step\":3,\"rollout_tokens\":99,"
         "\"loop_seconds\":1.5,\"initial_eval_accuracy\":0.1,"
         "\"last_eval_accuracy\":0.2}";
  absl::StatusOr<RunTotals> read = ReadRunTotals(ckpt);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->rollout_tokens, 99);
  EXPECT_EQ(read->loop_seconds, 1.5);
  EXPECT_EQ(read->last_eval_accuracy, 0.2);
  // A meta.json of today (no totals) has none to give.
  std::ofstream(ckpt + "/meta.json") << "{\"kind\":\"rl\",\"step\":3}";
  EXPECT_EQ(ReadRunTotals(ckpt).status().code(), absl::StatusCode::kNotFound);
}

// The lead writes a step's checkpoint before the step commits; run.json
// comes with the commit. A resume takes the newest committed checkpoint:
// one whose step was aborted afterwards (found by the chaos soak: a node
// lost during step 72 left checkpoints/step_72, and the resume skipped
// step 72's record and prompt groups) is skipped and named.
TEST(JobOutputsTest, AResumeSkipsACheckpointWhoseStepNeverCommitted) {
  const std::string dir = Dir("uncommitted") + "/checkpoints";
  auto checkpoint = [&](const std::string& name, int step, bool committed) {
    const std::string ckpt = dir + "/" + name;
    std::filesystem::create_directories(ckpt);
    std::ofstream(ckpt + "/meta.json")
        << "{\"kind\":\"rl\",\"step\":" << step << "}";
    if (committed) std::ofstream(ckpt + "/run.json") << "{}";
    return ckpt;
  };
  const std::string step4 = checkpoint("step_4", 4, true);
  const std::string step8 = checkpoint("step_8", 8, false);
  std::vector<std::string> skipped;
  absl::StatusOr<std::string> latest =
      FindLatestCheckpoint(dir, /*committed_only=*/true, &skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, step4);
  EXPECT_EQ(skipped, std::vector<std::string>{step8});
  // Without the filter (an SFT or export lookup) the newest is step 8.
  EXPECT_EQ(FindLatestCheckpoint(dir).value(), step8);
  // Nothing committed: NotFound naming what was there.
  std::filesystem::remove(step4 + "/run.json");
  absl::Status st = FindLatestCheckpoint(dir, true).status();
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("step_8"));
  EXPECT_THAT(std::string(st.message()),
              ::testing::HasSubstr("never committed"));
}

TEST(FormatStepRecordTest, TypedMetricsAndTheirJsonGiveTheSameLine) {
  const MetricFields metrics = {{"step", 3},
                                {"reward_mean", 0.25},
                                {"kl", 0.125},
                                {"response_len_mean", 4.5},
                                {"nan", std::nan("")}};
  const StepRecordLine typed = FormatStepRecord(metrics, "", {});
  EXPECT_EQ(typed.json,
            "{\"step\":3,\"reward_mean\":0.25,\"kl\":0.125,"
            "\"response_len_mean\":4.5,\"nan\":null}");
  EXPECT_EQ(typed.kl, 0.125);
  EXPECT_EQ(typed.response_len_mean, 4.5);
  // The wire form (the worker's MetricRecordToJson) gives the same line.
  const StepRecordLine wire =
      FormatStepRecord({}, MetricRecordToJson(metrics), {});
  EXPECT_EQ(wire.json, typed.json);
  EXPECT_EQ(wire.kl, typed.kl);
  // The controller's fields go last, the same either way; one the record
  // already has keeps its place and takes the controller's value.
  const MetricFields job_fields = {
      {"tokens_per_second", 12.5}, {"clock_skew", 1}, {"kl", 0.5}};
  const std::string merged = FormatStepRecord(metrics, "", job_fields).json;
  EXPECT_EQ(merged,
            "{\"step\":3,\"reward_mean\":0.25,\"kl\":0.5,"
            "\"response_len_mean\":4.5,\"nan\":null,"
            "\"tokens_per_second\":12.5,\"clock_skew\":1}");
  EXPECT_EQ(FormatStepRecord({}, MetricRecordToJson(metrics), job_fields).json,
            merged);
}

TEST(FormatStepRecordTest, NoRecordWithoutMetricsOrFromAJsonThatIsNoObject) {
  EXPECT_EQ(FormatStepRecord({}, "", {{"clock_skew", 1}}).json, "");
  EXPECT_EQ(FormatStepRecord({}, "[1, 2]", {}).json, "");
  EXPECT_EQ(FormatStepRecord({}, "not json", {}).json, "");
  EXPECT_EQ(FormatStepRecord({}, "{\"step\": 1}", {}).json, "{\"step\":1}");
}

}  // namespace
}  // namespace fusionrl
