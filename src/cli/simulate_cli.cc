#include "cli/simulate_cli.h"

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/bench/bench_common.h"
#include "cli/common/exit_codes.h"
#include "core/clock.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "sim/calibration.h"
#include "sim/cost_model.h"
#include "sim/sim_config.h"
#include "sim/simulator.h"
#include "spdlog/spdlog.h"

namespace fusionrl::cli {
namespace {

absl::StatusOr<std::vector<int>> ParseSuperNodes(const std::string& text) {
  std::vector<int> out;
  for (const absl::string_view part : absl::StrSplit(text, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || n > 4096) {
      return absl::InvalidArgumentError(
          absl::StrCat("--super-nodes: '", part,
                       "': expected a comma-separated list of counts in "
                       "1..4096"));
    }
    out.push_back(n);
  }
  return out;
}

nlohmann::ordered_json CostModelJson(const sim::CostModel& m) {
  return {{"timing", sim::TimingName(m.timing)},
          {"peak_tflops", m.peak_tflops},
          {"hbm_gbps", m.hbm_gbps},
          {"mfu", m.mfu},
          {"hbm_utilization", m.hbm_utilization},
          {"kv_bytes_per_token", m.kv_bytes_per_token},
          {"train_flops_per_param_token", m.train_flops_per_param_token},
          {"train_hbm_fraction", m.train_hbm_fraction},
          {"interference", m.interference},
          {"decode_seconds_per_step_base", m.decode_seconds_per_step_base},
          {"decode_seconds_per_token", m.decode_seconds_per_token},
          {"prefill_seconds_per_token", m.prefill_seconds_per_token},
          {"prompt_length", m.prompt_length},
          {"response_length",
           {{"median", m.response_length.median},
            {"sigma", m.response_length.sigma},
            {"max", m.response_length.max}}},
          {"train_seconds_per_token", m.train_seconds_per_token},
          {"train_seconds_per_step_base", m.train_seconds_per_step_base},
          {"step_overhead_seconds", m.step_overhead_seconds},
          {"fused_concurrency_share", m.fused_concurrency_share},
          {"model_params", m.model_params},
          {"bytes_per_param", m.bytes_per_param},
          {"intra_bandwidth_gbps", m.intra_bandwidth_gbps},
          {"inter_bandwidth_gbps", m.inter_bandwidth_gbps},
          {"intra_latency_us", m.intra_latency_us},
          {"inter_latency_us", m.inter_latency_us},
          {"straggler_super_nodes", m.straggler_super_nodes},
          {"straggler_slowdown", m.straggler_slowdown},
          {"jitter_sigma", m.jitter_sigma},
          {"shared_host_threads", m.shared_host_threads},
          {"calibration_threads", m.calibration_threads},
          {"seed", m.seed}};
}

// A fresh directory under `parent` (mkdtemp), or an error naming it.
absl::StatusOr<std::string> FreshDir(const std::string& parent) {
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  std::string tmpl = parent + "/fusionrl-simulate-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--work-dir: cannot create a directory under '", parent, "'"));
  }
  return tmpl;
}

}  // namespace

CLI::App* AddSimulateCommand(CLI::App& app, SimulateArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "simulate",
      "the real controller with simulated super nodes and cards on a "
      "virtual clock (cost model); JSON out");
  cmd->add_option("config", args.config_path,
                  "simulation YAML: job + cost_model (configs/simulate.yaml)")
      ->required();
  cmd->add_option("--super-nodes", args.super_nodes,
                  "comma-separated super-node counts (default 1)");
  cmd->add_option("--cards-per-super-node", args.cards_per_super_node,
                  "cards in each super node (default 8)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--modes", args.modes,
                  "comma-separated: colocated-sync, fused, "
                  "fused+stalesync[:s[:k]] (policy lag s, clock skew k; "
                  "default colocated-sync,fused+stalesync:2:1)");
  cmd->add_option("--steps", args.steps,
                  "RL steps per run (default: the job's run.total_steps)")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--out", args.out, "write the JSON here (default stdout)");
  cmd->add_option("--work-dir", args.work_dir,
                  "the simulated jobs' outputs go to a fresh directory "
                  "under this one (default /tmp)");
  cmd->add_flag("--keep", args.keep,
                "keep the simulated jobs' outputs (metrics.jsonl, ...)");
  cmd->add_option("--calibrate-from", args.calibrate_from,
                  "fit the per-token decode and train costs to this "
                  "`fusionrl run` output directory (metrics.jsonl)");
  cmd->add_option("--set", args.overrides,
                  "override a job key: key.path=value (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--cost", args.cost_overrides,
                  "override a cost-model key: key.path=value (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  return cmd;
}

