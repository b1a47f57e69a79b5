// The cluster commands of the `fusionrl` CLI: controller, worker, submit,
// status (docs/cluster.md).
#ifndef FUSIONRL_CLI_CLUSTER_CLI_H_
#define FUSIONRL_CLI_CLUSTER_CLI_H_

#include <atomic>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace fusionrl::cli {

struct ClusterArgs {
  // controller
  std::string listen;
  double heartbeat_interval_s = 1;
  double heartbeat_timeout_s = 10;
  double drain_timeout_s = 600;
  std::string state_dir;
  double reconnect_timeout_s = 60;
  double stall_timeout_s = 1800;
  std::string on_stall = "replan";
  std::string tls_cert, tls_key;
  std::string http;  // --http HOST:PORT
  // worker / clients
  std::string controller;
  int cards = 1;
  std::string super_node;
  std::string device = "cpu";
  int threads = 0;
  int debug_step_delay_ms = 0;
  int debug_checkpoint_delay_ms = 0;
  std::string tls_ca;
  // all
  std::string token_file, token_env;
  // submit
  std::string config_path;
  std::vector<std::string> overrides;
  std::string output_dir;
  bool resume = false;
  bool wait = false;
  // status
  std::string job_id;
  bool json = false;
  bool watch = false;
  double watch_interval_s = 2;
};

struct ClusterCommands {
  CLI::App* controller = nullptr;
  CLI::App* worker = nullptr;
  CLI::App* submit = nullptr;
  CLI::App* status = nullptr;
};

ClusterCommands AddClusterCommands(CLI::App& app, ClusterArgs& args);

// Runs whichever of the commands was parsed; `stop` is set by
// SIGINT/SIGTERM. Returns the process exit code (0 ok, 1 failure, 2 bad
// input, 130 a job that ended cancelled with --wait).
int RunClusterCommand(const ClusterCommands& commands, const ClusterArgs& args,
                      const std::atomic<bool>& stop);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_CLUSTER_CLI_H_
