// Helpers of the end-to-end RL job tests (rl_job_*_test.cc): a tiny job
// on the reverse task, the run's metrics read back from metrics.jsonl, and
// the checks that a resumed run equals the uninterrupted one.
#ifndef FUSIONRL_LOCAL_RL_JOB_TEST_UTIL_H_
#define FUSIONRL_LOCAL_RL_JOB_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/test_util.h"
#include "fusionrl/config.h"
#include "fusionrl/job.h"

namespace fusionrl {

// A job of `steps` steps small enough for a unit test, writing under
// TempDir()/`out`; its reward (test_length) is the response length / 5,
// which varies between samples of a random policy, so every step has
// non-zero advantages and really changes the weights.
JobConfig TinyRlJob(const std::string& out, int steps);

// The reward_mean of every record of the run's metrics.jsonl, checking
// that the records are steps 1, 2, ...
std::vector<double> Rewards(const std::string& output_dir);

// One value of every record of the run's metrics.jsonl (-1 where absent).
std::vector<double> Column(const std::string& output_dir,
                           const std::string& key);

// Every prompt group of a fresh run of `groups` groups (ids 0..groups-1)
// was trained exactly once, as the cards report it (count, sum and sum of
// squares of the trained ids, summed over the run's records).
void ExpectEveryGroupTrainedOnce(const std::string& output_dir, int64_t groups);

// The trainable parameters of two checkpoints: bit for bit, or
// (tolerance > 0) within `tolerance` of each other.
void ExpectSameWeights(
    const std::string& dir_a, const std::string& dir_b,
    const ModelConfig& model = testing_util::TinyModelConfig(),
    double tolerance = 0);

// Runs `c` straight through `steps` steps, and again stopped after
// `stop_at` and resumed: the two agree step for step (rewards), in their
// totals and in their final weights.
// `straight`, when set, receives the straight run's summary.
void ExpectExactResume(JobConfig c, int steps, int stop_at,
                       JobSummary* straight = nullptr);

// ExpectExactResume for a job whose rollout runs ahead (fused or
// disaggregated with a lag, rollout_version lagged): the checkpoint
// carries the batches sampled ahead, and the resumed run equals the
// uninterrupted one in its staleness too, with the pipeline full after the
// resume.
void ExpectExactLaggedResume(JobConfig c, int steps, int stop_at);

}  // namespace fusionrl

#endif  // FUSIONRL_LOCAL_RL_JOB_TEST_UTIL_H_
