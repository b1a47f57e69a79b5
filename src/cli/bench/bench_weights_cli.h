// `fusionrl bench-weights`: how fast a weight sync moves bytes on this
// machine, side by side in one run: a memcpy of the serialized weights (the
// ceiling), a broadcast from one rank to the others over a loopback Gloo
// group (the c10d data plane's weight sync, docs/stalesync.md), and a
// publish + fetch through the controller's WeightService on a loopback gRPC
// server (the controller data plane's sync). Each size is measured
// `repeats` times, the three paths interleaved per repeat; the JSON holds
// every run's seconds and, per size and path, the median bytes/s and its
// ratio to memcpy; also one CRC-32C pass over the payload, with the CPU's
// instruction (when it has one) and with the tables. Every receiver's bytes are
// compared with the sender's after each timed run (a mismatch fails the
// benchmark).
#ifndef FUSIONRL_CLI_BENCH_BENCH_WEIGHTS_CLI_H_
#define FUSIONRL_CLI_BENCH_BENCH_WEIGHTS_CLI_H_

#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace fusionrl::cli {

struct BenchWeightsArgs {
  std::string sizes_mib = "16,64,256";  // comma-separated payload sizes
  int ranks = 2;  // broadcast group size / 1 publisher + ranks-1 fetchers
  int repeats = 5;
  std::string out;  // "" = stdout
};

CLI::App* AddBenchWeightsCommand(CLI::App& app, BenchWeightsArgs& args);

// Returns the exit code (2 for a bad --sizes-mib list).
int RunBenchWeights(const BenchWeightsArgs& args);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_BENCH_BENCH_WEIGHTS_CLI_H_
