#include "cli/bench/bench_cli.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/bench/bench_common.h"
#include "cli/common/child_process.h"
#include "cli/common/exit_codes.h"
#include "fusionrl/config.h"
#include "fusionrl/job.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace fusionrl::cli {
namespace {

struct Mode {
  std::string name;  // as given
  PlacementMode placement = PlacementMode::kColocatedSync;
  int lag = 0;
  int partial = 0;                       // stalesync.partial_rollout_tokens
  int shared = 1;                        // stalesync.steps_per_version
  FusedTurns turns = FusedTurns::kAuto;  // placement.fused_turns
  // stalesync.rollout_version; unset: the config's.
  std::optional<RolloutVersion> version;
};

absl::StatusOr<Mode> ParseMode(const std::string& full) {
  Mode m;
  m.name = full;
  // Suffixes, in this order: "+turns:T" pins placement.fused_turns;
  // "+partial:N" turns on partial rollout with N tokens a segment;
  // "+version:V" sets stalesync.rollout_version; "+shared:M" sets
  // stalesync.steps_per_version.
  std::string text = full;
  for (const std::string suffix :
       {"+shared", "+version", "+partial", "+turns"}) {
    const size_t at = text.find(suffix);
    if (at == std::string::npos) continue;
    std::string value = text.substr(at + suffix.size());
    text = text.substr(0, at);
    const bool partial = suffix == "+partial";
    const bool version = suffix == "+version";
    const bool shared = suffix == "+shared";
    bool ok = value.size() >= 2 && value[0] == ':';
    if (ok && shared) {
      ok = absl::SimpleAtoi(value.substr(1), &m.shared) && m.shared >= 1;
    } else if (ok && version) {
      absl::StatusOr<RolloutVersion> v = ParseRolloutVersion(value.substr(1));
      ok = v.ok();
      if (ok) m.version = *v;
    } else if (ok && partial) {
      ok = absl::SimpleAtoi(value.substr(1), &m.partial) && m.partial >= 1;
    } else if (ok) {
      absl::StatusOr<FusedTurns> turns = ParseFusedTurns(value.substr(1));
      ok = turns.ok();
      if (ok) m.turns = *turns;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--modes: '", full, "': expected <mode>",
          shared    ? "+shared:M, M >= 1 (stalesync.steps_per_version)"
          : version ? "+version:V, V one of lagged, newest, jit "
                      "(stalesync.rollout_version)"
          : partial ? "+partial:N, N >= 1 (stalesync.partial_rollout_tokens)"
                    : "+turns:T, T one of auto, concurrent, interleaved, "
                      "probe (placement.fused_turns)",
          "; suffixes come in the order +turns, +partial, +version, "
          "+shared"));
    }
  }
  if (text == "colocated-sync" || text == "fused") {
    m.placement =
        text == "fused" ? PlacementMode::kFused : PlacementMode::kColocatedSync;
    return m;
  }
  // <prefix>[:s]: fused+stalesync (s = 2 by default), disaggregated (s = 0:
  // OpenRLHF-style synchronous; s > 0: AReaL-style asynchronous).
  for (const auto& [prefix, placement, lag] :
       {std::tuple<std::string, PlacementMode, int>{"fused+stalesync",
                                                    PlacementMode::kFused, 2},
        {"disaggregated", PlacementMode::kDisaggregated, 0}}) {
    if (text.rfind(prefix, 0) != 0) continue;
    m.placement = placement;
    m.lag = lag;
    const std::string rest = text.substr(prefix.size());
    if (!rest.empty() &&
        (rest[0] != ':' || !absl::SimpleAtoi(rest.substr(1), &m.lag) ||
         m.lag < 0 || m.lag > 1024)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--modes: '", text, "': expected ", prefix, "[:s], s in 0..1024"));
    }
    return m;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--modes: unknown mode '", text,
      "' (colocated-sync, fused, fused+stalesync[:s], disaggregated[:s], "
      "each optionally +turns:T, +partial:N, +version:V and +shared:M)"));
}

}  // namespace