namespace {

absl::StatusOr<std::vector<sim::SimMode>> ParseSimModes(
    const std::string& text) {
  std::vector<sim::SimMode> modes;
  for (const absl::string_view part : absl::StrSplit(text, ',')) {
    absl::StatusOr<sim::SimMode> m = sim::ParseSimMode(std::string(part));
    if (!m.ok()) return m.status();
    modes.push_back(*m);
  }
  return modes;
}

// What every simulated run shares: the modes and super-node counts asked
// for, the simulation config, the cost model (calibrated, then --cost) and
// the directory the runs write to.
struct SimulatePlan {
  std::vector<sim::SimMode> modes;
  std::vector<int> counts;
  sim::SimConfig config;
  sim::CostModel cost;
  nlohmann::ordered_json calibration = nullptr;
  std::string work;
};

// The config's cost model fitted to --calibrate-from (when given; the fit
// goes to plan.calibration), then with --cost applied.
absl::Status PlanCost(const SimulateArgs& args, SimulatePlan& plan) {
  plan.cost = plan.config.cost;
  if (!args.calibrate_from.empty()) {
    FUSIONRL_ASSIGN_OR_RETURN(
        sim::Calibration cal,
        sim::CalibrateFromRun(args.calibrate_from, plan.cost));
    plan.cost = cal.cost;
    plan.calibration = {
        {"run_dir", args.calibrate_from},
        {"steps_used", cal.steps_used},
        {"cards", cal.cards},
        {"threads_per_card", cal.threads_per_card},
        {"tokens_per_card", cal.tokens_per_card},
        {"measured_mean_step_seconds", cal.mean_step_seconds},
        {"measured_mean_rollout_seconds", cal.mean_rollout_seconds},
        {"measured_mean_train_seconds", cal.mean_train_seconds},
        {"rollout_fit", cal.rollout_fit},
        {"train_fit", cal.train_fit}};
  }
  FUSIONRL_ASSIGN_OR_RETURN(
      plan.cost, sim::ApplyCostOverrides(plan.cost, args.cost_overrides));
  return absl::OkStatus();
}

absl::StatusOr<SimulatePlan> PlanSimulate(const SimulateArgs& args) {
  SimulatePlan plan;
  FUSIONRL_ASSIGN_OR_RETURN(plan.modes, ParseSimModes(args.modes));
  FUSIONRL_ASSIGN_OR_RETURN(plan.counts, ParseSuperNodes(args.super_nodes));
  std::vector<std::string> overrides = args.overrides;
  if (args.steps > 0) {
    overrides.push_back(absl::StrCat("run.total_steps=", args.steps));
  }
  FUSIONRL_ASSIGN_OR_RETURN(plan.config,
                            sim::LoadSimConfig(args.config_path, overrides));
  FUSIONRL_RETURN_IF_ERROR(PlanCost(args, plan));
  const int per_node = plan.config.job.rollout.prompts_per_step;
  if (per_node % args.cards_per_super_node != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        args.config_path, ": job.rollout.prompts_per_step: ", per_node,
        " prompt groups per super node cannot be split evenly over ",
        args.cards_per_super_node, " cards (--cards-per-super-node)"));
  }
  FUSIONRL_ASSIGN_OR_RETURN(
      plan.work, FreshDir(args.work_dir.empty() ? "/tmp" : args.work_dir));
  return plan;
}

// The run of `mode` on `n` super nodes.
sim::SimRunSpec RunSpec(const SimulateArgs& args, const SimulatePlan& plan,
                        const sim::SimMode& mode, int n) {
  sim::SimRunSpec spec;
  spec.job_yaml = plan.config.job_yaml;
  spec.job_overrides = plan.config.job_overrides;
  spec.source_name = args.config_path;
  spec.cost = plan.cost;
  spec.mode = mode;
  spec.super_nodes = n;
  spec.cards_per_super_node = args.cards_per_super_node;
  std::string dir_name = mode.name;
  for (char& ch : dir_name) {
    if (ch == ':' || ch == '+') ch = '_';
  }
  spec.output_dir = absl::StrCat(plan.work, "/", dir_name, "-", n);
  return spec;
}

