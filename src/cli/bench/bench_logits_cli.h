// `fusionrl bench-logits <config>`: the memory and time of the LM head and
// loss of one training step, chunked (optim.logits_chunk_tokens) against the
// materialised B x T x V head (chunk 0), side by side on one RL-shaped
// micro-batch of the config's policy. For each chunk setting it writes JSON:
// the peak bytes allocated over forward + backward, the bytes held at the
// end of forward, median step time, both as ratios to chunk 0, and the
// largest log-prob and relative gradient difference from chunk 0.
#ifndef FUSIONRL_CLI_BENCH_BENCH_LOGITS_CLI_H_
#define FUSIONRL_CLI_BENCH_BENCH_LOGITS_CLI_H_

#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace fusionrl::cli {

struct BenchLogitsArgs {
  std::string config_path;
  // Response positions per LM-head chunk, comma-separated; must start with
  // 0 (the materialised head: the reference of every ratio and difference).
  std::string chunks = "0,128,512";
  int repeats = 5;  // timed steps per chunk setting
  std::string out;  // "" = stdout
  std::vector<std::string> overrides;
};

CLI::App* AddBenchLogitsCommand(CLI::App& app, BenchLogitsArgs& args);

// Returns the exit code (2 for a bad --chunks list or config).
int RunBenchLogits(const BenchLogitsArgs& args);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_BENCH_BENCH_LOGITS_CLI_H_
