// `fusionrl bench-memory <config>`: the activation-memory benchmark of
// selective recompute / swap. For a dense and a MoE variant of the config's
// policy, it runs training steps (forward + backward of reference
// solutions) under each activation policy and writes JSON: bytes held for
// backward (device, host pool, and the headline that counts the host pool on
// CPU), median step time, both as ratios to `none`, and the largest
// gradient difference from `none`.
#ifndef FUSIONRL_CLI_BENCH_BENCH_MEMORY_CLI_H_
#define FUSIONRL_CLI_BENCH_BENCH_MEMORY_CLI_H_

#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace fusionrl::cli {

struct BenchMemoryArgs {
  std::string config_path;
  // none | recompute | swap | auto:<budget MiB>, comma-separated.
  std::string policies = "none,recompute,swap";
  int repeats = 5;  // timed steps per (variant, policy)
  // The MoE variant's experts spread over this many cards (threads of this
  // process, a local Gloo group): each holds its shard and its own batch,
  // and card 0's step is measured (placement.expert_parallel).
  int expert_parallel = 1;
  std::string out;  // "" = stdout
  std::vector<std::string> overrides;
};

CLI::App* AddBenchMemoryCommand(CLI::App& app, BenchMemoryArgs& args);

// Returns the exit code.
int RunBenchMemory(const BenchMemoryArgs& args);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_BENCH_BENCH_MEMORY_CLI_H_
