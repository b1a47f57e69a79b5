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
#include "core/mode_spec.h"
#include "core/status_macros.h"
#include "fusionrl/config.h"
#include "fusionrl/job.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace fusionrl::cli {

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
JobConfig RunConfig(const JobConfig& base, const ModeSpec& mode,
                    const std::string& init, const std::string& work, int r) {
  JobConfig c = base;
  c.init_checkpoint = init;
  ApplyModeSpec(mode, c);
  std::string dir_name = mode.name;
  std::replace(dir_name.begin(), dir_name.end(), ':', '_');
  c.output_dir = absl::StrCat(work, "/", dir_name, "-", r);
  return c;
}

// One run in this process: its JSON line on stdout.
int RunOneHere(const BenchArgs& args, const JobConfig& base) {
  LogToStderr();
  absl::StatusOr<ModeSpec> mode =
      ParseModeSpec(args.modes, ModeGrammar::kBench);
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

// Every run of one mode, as the runs' JSON lines report them.
struct ModeRuns {
  std::vector<double> tps, tps_with_evals, acc, trainer_busy, rollout_busy;
  std::vector<double> trainer_only, rollout_only, both, idle;
  std::vector<double> staleness;  // samples by staleness, over the runs
  int64_t max_staleness = 0;
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();

  void Add(const nlohmann::ordered_json& run) {
    tps.push_back(run.value("tokens_per_second", 0.0));
    tps_with_evals.push_back(run.value("tokens_per_second_with_evals", 0.0));
    acc.push_back(run.value("final_eval_accuracy", 0.0));
    trainer_busy.push_back(run.value("trainer_busy_fraction", 0.0));
    rollout_busy.push_back(run.value("rollout_busy_fraction", 0.0));
    max_staleness =
        std::max<int64_t>(max_staleness, run.value("max_staleness", 0));
    if (const auto split = run.find("time_split"); split != run.end()) {
      trainer_only.push_back(split->value("trainer_only", 0.0));
      rollout_only.push_back(split->value("rollout_only", 0.0));
      both.push_back(split->value("both", 0.0));
      idle.push_back(split->value("idle", 0.0));
    }
    if (const auto h = run.find("staleness_histogram");
        h != run.end() && h->is_array()) {
      if (staleness.size() < h->size()) staleness.resize(h->size(), 0);
      for (size_t k = 0; k < h->size(); ++k) {
        staleness[k] += (*h)[k].get<double>();
      }
    }
    runs.push_back(run);
  }
};

absl::StatusOr<std::vector<ModeSpec>> ParseModes(const std::string& text) {
  std::vector<ModeSpec> modes;
  for (const absl::string_view part : absl::StrSplit(text, ',')) {
    absl::StatusOr<ModeSpec> m =
        ParseModeSpec(std::string(part), ModeGrammar::kBench);
    if (!m.ok()) return m.status();
    modes.push_back(*m);
  }
  return modes;
}

// --init-checkpoint, or the checkpoint of an SFT warm start run now into
// `work`/sft.
absl::StatusOr<std::string> InitCheckpoint(const BenchArgs& args,
                                           const JobConfig& base,
                                           const std::string& work) {
  if (!args.init_checkpoint.empty()) return args.init_checkpoint;
  JobConfig sft = base;
  sft.output_dir = work + "/sft";
  spdlog::info("bench: SFT warm start into {}", sft.output_dir);
  FUSIONRL_ASSIGN_OR_RETURN(JobSummary s, RunSftJob(sft));
  return s.checkpoint_dir;
}

// The command line of run `r` of `mode` in a fresh process (--run-one).
std::vector<std::string> RunOneArgv(const BenchArgs& args,
                                    const std::string& self,
                                    const ModeSpec& mode, int r,
                                    const std::string& init,
                                    const std::string& work) {
  std::vector<std::string> argv = {self,
                                   "bench",
                                   args.config_path,
                                   "--modes",
                                   mode.name,
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
  return argv;
}

// args.repeats rounds, each mode once a round (interleaved, so that a
// drift of the machine touches every mode alike).
absl::StatusOr<std::vector<ModeRuns>> RunModes(
    const BenchArgs& args, const std::vector<ModeSpec>& modes,
    const std::string& self, const std::string& init, const std::string& work) {
  std::vector<ModeRuns> acc(modes.size());
  for (int r = 1; r <= args.repeats; ++r) {
    for (size_t i = 0; i < modes.size(); ++i) {
      spdlog::info("bench: {} run {}/{}", modes[i].name, r, args.repeats);
      absl::StatusOr<nlohmann::ordered_json> run =
          RunJsonChild(RunOneArgv(args, self, modes[i], r, init, work),
                       args.timeout_seconds);
      if (!run.ok()) {
        return absl::Status(run.status().code(),
                            absl::StrCat("bench: ", modes[i].name, " run ", r,
                                         ": ", run.status().message()));
      }
      acc[i].Add(*run);
    }
  }
  return acc;
}

// colocated-sync's medians, the yardstick of the ratios.
struct Baseline {
  double tps = 0, tps_with_evals = 0;
  std::optional<double> target;  // time to accuracy's
  std::optional<double> tta;
};

// Per run: the seconds of its first evaluation at or above `target`
// (written into the run as time_to_accuracy_seconds); their median, a run
// that never reached it counting as slower than every run that did
// (unset when half or more never did).
std::optional<double> TimeToAccuracy(ModeRuns& a, double target) {
  std::vector<double> secs;
  for (nlohmann::ordered_json& run : a.runs) {
    std::optional<double> reached;
    for (const auto& e : run.value("evals", nlohmann::ordered_json::array())) {
      if (e.value("accuracy", 0.0) >= target - 1e-12) {
        reached = e.value("seconds", 0.0);
        break;
      }
    }
    run["time_to_accuracy_seconds"] = reached ? nlohmann::ordered_json(*reached)
                                              : nlohmann::ordered_json(nullptr);
    secs.push_back(reached ? *reached
                           : std::numeric_limits<double>::infinity());
  }
  const double m = Median(secs);
  if (std::isfinite(m)) return m;
  return std::nullopt;
}

nlohmann::ordered_json NullOr(std::optional<double> v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

// One mode's medians, ratios and runs.
nlohmann::ordered_json ModeResult(const ModeSpec& mode, const ModeRuns& a,
                                  std::optional<double> tta,
                                  const Baseline& base) {
  nlohmann::ordered_json m = {
      {"placement", PlacementModeName(mode.placement)},
      {"max_policy_lag", mode.policy_lag},
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
      base.tps > 0 ? nlohmann::ordered_json(Median(a.tps) / base.tps)
                   : nlohmann::ordered_json(nullptr);
  m["median_tokens_per_second_with_evals"] = Median(a.tps_with_evals);
  m["ratio_to_colocated_sync_with_evals"] =
      base.tps_with_evals > 0
          ? nlohmann::ordered_json(Median(a.tps_with_evals) /
                                   base.tps_with_evals)
          : nlohmann::ordered_json(nullptr);
  m["median_time_to_accuracy_seconds"] = NullOr(tta);
  m["time_to_accuracy_ratio"] = base.tta && tta && *base.tta > 0
                                    ? nlohmann::ordered_json(*tta / *base.tta)
                                    : nlohmann::ordered_json(nullptr);
  return m;
}

// The "modes" member: time to accuracy against colocated-sync's median
// final accuracy minus the margin, then each mode's figures.
nlohmann::ordered_json ModesResult(const BenchArgs& args,
                                   const std::vector<ModeSpec>& modes,
                                   std::vector<ModeRuns>& acc,
                                   nlohmann::ordered_json& result) {
  Baseline base;
  for (size_t i = 0; i < modes.size(); ++i) {
    if (modes[i].name == "colocated-sync") {
      base.tps = Median(acc[i].tps);
      base.tps_with_evals = Median(acc[i].tps_with_evals);
      base.target = Median(acc[i].acc) - args.accuracy_margin;
    }
  }
  result["accuracy_target"] = NullOr(base.target);
  std::vector<std::optional<double>> tta(modes.size());
  for (size_t i = 0; i < modes.size() && base.target; ++i) {
    tta[i] = TimeToAccuracy(acc[i], *base.target);
  }
  for (size_t i = 0; i < modes.size(); ++i) {
    if (modes[i].name == "colocated-sync") base.tta = tta[i];
  }
  nlohmann::ordered_json out_modes = nlohmann::ordered_json::object();
  for (size_t i = 0; i < modes.size(); ++i) {
    out_modes[modes[i].name] = ModeResult(modes[i], acc[i], tta[i], base);
  }
  return out_modes;
}

}  // namespace

int RunBench(const BenchArgs& args) {
  // OpenMP's wait policy is left to the environment, the same for every
  // mode: libgomp's default (spin briefly, then sleep) measured best for
  // colocated-sync and for fused alike (docs/BENCHMARKS.md); forcing
  // OMP_WAIT_POLICY=PASSIVE slows colocated-sync by ~25% here and so
  // inflates every ratio.
  absl::StatusOr<std::vector<ModeSpec>> modes = ParseModes(args.modes);
  if (!modes.ok()) return Fail(modes.status());
  absl::StatusOr<JobConfig> base =
      LoadBenchConfig(args.config_path, args.overrides);
  if (!base.ok()) return Fail(base.status());
  if (args.steps > 0) base->run.total_steps = args.steps;
  base->run.eval_every = args.eval_every;
  if (args.run_one > 0) return RunOneHere(args, *base);
  const std::string work =
      args.work_dir.empty() ? "runs/bench-" + base->name : args.work_dir;
  absl::StatusOr<std::string> init = InitCheckpoint(args, *base, work);
  if (!init.ok()) return Fail(init.status());
  absl::StatusOr<std::string> self = SelfExecutable();
  if (!self.ok()) return Fail(self.status());
  nlohmann::ordered_json result;
  result["config"] = args.config_path;
  result["steps"] = base->run.total_steps;
  result["repeats"] = args.repeats;
  result["init_checkpoint"] = *init;
  result["fresh_process_per_run"] = true;
  result["omp_wait_policy"] = std::getenv("OMP_WAIT_POLICY")
                                  ? std::getenv("OMP_WAIT_POLICY")
                                  : "default";
  absl::StatusOr<std::vector<ModeRuns>> acc =
      RunModes(args, *modes, *self, *init, work);
  if (!acc.ok()) return Fail(acc.status());
  const nlohmann::ordered_json by_mode =
      ModesResult(args, *modes, *acc, result);
  result["modes"] = by_mode;
  return WriteBenchResult(result, args.out);
}

}  // namespace fusionrl::cli
