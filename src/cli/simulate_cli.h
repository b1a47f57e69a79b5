// `fusionrl simulate`: the real controller driven by simulated super nodes
// and cards on a virtual clock (src/sim/, docs/simulate.md); one run per
// mode and super-node count, JSON out.
#ifndef FUSIONRL_CLI_SIMULATE_CLI_H_
#define FUSIONRL_CLI_SIMULATE_CLI_H_

#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace fusionrl::cli {

struct SimulateArgs {
  std::string config_path;
  std::string super_nodes = "1";
  int cards_per_super_node = 8;
  std::string modes = "colocated-sync,fused+stalesync:2:1";
  int steps = 0;  // 0 = the job's run.total_steps
  std::string out;
  std::string work_dir;
  bool keep = false;
  std::string calibrate_from;
  std::vector<std::string> overrides;       // job keys
  std::vector<std::string> cost_overrides;  // cost-model keys
};

CLI::App* AddSimulateCommand(CLI::App& app, SimulateArgs& args);

// Runs every (mode, super nodes) pair; returns the exit code.
int RunSimulate(const SimulateArgs& args);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_SIMULATE_CLI_H_
