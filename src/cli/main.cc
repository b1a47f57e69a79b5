// fusionrl: the command-line entry point.
//
//   fusionrl run  <job.yaml> [--output-dir DIR] [--init-checkpoint DIR]
//                            [--resume] [--set key.path=value ...]
//   fusionrl sft  <job.yaml> [--output-dir DIR] [--init-checkpoint DIR]
//                            [--set key.path=value ...]
//   fusionrl eval <job.yaml> [--checkpoint DIR] [--set key.path=value ...]
//   fusionrl validate <job.yaml> [--set key.path=value ...]
//   fusionrl bench <job.yaml> [--modes a,b,...] [--repeats N] [--out FILE]
//   fusionrl simulate <sim.yaml> [--super-nodes 1,4,16,64] [--modes ...]
//                     [--cards-per-super-node 8] [--out FILE]  (simulate.md)
//   fusionrl bench-weights [--sizes-mib 16,64,256] [--ranks 2] [--out FILE]
//   fusionrl generate --model DIR --prompt TEXT [--chat] [--json] [...]
//   fusionrl export <checkpoint> --out DIR [--dtype bfloat16]
//   fusionrl tokenize --tokenizer DIR [--decode | --bench]   (stdin->stdout)
//   fusionrl chat-template --model DIR [--name NAME] [--now RFC3339]
//                                                            (stdin->stdout)
//   fusionrl controller --listen HOST:PORT [...]      (docs/cluster.md)
//   fusionrl worker --controller HOST:PORT [--cards N] [--super-node NAME]
//   fusionrl submit <job.yaml> --controller HOST:PORT [--wait]
//   fusionrl status --controller HOST:PORT [--job ID] [--json] [--watch]
//   fusionrl plot <run_dir | bench.json> [--out report.html]
//
// Exit codes: 0 success; 2 bad input (config file, key, value, a missing or
// mismatching file, command-line usage); 1 the job failed while running;
// 130 stopped by SIGINT/SIGTERM after checkpointing (continue with --resume).
#include <malloc.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "cli/bench/bench_cli.h"
#include "cli/bench/bench_logits_cli.h"
#include "cli/bench/bench_memory_cli.h"
#include "cli/bench/bench_rollout_cli.h"
#include "cli/bench/bench_weights_cli.h"
#include "cli/chat_template_cli.h"
#include "cli/cluster_cli.h"
#include "cli/common/exit_codes.h"
#include "cli/model_cli.h"
#include "cli/plot/plot_cli.h"
#include "cli/simulate_cli.h"
#include "cli/tokenize_cli.h"
#include "core/config_override.h"
#include "fusionrl/config.h"
#include "fusionrl/job.h"
#include "fusionrl/version.h"
#include "rpc/remote_environment.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace {

using fusionrl::cli::Fail;
using fusionrl::cli::kExitBadInput;

// Set by SIGINT/SIGTERM: the running job finishes its step, checkpoints and
// returns. A second signal exits at once.
std::atomic<bool> g_stop_requested{false};

extern "C" void OnStopSignal(int) {
  if (g_stop_requested.exchange(true)) std::_Exit(130);
}