CLI::App* AddBenchCommand(CLI::App& app, BenchArgs& args) {
  CLI::App* bench = app.add_subcommand(
      "bench",
      "run one job under several placement modes side by side; JSON out");
  bench->add_option("config", args.config_path, "job YAML (configs/bench.yaml)")
      ->required();
  bench->add_option("--modes", args.modes,
                    "comma-separated: colocated-sync, fused, "
                    "fused+stalesync[:s], disaggregated[:s], each with an "
                    "optional +turns:T (placement.fused_turns: auto, "
                    "concurrent, interleaved, probe), +partial:N (partial "
                    "rollout, N tokens a segment), +version:V "
                    "(stalesync.rollout_version: lagged, newest, jit) and "
                    "+shared:M (stalesync.steps_per_version: M steps sample "
                    "from one version); default "
                    "colocated-sync,disaggregated,fused,fused+stalesync:2");
  bench->add_option("--repeats", args.repeats, "runs per mode (default 3)")
      ->check(CLI::Range(1, 100));
  bench
      ->add_option("--steps", args.steps,
                   "RL steps per run (default: run.total_steps)")
      ->check(CLI::Range(1, 1000000));
  bench->add_option("--out", args.out, "write the JSON here (default stdout)");
  bench->add_option("--work-dir", args.work_dir,
                    "runs go here (default runs/bench-<config name>)");
  bench->add_option("--init-checkpoint", args.init_checkpoint,
                    "start every run here instead of running the config's "
                    "SFT first");
  bench
      ->add_option("--set", args.overrides,
                   "override a config key: key.path=value (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  bench
      ->add_option("--timeout", args.timeout_seconds,
                   "seconds per run (default 7200)")
      ->check(CLI::Range(10, 1000000));
  bench
      ->add_option("--eval-every", args.eval_every,
                   "held-out evaluation every N steps, for time to accuracy "
                   "(default 5; 0 = the final one only)")
      ->check(CLI::Range(0, 1000000));
  bench
      ->add_option("--accuracy-margin", args.accuracy_margin,
                   "time to accuracy: until colocated-sync's median final "
                   "accuracy minus this (default 0.02)")
      ->check(CLI::Range(0.0, 1.0));
  bench->add_option("--run-one", args.run_one, "internal: one run here")
      ->group("");
  return bench;
}

namespace {

// The config of `mode`'s run number `r`.
JobConfig RunConfig(const JobConfig& base, const Mode& mode,
                    const std::string& init, const std::string& work, int r) {
  JobConfig c = base;
  c.init_checkpoint = init;
  c.placement.mode = mode.placement;
  if (mode.placement == PlacementMode::kDisaggregated) {
    // One rollout card next to each training card, sharing the same
    // threads: the same compute, split by role instead of fused.
    c.placement.rollout_cards_per_super_node =
        base.placement.cards_per_super_node;
    c.placement.cards_per_super_node = 2 * base.placement.cards_per_super_node;
  }
  c.stalesync.max_policy_lag = mode.lag;
  if (mode.lag > 0) c.algorithm.decoupled_loss = true;
  c.stalesync.partial_rollout_tokens = mode.partial;
  c.placement.fused_turns = mode.turns;
  if (mode.version) c.stalesync.rollout_version = *mode.version;
  c.stalesync.steps_per_version = mode.shared;
  std::string dir_name = mode.name;
  std::replace(dir_name.begin(), dir_name.end(), ':', '_');
  c.output_dir = absl::StrCat(work, "/", dir_name, "-", r);
  return c;
}

// One run in this process: its JSON line on stdout.
int RunOneHere(const BenchArgs& args, const JobConfig& base) {
  LogToStderr();
  absl::StatusOr<Mode> mode = ParseMode(args.modes);
  if (!mode.ok()) return Fail(mode.status());
  if (args.init_checkpoint.empty() || args.work_dir.empty()) {
    return Fail(absl::InvalidArgumentError(
        "--run-one needs --init-checkpoint and --work-dir"));
  }
  const JobConfig c =
      RunConfig(base, *mode, args.init_checkpoint, args.work_dir, args.run_one);
  absl::StatusOr<JobSummary> s = RunRlJob(c, RunOptions{});
  if (!s.ok()) return Fail(s.status());
  double train = 0, rollout = 0, step = 0;
  // The card's time split (lead card) and the staleness histogram, summed
  // over the run's steps.
  double idle = 0, trainer_only = 0, rollout_only = 0, both = 0;
  std::vector<double> staleness;
  int64_t stale = 0;
  // The held-out accuracy curve against the run's own clock: the training
  // loop's seconds plus the evaluations' (the same evaluations in every
  // mode), summed up to each evaluation.
  double clock = 0;
  nlohmann::ordered_json evals = nlohmann::ordered_json::array();
  // MoE: the lead card's memory at the last step, and expert parallelism's
  // exchanges per step (placement.expert_parallel).
  nlohmann::ordered_json card_memory = nlohmann::ordered_json::object();
  double a2a_bytes = 0, a2a_seconds = 0, gather_seconds = 0;
  double sampling_a2a_bytes = 0, sampling_a2a_seconds = 0;
  int64_t steps = 0;
  std::ifstream in(c.output_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    train += j.value("train_seconds", 0.0);
    rollout += j.value("rollout_seconds", 0.0);
    step += j.value("step_seconds", 0.0);
    clock += j.value("step_seconds", 0.0) + j.value("eval_seconds", 0.0);
    if (j.contains("eval_accuracy")) {
      evals.push_back({{"step", j.value("step", 0)},
                       {"seconds", clock},
                       {"accuracy", j.value("eval_accuracy", 0.0)}});
    }
    ++steps;
    a2a_bytes += j.value("expert_alltoall_bytes", 0.0);
    a2a_seconds += j.value("expert_alltoall_seconds", 0.0);
    gather_seconds += j.value("expert_gather_seconds", 0.0);
    sampling_a2a_bytes += j.value("expert_sampling_alltoall_bytes", 0.0);
    sampling_a2a_seconds += j.value("expert_sampling_alltoall_seconds", 0.0);
    for (const auto& [key, value] : j.items()) {
      constexpr absl::string_view kPrefix = "card_memory_";
      if (absl::StartsWith(key, kPrefix)) {
        card_memory[key.substr(kPrefix.size())] = value;
      }
    }
    stale = std::max<int64_t>(stale, j.value("max_staleness", 0.0));
    idle += j.value("card_idle_seconds", 0.0);
    trainer_only += j.value("card_trainer_only_seconds", 0.0);
    rollout_only += j.value("card_rollout_only_seconds", 0.0);
    both += j.value("card_both_seconds", 0.0);
    for (size_t i = 0;; ++i) {
      const std::string key = absl::StrCat("staleness_", i);
      if (!j.contains(key)) break;
      if (staleness.size() <= i) staleness.resize(i + 1, 0.0);
      staleness[i] += j.value(key, 0.0);
    }
  }
  const double split_total = idle + trainer_only + rollout_only + both;
  auto share = [&](double x) {
    return split_total > 0 ? x / split_total : 0.0;
  };
  nlohmann::ordered_json run = {
      {"tokens_per_second", s->tokens_per_second},
      // Over the steps and the evaluations between them: a fused card's
      // rollout thread keeps sampling while the trainer evaluates, which
      // moves rollout work out of the steps' seconds into (slower)
      // evaluations; this figure counts both.
      {"tokens_per_second_with_evals",
       clock > 0 ? static_cast<double>(s->rollout_tokens) / clock : 0.0},
      {"final_eval_accuracy", s->final_eval_accuracy},
      {"max_staleness", stale},
      {"trainer_busy_fraction", step > 0 ? train / step : 0},
      {"rollout_busy_fraction", step > 0 ? rollout / step : 0},
      {"time_split",
       {{"trainer_only", share(trainer_only)},
        {"rollout_only", share(rollout_only)},
        {"both", share(both)},
        {"idle", share(idle)}}},
      {"staleness_histogram", staleness},
      {"evals", evals},
      {"output_dir", c.output_dir}};
  if (!card_memory.empty()) run["card_memory"] = card_memory;
  if (c.placement.expert_parallel > 1 && steps > 0) {
    run["expert_parallel"] = c.placement.expert_parallel;
    run["expert_alltoall_bytes_per_step"] = a2a_bytes / steps;
    run["expert_alltoall_seconds_per_step"] = a2a_seconds / steps;
    run["expert_gather_seconds_per_step"] = gather_seconds / steps;
    run["expert_sampling"] = ExpertSamplingName(c.placement.expert_sampling);
    run["expert_sampling_alltoall_bytes_per_step"] = sampling_a2a_bytes / steps;
    run["expert_sampling_alltoall_seconds_per_step"] =
        sampling_a2a_seconds / steps;
  }
  std::cout << run.dump() << std::endl;
  return kExitOk;
}

}  // namespace

int RunBench(const BenchArgs& args) {
  // OpenMP's wait policy is left to the environment, the same for every
  // mode: libgomp's default (spin briefly, then sleep) measured best for
  // colocated-sync and for fused alike (docs/BENCHMARKS.md); forcing
  // OMP_WAIT_POLICY=PASSIVE slows colocated-sync by ~25% here and so
  // inflates every ratio.
  std::vector<Mode> modes;
  for (const absl::string_view part : absl::StrSplit(args.modes, ',')) {
    absl::StatusOr<Mode> m = ParseMode(std::string(part));
    if (!m.ok()) return Fail(m.status());
    modes.push_back(*m);
  }
  absl::StatusOr<JobConfig> base =
      LoadBenchConfig(args.config_path, args.overrides);
  if (!base.ok()) return Fail(base.status());
  if (args.steps > 0) base->run.total_steps = args.steps;
  base->run.eval_every = args.eval_every;
  if (args.run_one > 0) return RunOneHere(args, *base);
  const std::string work =
      args.work_dir.empty() ? "runs/bench-" + base->name : args.work_dir;
  std::string init = args.init_checkpoint;
  if (init.empty()) {
    JobConfig sft = *base;
    sft.output_dir = work + "/sft";
    spdlog::info("bench: SFT warm start into {}", sft.output_dir);
    absl::StatusOr<JobSummary> s = RunSftJob(sft);
    if (!s.ok()) return Fail(s.status());
    init = s->checkpoint_dir;
  }
  absl::StatusOr<std::string> self = SelfExecutable();
  if (!self.ok()) return Fail(self.status());
  nlohmann::ordered_json result;
  result["config"] = args.config_path;
  result["steps"] = base->run.total_steps;
  result["repeats"] = args.repeats;
  result["init_checkpoint"] = init;
  result["fresh_process_per_run"] = true;
  result["omp_wait_policy"] = std::getenv("OMP_WAIT_POLICY")
                                  ? std::getenv("OMP_WAIT_POLICY")
                                  : "default";
  struct Acc {
    std::vector<double> tps, tps_with_evals, acc, trainer_busy, rollout_busy;
    std::vector<double> trainer_only, rollout_only, both, idle;
    std::vector<double> staleness;  // samples by staleness, over the runs
    int64_t max_staleness = 0;
    nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  };
  std::vector<Acc> acc(modes.size());
  for (int r = 1; r <= args.repeats; ++r) {
    for (size_t i = 0; i < modes.size(); ++i) {
      spdlog::info("bench: {} run {}/{}", modes[i].name, r, args.repeats);
      std::vector<std::string> argv = {*self,
                                       "bench",
                                       args.config_path,
                                       "--modes",
                                       modes[i].name,
                                       "--run-one",
                                       std::to_string(r),
                                       "--init-checkpoint",
                                       init,
                                       "--work-dir",
                                       work};
      if (args.steps > 0) {
        argv.push_back("--steps");
        argv.push_back(std::to_string(args.steps));
      }
      argv.push_back("--eval-every");
      argv.push_back(std::to_string(args.eval_every));
      for (const auto& o : args.overrides) {
        argv.push_back("--set");
        argv.push_back(o);
      }
      absl::StatusOr<nlohmann::ordered_json> run =
          RunJsonChild(argv, args.timeout_seconds);
      if (!run.ok()) {
        return Fail(
            absl::Status(run.status().code(),
                         absl::StrCat("bench: ", modes[i].name, " run ", r,
                                      ": ", run.status().message())));
      }
      Acc& a = acc[i];
      a.tps.push_back(run->value("tokens_per_second", 0.0));
      a.tps_with_evals.push_back(
          run->value("tokens_per_second_with_evals", 0.0));
      a.acc.push_back(run->value("final_eval_accuracy", 0.0));
      a.trainer_busy.push_back(run->value("trainer_busy_fraction", 0.0));
      a.rollout_busy.push_back(run->value("rollout_busy_fraction", 0.0));
      a.max_staleness =
          std::max<int64_t>(a.max_staleness, run->value("max_staleness", 0));
      if (const auto split = run->find("time_split"); split != run->end()) {
        a.trainer_only.push_back(split->value("trainer_only", 0.0));
        a.rollout_only.push_back(split->value("rollout_only", 0.0));
        a.both.push_back(split->value("both", 0.0));
        a.idle.push_back(split->value("idle", 0.0));
      }
      if (const auto h = run->find("staleness_histogram");
          h != run->end() && h->is_array()) {
        if (a.staleness.size() < h->size()) a.staleness.resize(h->size(), 0);
        for (size_t k = 0; k < h->size(); ++k) {
          a.staleness[k] += (*h)[k].get<double>();
        }
      }
      a.runs.push_back(*run);
    }
  }
  double base_tps = 0, base_tps_with_evals = 0;
  std::optional<double> target;  // time to accuracy's
  for (size_t i = 0; i < modes.size(); ++i) {
    if (modes[i].name == "colocated-sync") {
      base_tps = Median(acc[i].tps);
      base_tps_with_evals = Median(acc[i].tps_with_evals);
      target = Median(acc[i].acc) - args.accuracy_margin;
    }
  }
  result["accuracy_target"] = target ? nlohmann::ordered_json(*target)
                                     : nlohmann::ordered_json(nullptr);
  // Per run: the seconds of its first evaluation at or above the target;
  // per mode: their median, a run that never reached it counting as
  // slower than every run that did (null when half or more never did).
  std::vector<std::optional<double>> tta(modes.size());
  for (size_t i = 0; i < modes.size() && target; ++i) {
    std::vector<double> secs;
    for (nlohmann::ordered_json& run : acc[i].runs) {
      std::optional<double> reached;
      for (const auto& e :
           run.value("evals", nlohmann::ordered_json::array())) {
        if (e.value("accuracy", 0.0) >= *target - 1e-12) {
          reached = e.value("seconds", 0.0);
          break;
        }
      }
      run["time_to_accuracy_seconds"] = reached
                                            ? nlohmann::ordered_json(*reached)
                                            : nlohmann::ordered_json(nullptr);
      secs.push_back(reached ? *reached
                             : std::numeric_limits<double>::infinity());
    }
    const double m = Median(secs);
    if (std::isfinite(m)) tta[i] = m;
  }
  std::optional<double> base_tta;
  for (size_t i = 0; i < modes.size(); ++i) {
    if (modes[i].name == "colocated-sync") base_tta = tta[i];
  }
  nlohmann::ordered_json out_modes = nlohmann::ordered_json::object();
  for (size_t i = 0; i < modes.size(); ++i) {
    const Acc& a = acc[i];
    nlohmann::ordered_json m = {
        {"placement", PlacementModeName(modes[i].placement)},
        {"max_policy_lag", modes[i].lag},
        {"median_tokens_per_second", Median(a.tps)},
        {"median_final_eval_accuracy", Median(a.acc)},
        {"median_trainer_busy_fraction", Median(a.trainer_busy)},
        {"median_rollout_busy_fraction", Median(a.rollout_busy)},
        {"median_time_split",
         {{"trainer_only", Median(a.trainer_only)},
          {"rollout_only", Median(a.rollout_only)},
          {"both", Median(a.both)},
          {"idle", Median(a.idle)}}},
        {"staleness_histogram", a.staleness},
        {"max_staleness", a.max_staleness},
        {"runs", a.runs}};
    m["ratio_to_colocated_sync"] =
        base_tps > 0 ? nlohmann::ordered_json(Median(a.tps) / base_tps)
                     : nlohmann::ordered_json(nullptr);
    m["median_tokens_per_second_with_evals"] = Median(a.tps_with_evals);
    m["ratio_to_colocated_sync_with_evals"] =
        base_tps_with_evals > 0
            ? nlohmann::ordered_json(Median(a.tps_with_evals) /
                                     base_tps_with_evals)
            : nlohmann::ordered_json(nullptr);
    m["median_time_to_accuracy_seconds"] =
        tta[i] ? nlohmann::ordered_json(*tta[i])
               : nlohmann::ordered_json(nullptr);
    m["time_to_accuracy_ratio"] =
        base_tta && tta[i] && *base_tta > 0
            ? nlohmann::ordered_json(*tta[i] / *base_tta)
            : nlohmann::ordered_json(nullptr);
    out_modes[modes[i].name] = m;
  }
  result["modes"] = out_modes;
  return WriteBenchResult(result, args.out);
}

}  // namespace fusionrl::cli