// One run's entry of the result; `base_tps` is the same mode's tokens/s on
// one super node.
nlohmann::ordered_json RunJson(const SimulateArgs& args,
                               const sim::SimRunSpec& spec,
                               const sim::SimRunResult& r, double base_tps,
                               double wall) {
  const int n = spec.super_nodes;
  nlohmann::ordered_json j = {
      {"mode", spec.mode.name},
      {"super_nodes", n},
      {"cards", r.cards},
      {"tokens_per_second", r.tokens_per_second},
      {"scaling_efficiency",
       base_tps > 0 ? r.tokens_per_second / (n * base_tps) : 0.0},
      {"card_busy_fraction", r.card_busy_fraction},
      {"max_staleness", r.max_staleness},
      {"max_clock_skew", r.max_clock_skew},
      {"controller_messages_per_step", r.controller_messages_per_step},
      {"controller_cpu_seconds_per_step", r.controller_cpu_seconds_per_step},
      {"controller_tensor_bytes_per_step", r.controller_tensor_bytes_per_step},
      {"cards_per_super_node", args.cards_per_super_node},
      {"steps", r.steps},
      {"mean_step_seconds", r.mean_step_seconds},
      {"simulated_seconds", r.seconds},
      {"groups_trained", r.groups_trained},
      {"wall_seconds", wall}};
  if (args.keep) j["output_dir"] = spec.output_dir;
  return j;
}

// Each (mode, N) once, N = 1 also as the baseline of scaling_efficiency
// (listed only when asked for). The first failing run ends them all.
absl::StatusOr<nlohmann::ordered_json> RunSimulations(
    const SimulateArgs& args, const SimulatePlan& plan) {
  std::vector<int> run_counts = plan.counts;
  bool has_one = false;
  for (int n : run_counts) has_one = has_one || n == 1;
  if (!has_one) run_counts.insert(run_counts.begin(), 1);
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  const spdlog::level::level_enum level = spdlog::get_level();
  for (const sim::SimMode& mode : plan.modes) {
    double base_tps = 0;
    for (int n : run_counts) {
      const sim::SimRunSpec spec = RunSpec(args, plan, mode, n);
      const absl::Time t0 = RealClock().MonotonicNow();
      // The controller's per-step progress lines would drown the runs'.
      spdlog::set_level(spdlog::level::warn);
      absl::StatusOr<sim::SimRunResult> r = sim::RunSimulation(spec);
      spdlog::set_level(level);
      const double wall = RealClock().SecondsSince(t0);
      if (!r.ok()) {
        return absl::Status(r.status().code(),
                            absl::StrCat(mode.name, ", ", n, " super nodes: ",
                                         r.status().message()));
      }
      if (n == 1) base_tps = r->tokens_per_second;
      spdlog::info(
          "simulate: {} x {} super nodes x {} cards: {:.0f} tokens/s, step "
          "{:.3f} s, busy {:.2f}, skew {} ({:.1f} s wall)",
          mode.name, n, args.cards_per_super_node, r->tokens_per_second,
          r->mean_step_seconds, r->card_busy_fraction, r->max_clock_skew, wall);
      bool listed = false;
      for (int m : plan.counts) listed = listed || m == n;
      if (listed) runs.push_back(RunJson(args, spec, *r, base_tps, wall));
    }
  }
  return runs;
}

}  // namespace

int RunSimulate(const SimulateArgs& args) {
  absl::StatusOr<SimulatePlan> plan = PlanSimulate(args);
  if (!plan.ok()) return Fail(plan.status());
  absl::StatusOr<nlohmann::ordered_json> runs = RunSimulations(args, *plan);
  // A failed run is reported before the outputs are cleaned up.
  const int exit_code = runs.ok() ? kExitOk : Fail(runs.status());
  if (!args.keep) {
    std::error_code ec;
    std::filesystem::remove_all(plan->work, ec);
  } else {
    spdlog::info("simulate: the simulated jobs' outputs are in {}", plan->work);
  }
  if (exit_code != kExitOk) return exit_code;
  nlohmann::ordered_json result;
  result["config"] = args.config_path;
  result["cost_model"] = CostModelJson(plan->cost);
  result["calibration"] = plan->calibration;
  result["runs"] = *runs;
  return WriteBenchResult(result, args.out);
}

}  // namespace fusionrl::cli