void InstallStopHandlers() {
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

struct JobArgs {
  std::string config_path;
  bool resume = false;
  std::string output_dir;
  std::string checkpoint;
  std::vector<std::string> overrides;
  std::string http;  // run --http
};

void AddJobArgs(CLI::App* cmd, JobArgs* args, bool with_output_dir) {
  cmd->add_option("config", args->config_path, "job YAML file")->required();
  if (with_output_dir) {
    cmd->add_option("--output-dir,-o", args->output_dir,
                    "write metrics, checkpoints and summary.json here "
                    "(overrides output_dir)");
  }
  cmd->add_option("--init-checkpoint", args->checkpoint,
                  "start from this checkpoint directory (overrides "
                  "init_checkpoint)");
  cmd->add_option("--set", args->overrides,
                  "override a config key: key.path=value (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

absl::StatusOr<fusionrl::JobConfig> LoadConfig(const JobArgs& args) {
  // Flags become overrides, applied last, so that the file's own values for
  // these keys are never checked (e.g. a checkpoint that does not exist yet).
  std::vector<std::string> overrides = args.overrides;
  if (!args.output_dir.empty()) {
    overrides.push_back(
        fusionrl::QuotedOverride("output_dir", args.output_dir));
  }
  if (!args.checkpoint.empty()) {
    overrides.push_back(
        fusionrl::QuotedOverride("init_checkpoint", args.checkpoint));
  }
  return fusionrl::LoadJobConfig(args.config_path, overrides);
}

// Every command's arguments: CLI11 writes into them while parsing, so they
// live as long as the App.
struct AllArgs {
  JobArgs job;
  fusionrl::cli::ClusterArgs cluster;
  fusionrl::cli::PlotArgs plot;
  fusionrl::cli::BenchArgs bench;
  fusionrl::cli::BenchMemoryArgs bench_memory;
  fusionrl::cli::BenchRolloutArgs bench_rollout;
  fusionrl::cli::BenchLogitsArgs bench_logits;
  fusionrl::cli::BenchWeightsArgs bench_weights;
  fusionrl::cli::SimulateArgs simulate;
  fusionrl::cli::TokenizeArgs tokenize;
  fusionrl::cli::ChatTemplateArgs chat_template;
  fusionrl::cli::GenerateArgs generate;
  fusionrl::cli::ExportArgs export_;
};

// A subcommand and what runs it once it is the one parsed; returns the exit
// code.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

// The job commands, which load a job config and run it in this process.
struct JobCommands {
  CLI::App* run = nullptr;
  CLI::App* sft = nullptr;
  CLI::App* eval = nullptr;
  CLI::App* validate = nullptr;
};

// What every command shares: the remote environment, the allocator's
// settings and the logger.
void ConfigureProcess() {
  // env.name: remote (gRPC environment servers) for every command.
  fusionrl::rpc::RegisterRemoteEnvironment();
#ifdef __GLIBC__
  // Keep large blocks (gradient buffers, Reduce payloads, activations) in
  // the heap instead of mmap/munmap per allocation: every fresh mapping is
  // paid again in page faults, which measured 10x the cost of a 3.5 MB
  // cross-node round on this machine (docs/BENCHMARKS.md).
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
  // Logs and progress go to stderr; stdout carries only results (the summary
  // path, eval figures, the resolved config), so scripts can capture them.
  spdlog::set_default_logger(spdlog::stderr_color_mt("fusionrl"));
  spdlog::set_pattern("[%H:%M:%S] %v");
}

JobCommands AddJobCommands(CLI::App& app, JobArgs& args) {
  JobCommands c;
  c.run = app.add_subcommand("run",
                             "run an RL job (synchronous "
                             "on-policy loop)");
  AddJobArgs(c.run, &args, true);
  c.run->add_option("--http", args.http,
                    "HOST:PORT: serve the dashboard, /api/status and "
                    "/metrics of this run (docs/observability.md)");
  c.run->add_flag("--resume", args.resume,
                  "continue from the newest checkpoint in the output "
                  "directory");
  c.sft = app.add_subcommand("sft",
                             "supervised warm start on the "
                             "task's reference solutions");
  AddJobArgs(c.sft, &args, true);
  c.eval = app.add_subcommand(
      "eval", "greedy accuracy of a checkpoint on the held-out split");
  AddJobArgs(c.eval, &args, false);
  c.eval->add_option("--checkpoint,-c", args.checkpoint,
                     "checkpoint to evaluate (same as --init-checkpoint)");
  c.validate = app.add_subcommand(
      "validate", "check a job file and print the resolved config");
  AddJobArgs(c.validate, &args, false);
  return c;
}

// The other commands, each with its own Run function, in the order of
// `--help`.
std::vector<Command> AddToolCommands(CLI::App& app, AllArgs& a) {
  namespace cli = fusionrl::cli;
  std::vector<Command> commands;
  const cli::ClusterCommands cluster = cli::AddClusterCommands(app, a.cluster);
  auto run_cluster = [cluster, &a] {
    InstallStopHandlers();
    return cli::RunClusterCommand(cluster, a.cluster, g_stop_requested);
  };
  for (CLI::App* c :
       {cluster.controller, cluster.worker, cluster.submit, cluster.status}) {
    commands.push_back({c, run_cluster});
  }
  commands.push_back({cli::AddPlotCommand(app, a.plot),
                      [&a] { return cli::RunPlot(a.plot); }});
  commands.push_back({cli::AddBenchCommand(app, a.bench),
                      [&a] { return cli::RunBench(a.bench); }});
  commands.push_back({cli::AddBenchMemoryCommand(app, a.bench_memory),
                      [&a] { return cli::RunBenchMemory(a.bench_memory); }});
  commands.push_back({cli::AddBenchRolloutCommand(app, a.bench_rollout),
                      [&a] { return cli::RunBenchRollout(a.bench_rollout); }});
  commands.push_back({cli::AddBenchLogitsCommand(app, a.bench_logits),
                      [&a] { return cli::RunBenchLogits(a.bench_logits); }});
  commands.push_back({cli::AddBenchWeightsCommand(app, a.bench_weights),
                      [&a] { return cli::RunBenchWeights(a.bench_weights); }});
  commands.push_back({cli::AddSimulateCommand(app, a.simulate),
                      [&a] { return cli::RunSimulate(a.simulate); }});
  commands.push_back(
      {cli::AddTokenizeCommand(app, a.tokenize),
       [&a] { return cli::RunTokenize(a.tokenize, std::cin, std::cout); }});
  commands.push_back({cli::AddChatTemplateCommand(app, a.chat_template), [&a] {
                        return cli::RunChatTemplate(a.chat_template, std::cin,
                                                    std::cout);
                      }});
  const cli::ModelCommands model =
      cli::AddModelCommands(app, a.generate, a.export_);
  commands.push_back(
      {model.generate, [&a] { return cli::RunGenerate(a.generate); }});
  commands.push_back(
      {model.export_, [&a] { return cli::RunExport(a.export_); }});
  return commands;
}

// run, sft, eval or validate: loads the config, then runs the job here.
int RunJobCommand(const JobCommands& c, const JobArgs& args) {
  auto config = LoadConfig(args);
  if (!config.ok()) return Fail(config.status());

  if (c.validate->parsed()) {
    std::cout << fusionrl::JobConfigToYaml(*config);
    return 0;
  }
  if (c.eval->parsed()) {
    auto accuracy = fusionrl::EvaluateJob(*config);
    if (!accuracy.ok()) return Fail(accuracy.status());
    std::cout << "eval_accuracy " << *accuracy << "\n";
    return 0;
  }
  InstallStopHandlers();
  fusionrl::RunOptions options;
  options.resume = args.resume;
  options.stop_requested = &g_stop_requested;
  options.http_address = args.http;
  auto summary = c.sft->parsed() ? fusionrl::RunSftJob(*config)
                                 : fusionrl::RunRlJob(*config, options);
  if (!summary.ok()) return Fail(summary.status());
  std::cout << summary->summary_path << "\n";
  return summary->interrupted ? fusionrl::cli::kExitCancelled
                              : fusionrl::cli::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  ConfigureProcess();
  CLI::App app{
      "FusionRL: reinforcement-learning post-training of language "
      "models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", FUSIONRL_VERSION);
  AllArgs args;
  const JobCommands jobs = AddJobCommands(app, args.job);
  const std::vector<Command> commands = AddToolCommands(app, args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  }
  for (const Command& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return RunJobCommand(jobs, args.job);
}
