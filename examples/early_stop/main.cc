// An observer that watches every step and stops the job once the batch
// reward reaches a threshold. The job then finishes the step in progress,
// writes a checkpoint and ends CANCELLED: `RunOptions::resume` (or
// `fusionrl run --resume`) continues it.
//
//   early_stop OUTPUT_DIR [THRESHOLD]
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <string>

#include "fusionrl/config.h"
#include "fusionrl/job.h"
#include "fusionrl/observer.h"

namespace {

class StopAtReward : public fusionrl::StepObserver {
 public:
  explicit StopAtReward(double threshold) : threshold_(threshold) {}

  // Runs on the job's observer thread, one callback at a time, with no lock
  // of the job held: printing, logging to your tracker, blocking are fine.
  fusionrl::ObserverAction OnStep(const fusionrl::StepMetrics& m) override {
    std::cout << "step " << m.step << "  reward " << std::fixed
              << std::setprecision(3) << m.reward_mean << "  acc "
              << m.train_accuracy << "  " << std::setprecision(0)
              << m.tokens_per_second << " tok/s  staleness " << m.max_staleness
              << "  entropy " << std::setprecision(3) << m.fields.at("entropy")
              << "\n";
    last_step_ = m.step;
    if (m.reward_mean >= threshold_ && stopped_at_ == 0) {
      stopped_at_ = m.step;
      std::cout << "reward " << m.reward_mean << " >= " << threshold_
                << ": stopping\n";
      return fusionrl::ObserverAction::kStop;
    }
    return fusionrl::ObserverAction::kContinue;
  }
  fusionrl::ObserverAction OnEval(const fusionrl::EvalMetrics& e) override {
    std::cout << "eval at step " << e.step << ": " << e.accuracy << "\n";
    return fusionrl::ObserverAction::kContinue;
  }
  void OnCheckpoint(const fusionrl::CheckpointInfo& c) override {
    std::cout << "checkpoint after step " << c.step << ": " << c.path << "\n";
    checkpoints_++;
  }

  int64_t stopped_at() const { return stopped_at_; }
  int64_t last_step() const { return last_step_; }
  int checkpoints() const { return checkpoints_; }

 private:
  const double threshold_;
  int64_t stopped_at_ = 0;
  int64_t last_step_ = 0;
  int checkpoints_ = 0;
};

constexpr char kJob[] = R"yaml(
name: early-stop-example
num_threads: 1
model: {d_model: 32, n_layers: 2, n_heads: 4, d_ff: 64, max_seq_len: 32}
task: {name: reverse, min_digits: 1, max_digits: 2, eval_size: 20}
rollout: {prompts_per_step: 8, group_size: 4, max_new_tokens: 4}
optim: {lr: 3.0e-3, warmup_steps: 2}
run: {total_steps: 200, eval_every: 5}
)yaml";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: early_stop OUTPUT_DIR [THRESHOLD]\n";
    return 2;
  }
  const double threshold = argc > 2 ? std::atof(argv[2]) : 0.5;
  absl::StatusOr<fusionrl::JobConfig> config = fusionrl::ParseJobConfig(
      kJob, "early_stop/main.cc", {std::string("output_dir=") + argv[1]});
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 2;
  }
  StopAtReward observer(threshold);
  fusionrl::RunOptions options;
  options.observer = &observer;
  absl::StatusOr<fusionrl::JobSummary> summary =
      fusionrl::RunRlJob(*config, options);
  if (!summary.ok()) {
    std::cerr << "job failed: " << summary.status().message() << "\n";
    return 1;
  }
  std::cout << (summary->interrupted ? "stopped early" : "ran to the end")
            << " after step " << summary->steps << " of "
            << config->run.total_steps << " (observer saw "
            << observer.last_step() << " steps, " << observer.checkpoints()
            << " checkpoint(s)); "
            << "final checkpoint " << summary->checkpoint_dir << "\n";
  // The job ends after the step that runs when the request arrives (the
  // observer sees steps up to a poll interval late, so a few may follow k).
  if (observer.stopped_at() > 0 &&
      (!summary->interrupted || summary->steps >= config->run.total_steps)) {
    std::cerr << "the job did not stop after the observer asked\n";
    return 1;
  }
  return 0;
}
