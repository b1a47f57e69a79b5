// `fusionrl bench`: one job under several placement modes, side by side,
// repeated and interleaved; writes JSON with every run and, per mode, the
// medians and the ratio to colocated-sync (docs/BENCHMARKS.md). Every run
// is a fresh process (this binary, `bench --run-one`): runs in one process
// slowed run after run (allocator and thread-pool state carried over), which
// biased every ratio towards the modes run first.
#ifndef FUSIONRL_CLI_BENCH_BENCH_CLI_H_
#define FUSIONRL_CLI_BENCH_BENCH_CLI_H_

#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace fusionrl::cli {

struct BenchArgs {
  std::string config_path;
  std::string modes = "colocated-sync,disaggregated,fused,fused+stalesync:2";
  int repeats = 3;
  int steps = 0;  // 0 = the config's run.total_steps
  std::string out;
  std::string work_dir;
  std::string init_checkpoint;
  std::vector<std::string> overrides;
  int timeout_seconds = 7200;  // per run
  // Held-out evaluation every this many steps (and after the last), for
  // time to accuracy; 0 = only the final evaluation.
  int eval_every = 5;
  // Time to accuracy's target: colocated-sync's median final accuracy
  // minus this.
  double accuracy_margin = 0.02;
  // Internal: run `modes` (one mode) once here as run number `run_one` and
  // print its JSON line; init_checkpoint and work_dir must be set.
  int run_one = 0;
};

CLI::App* AddBenchCommand(CLI::App& app, BenchArgs& args);

// Runs the benchmark (each run in a child process, interleaved per repeat).
// Returns the exit code.
int RunBench(const BenchArgs& args);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_BENCH_BENCH_CLI_H_
