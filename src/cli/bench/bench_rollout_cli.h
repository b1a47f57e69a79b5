// `fusionrl bench-rollout <config>`: the engine benchmark. For the config's
// policy shape and rollout batch (random weights, random prompts of
// --prompt-len tokens, every response exactly max_new_tokens long so each
// side does the same work) it measures, each in a fresh process and
// alternating, --repeats times:
//   fused      FusionRL's rollout engine (CpuDecoder where it applies) and
//              trainer;
//   composite  the same with the composite decode path and attention core
//              (model.attention_kernel: composite): the engine before the
//              fused paths, the reference they are tested against;
//   python     scripts/rollout_reference.py, a PyTorch loop of the same
//              shape (Debian's python3-torch).
// Each measurement is the median of --iterations synchronous steps (rollout
// then one trainer step) after a warm-up one. JSON out: per engine the runs
// and medians of rollout tokens/s and whole-step tokens/s, the decode cost
// breakdown (ops dispatched, on any thread, and allocations, on the calling
// thread, per decode step; seconds in prefill / model / sampling / host),
// the training step's achieved GFLOP/s next to this machine's 512^3 sgemm,
// and the ratios fused/python, composite/python and fused/composite.
#ifndef FUSIONRL_CLI_BENCH_BENCH_ROLLOUT_CLI_H_
#define FUSIONRL_CLI_BENCH_BENCH_ROLLOUT_CLI_H_

#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace fusionrl::cli {

struct BenchRolloutArgs {
  std::string config_path;
  std::string engines = "fused,composite,python";
  int repeats = 3;
  int iterations = 5;
  int prompt_len = 12;
  // Stop ids of the C++ engines: the N lowest ids but pad. 0 = none, every
  // response is max_new_tokens long (the Python loop's shape); N > 0 spreads
  // response lengths (each token stops a sequence with about N / vocab
  // probability), the long tail compaction and refills are for.
  int stop_ids = 0;
  // C++ engines: also time K consecutive steps' rollouts sampled in one
  // engine call with one step's worth of slots (continuous batching across
  // steps) against K calls, alternating, in the same process. 1 = off.
  int cross_steps = 1;
  std::string python = "/usr/bin/python3";
  std::string reference_script;  // "" = found next to the binary or source
  int timeout_seconds = 900;     // per measurement
  std::string out;
  std::vector<std::string> overrides;
  // Internal: measure one engine in this process and print its JSON.
  std::string measure;
};

CLI::App* AddBenchRolloutCommand(CLI::App& app, BenchRolloutArgs& args);

// Returns the exit code.
int RunBenchRollout(const BenchRolloutArgs& args);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_BENCH_BENCH_ROLLOUT_CLI_H_
