// A reward function of your own: partial credit for every character of the
// answer in the right place, instead of the task's all-or-nothing check.
//
//   custom_reward OUTPUT_DIR [STEPS]
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>

#include "fusionrl/config.h"
#include "fusionrl/job.h"
#include "fusionrl/task.h"

namespace {

// Called on the cards' sampling threads, possibly at once: keep it free of
// shared mutable state (docs/embedding.md).
class PositionalMatch : public fusionrl::RewardFn {
 public:
  fusionrl::Verdict Score(const fusionrl::Problem& problem,
                          std::string_view response) const override {
    const std::string& answer = problem.answer;
    size_t same = 0;
    for (size_t i = 0; i < std::min(answer.size(), response.size()); ++i) {
      if (answer[i] == response[i]) ++same;
    }
    const size_t longest = std::max(answer.size(), response.size());
    fusionrl::Verdict v;
    v.reward = longest == 0 ? 0.0 : static_cast<double>(same) / longest;
    v.correct = response == answer;
    return v;
  }
};

constexpr char kJob[] = R"yaml(
name: custom-reward-example
num_threads: 1
model: {d_model: 32, n_layers: 2, n_heads: 4, d_ff: 64, max_seq_len: 32}
task: {name: reverse, min_digits: 1, max_digits: 3, eval_size: 20,
       reward: positional_match}
rollout: {prompts_per_step: 8, group_size: 4, max_new_tokens: 5}
optim: {lr: 1.0e-3, warmup_steps: 2}
run: {total_steps: 4, eval_every: 2}
)yaml";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: custom_reward OUTPUT_DIR [STEPS]\n";
    return 2;
  }
  absl::Status registered = fusionrl::RewardRegistry::Global().Register(
      "positional_match", [] { return std::make_unique<PositionalMatch>(); });
  if (!registered.ok()) {
    std::cerr << registered.message() << "\n";
    return 1;
  }
  std::vector<std::string> overrides = {std::string("output_dir=") + argv[1]};
  if (argc > 2) overrides.push_back(std::string("run.total_steps=") + argv[2]);
  absl::StatusOr<fusionrl::JobConfig> config =
      fusionrl::ParseJobConfig(kJob, "custom_reward/main.cc", overrides);
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<fusionrl::JobSummary> summary = fusionrl::RunRlJob(*config);
  if (!summary.ok()) {
    std::cerr << "job failed: " << summary.status().message() << "\n";
    return 1;
  }
  std::cout << "steps " << summary->steps << ", last batch reward (partial "
            << "credit) " << summary->final_train_reward << ", eval accuracy "
            << summary->initial_eval_accuracy << " -> "
            << summary->final_eval_accuracy << "\n"
            << "summary: " << summary->summary_path << "\n";
  return summary->steps == config->run.total_steps ? 0 : 1;
}
