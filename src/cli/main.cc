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

}  // namespace

int main(int argc, char** argv) {
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
  CLI::App app{
      "FusionRL: reinforcement-learning post-training of language "
      "models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", FUSIONRL_VERSION);
  JobArgs args;
  CLI::App* run = app.add_subcommand("run",
                                     "run an RL job (synchronous "
                                     "on-policy loop)");
  AddJobArgs(run, &args, true);
  run->add_option("--http", args.http,
                  "HOST:PORT: serve the dashboard, /api/status and /metrics "
                  "of this run (docs/observability.md)");
  run->add_flag("--resume", args.resume,
                "continue from the newest checkpoint in the output directory");
  CLI::App* sft = app.add_subcommand("sft",
                                     "supervised warm start on the "
                                     "task's reference solutions");
  AddJobArgs(sft, &args, true);
  CLI::App* eval = app.add_subcommand(
      "eval", "greedy accuracy of a checkpoint on the held-out split");
  AddJobArgs(eval, &args, false);
  eval->add_option("--checkpoint,-c", args.checkpoint,
                   "checkpoint to evaluate (same as --init-checkpoint)");
  CLI::App* validate = app.add_subcommand(
      "validate", "check a job file and print the resolved config");
  AddJobArgs(validate, &args, false);

  fusionrl::cli::ClusterArgs cluster_args;
  const fusionrl::cli::ClusterCommands cluster =
      fusionrl::cli::AddClusterCommands(app, cluster_args);
  fusionrl::cli::PlotArgs plot_args;
  CLI::App* plot = fusionrl::cli::AddPlotCommand(app, plot_args);
  fusionrl::cli::BenchArgs bench_args;
  CLI::App* bench = fusionrl::cli::AddBenchCommand(app, bench_args);
  fusionrl::cli::BenchMemoryArgs bench_memory_args;
  CLI::App* bench_memory =
      fusionrl::cli::AddBenchMemoryCommand(app, bench_memory_args);
  fusionrl::cli::BenchRolloutArgs bench_rollout_args;
  CLI::App* bench_rollout =
      fusionrl::cli::AddBenchRolloutCommand(app, bench_rollout_args);
  fusionrl::cli::BenchLogitsArgs bench_logits_args;
  CLI::App* bench_logits =
      fusionrl::cli::AddBenchLogitsCommand(app, bench_logits_args);
  fusionrl::cli::BenchWeightsArgs bench_weights_args;
  CLI::App* bench_weights =
      fusionrl::cli::AddBenchWeightsCommand(app, bench_weights_args);
  fusionrl::cli::SimulateArgs simulate_args;
  CLI::App* simulate = fusionrl::cli::AddSimulateCommand(app, simulate_args);
  fusionrl::cli::TokenizeArgs tokenize_args;
  CLI::App* tokenize = fusionrl::cli::AddTokenizeCommand(app, tokenize_args);
  fusionrl::cli::ChatTemplateArgs chat_template_args;
  CLI::App* chat_template =
      fusionrl::cli::AddChatTemplateCommand(app, chat_template_args);

  fusionrl::cli::GenerateArgs generate_args;
  fusionrl::cli::ExportArgs export_args;
  const fusionrl::cli::ModelCommands model_commands =
      fusionrl::cli::AddModelCommands(app, generate_args, export_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  }

  if (model_commands.generate->parsed()) {
    return fusionrl::cli::RunGenerate(generate_args);
  }
  if (model_commands.export_->parsed()) {
    return fusionrl::cli::RunExport(export_args);
  }
  if (bench->parsed()) return fusionrl::cli::RunBench(bench_args);
  if (plot->parsed()) return fusionrl::cli::RunPlot(plot_args);
  if (simulate->parsed()) return fusionrl::cli::RunSimulate(simulate_args);
  if (bench_weights->parsed()) {
    return fusionrl::cli::RunBenchWeights(bench_weights_args);
  }
  if (bench_memory->parsed()) {
    return fusionrl::cli::RunBenchMemory(bench_memory_args);
  }
  if (bench_rollout->parsed()) {
    return fusionrl::cli::RunBenchRollout(bench_rollout_args);
  }
  if (bench_logits->parsed()) {
    return fusionrl::cli::RunBenchLogits(bench_logits_args);
  }
  if (tokenize->parsed()) {
    return fusionrl::cli::RunTokenize(tokenize_args, std::cin, std::cout);
  }
  if (chat_template->parsed()) {
    return fusionrl::cli::RunChatTemplate(chat_template_args, std::cin,
                                          std::cout);
  }
  if (cluster.controller->parsed() || cluster.worker->parsed() ||
      cluster.submit->parsed() || cluster.status->parsed()) {
    InstallStopHandlers();
    return fusionrl::cli::RunClusterCommand(cluster, cluster_args,
                                            g_stop_requested);
  }

  auto config = LoadConfig(args);
  if (!config.ok()) return Fail(config.status());

  if (validate->parsed()) {
    std::cout << fusionrl::JobConfigToYaml(*config);
    return 0;
  }
  if (eval->parsed()) {
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
  auto summary = sft->parsed() ? fusionrl::RunSftJob(*config)
                               : fusionrl::RunRlJob(*config, options);
  if (!summary.ok()) return Fail(summary.status());
  std::cout << summary->summary_path << "\n";
  return summary->interrupted ? fusionrl::cli::kExitCancelled
                              : fusionrl::cli::kExitOk;
}
