#include "cli/bench/bench_rollout_cli.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/bench/bench_common.h"
#include "cli/bench/bench_rollout_measure.h"
#include "cli/common/child_process.h"
#include "cli/common/exit_codes.h"
#include "core/status_macros.h"
#include "engine/jobs/job_setup.h"
#include "engine/kernels/op_counter.h"
#include "engine/model/model.h"
#include "engine/rollout/rollout.h"
#include "engine/rollout/sample.h"
#include "engine/train/memory_accounting.h"
#include "engine/train/trainer.h"
#include "fusionrl/config.h"
#include "fusionrl/tokenizer.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

#ifndef FUSIONRL_SOURCE_DIR
#define FUSIONRL_SOURCE_DIR ""
#endif

namespace fusionrl::cli {
namespace {

absl::StatusOr<std::string> FindReferenceScript(const std::string& given) {
  std::vector<std::string> candidates;
  if (!given.empty()) {
    candidates.push_back(given);
  } else {
    if (auto self = SelfExecutable(); self.ok()) {
      const auto dir = std::filesystem::path(*self).parent_path();
      candidates.push_back(
          (dir / "../share/fusionrl/rollout_reference.py").string());
    }
    if (std::string(FUSIONRL_SOURCE_DIR).size() > 0) {
      candidates.push_back(std::string(FUSIONRL_SOURCE_DIR) +
                           "/scripts/rollout_reference.py");
    }
  }
  for (const auto& c : candidates) {
    if (std::filesystem::exists(c)) return c;
  }
  return absl::NotFoundError(absl::StrCat(
      "--reference-script: rollout_reference.py not found (looked at ",
      candidates.empty() ? std::string("nothing")
                         : absl::StrJoin(candidates, ", "),
      "); pass its path, or leave 'python' out of --engines"));
}

std::vector<std::string> PythonArgv(const BenchRolloutArgs& args,
                                    const std::string& script,
                                    const JobConfig& c, int vocab) {
  const ModelConfig& m = c.model;
  std::vector<std::string> a = {args.python,
                                script,
                                "--vocab",
                                std::to_string(vocab),
                                "--d-model",
                                std::to_string(m.d_model),
                                "--n-layers",
                                std::to_string(m.n_layers),
                                "--n-heads",
                                std::to_string(m.n_heads),
                                "--n-kv-heads",
                                std::to_string(m.n_kv_heads),
                                "--head-dim",
                                std::to_string(m.head_dim),
                                "--d-ff",
                                std::to_string(m.d_ff),
                                "--max-seq-len",
                                std::to_string(m.max_seq_len),
                                "--rope-theta",
                                absl::StrCat(m.rope_theta),
                                "--prompts",
                                std::to_string(c.rollout.prompts_per_step),
                                "--group-size",
                                std::to_string(c.rollout.group_size),
                                "--prompt-len",
                                std::to_string(args.prompt_len),
                                "--max-new-tokens",
                                std::to_string(c.rollout.max_new_tokens),
                                "--temperature",
                                absl::StrCat(c.rollout.temperature),
                                "--micro-batch-size",
                                std::to_string(c.optim.micro_batch_size),
                                "--lr",
                                absl::StrCat(c.optim.lr),
                                "--threads",
                                std::to_string(c.num_threads),
                                "--iterations",
                                std::to_string(args.iterations),
                                "--seed",
                                std::to_string(c.seed)};
  if (m.tie_embeddings) a.push_back("--tie-embeddings");
  return a;
}

}  // namespace

CLI::App* AddBenchRolloutCommand(CLI::App& app, BenchRolloutArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "bench-rollout",
      "rollout and synchronous-step tokens/s of the engine next to a "
      "PyTorch-Python loop of the same shape; JSON out");
  cmd->add_option("config", args.config_path,
                  "job YAML (its model, rollout "
                  "and optim sections give the shape)")
      ->required();
  cmd->add_option("--engines", args.engines,
                  "comma-separated: fused, composite, static, python (default "
                  "fused,composite,python)");
  cmd->add_option("--repeats", args.repeats,
                  "fresh-process measurements per engine (default 3)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--iterations", args.iterations,
                  "timed steps per measurement, after one warm-up (default 5)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--prompt-len", args.prompt_len, "prompt tokens (default 12)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--stop-ids", args.stop_ids,
                  "C++ engines: stop at the N lowest token ids but pad, so "
                  "response lengths spread (default 0: every response is "
                  "max_new_tokens long, as in the Python loop)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--cross-steps", args.cross_steps,
                  "C++ engines: also time K steps' rollouts in one engine "
                  "call (slots refilled across steps) against K calls "
                  "(default 1: off)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--python", args.python,
                  "interpreter with torch (default /usr/bin/python3)");
  cmd->add_option("--reference-script", args.reference_script,
                  "rollout_reference.py (default: the installed or source "
                  "tree's)");
  cmd->add_option("--timeout", args.timeout_seconds,
                  "seconds per measurement (default 900)")
      ->check(CLI::Range(10, 86400));
  cmd->add_option("--out", args.out, "write the JSON here (default stdout)");
  cmd->add_option("--set", args.overrides,
                  "override a config key: key.path=value (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--measure", args.measure,
                  "internal: measure one engine (fused|composite|static) here")
      ->group("");
  return cmd;
}

namespace {

// --engines, checked: known names, none twice.
absl::StatusOr<std::vector<std::string>> ParseEngines(const std::string& text) {
  std::vector<std::string> engines;
  for (const absl::string_view e : absl::StrSplit(text, ',')) {
    const std::string name(e);
    if (name != "fused" && name != "composite" && name != "static" &&
        name != "python") {
      return absl::InvalidArgumentError(
          absl::StrCat("--engines: unknown engine '", name,
                       "' (fused, composite, static, python)"));
    }
    if (std::find(engines.begin(), engines.end(), name) != engines.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--engines: '", name, "' is listed twice"));
    }
    engines.push_back(name);
  }
  return engines;
}

// The vocabulary the prompts are drawn from (model.vocab_size, else the
// tokenizer's), after checking that the shape fits the model and that
// --stop-ids leaves a token to sample.
absl::StatusOr<int> CheckedVocab(const BenchRolloutArgs& args,
                                 const JobConfig& config) {
  if (args.prompt_len + config.rollout.max_new_tokens >
      config.model.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt-len ", args.prompt_len, " + rollout.max_new_tokens ",
        config.rollout.max_new_tokens, " exceeds model.max_seq_len ",
        config.model.max_seq_len));
  }
  FUSIONRL_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                            LoadJobTokenizer(config.model));
  const int vocab = config.model.vocab_size > 0 ? config.model.vocab_size
                                                : tokenizer->vocab_size();
  if (args.stop_ids >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stop-ids ", args.stop_ids,
        " leaves no token to sample (the vocabulary has ", vocab, " ids)"));
  }
  return vocab;
}

// rollout_reference.py when 'python' is among the engines, else "".
absl::StatusOr<std::string> PythonScript(
    const BenchRolloutArgs& args, const std::vector<std::string>& engines) {
  if (std::find(engines.begin(), engines.end(), "python") == engines.end()) {
    return std::string();
  }
  if (args.stop_ids > 0) {
    return absl::InvalidArgumentError(
        "--stop-ids: the Python loop samples max_new_tokens tokens for "
        "every response; leave 'python' out of --engines");
  }
  return FindReferenceScript(args.reference_script);
}

// What the measurements run on: the config, its vocabulary, this binary
// and the Python reference.
struct RolloutBenchPlan {
  std::vector<std::string> engines;
  JobConfig config;
  int vocab = 0;
  std::string script;  // "" without 'python'
  std::string self;
};

absl::StatusOr<RolloutBenchPlan> PlanRolloutBench(
    const BenchRolloutArgs& args) {
  RolloutBenchPlan p;
  FUSIONRL_ASSIGN_OR_RETURN(p.engines, ParseEngines(args.engines));
  FUSIONRL_ASSIGN_OR_RETURN(p.config,
                            LoadBenchConfig(args.config_path, args.overrides));
  FUSIONRL_ASSIGN_OR_RETURN(p.vocab, CheckedVocab(args, p.config));
  FUSIONRL_ASSIGN_OR_RETURN(p.script, PythonScript(args, p.engines));
  FUSIONRL_ASSIGN_OR_RETURN(p.self, SelfExecutable());
  return p;
}

// The command line of one measurement of engine `e` in a fresh process.
std::vector<std::string> MeasureArgv(const BenchRolloutArgs& args,
                                     const RolloutBenchPlan& p,
                                     const std::string& e) {
  if (e == "python") return PythonArgv(args, p.script, p.config, p.vocab);
  std::vector<std::string> argv = {p.self,
                                   "bench-rollout",
                                   args.config_path,
                                   "--measure",
                                   e,
                                   "--iterations",
                                   std::to_string(args.iterations),
                                   "--prompt-len",
                                   std::to_string(args.prompt_len),
                                   "--stop-ids",
                                   std::to_string(args.stop_ids),
                                   "--cross-steps",
                                   std::to_string(args.cross_steps)};
  for (const auto& o : args.overrides) {
    argv.push_back("--set");
    argv.push_back(o);
  }
  return argv;
}

// One engine's measurements, over the repeats.
struct EngineRuns {
  std::vector<double> rollout, step;
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
};

// args.repeats rounds, each engine once a round, in --engines order.
absl::StatusOr<std::map<std::string, EngineRuns>> RunMeasurements(
    const BenchRolloutArgs& args, const RolloutBenchPlan& p) {
  std::map<std::string, EngineRuns> acc;
  for (int r = 1; r <= args.repeats; ++r) {
    for (const std::string& e : p.engines) {
      const std::vector<std::string> argv = MeasureArgv(args, p, e);
      spdlog::info("bench-rollout: {} run {}/{}", e, r, args.repeats);
      absl::StatusOr<nlohmann::ordered_json> j =
          RunJsonChild(argv, args.timeout_seconds);
      if (!j.ok()) {
        return absl::Status(
            j.status().code(),
            absl::StrCat("bench-rollout: ", e, ": ", j.status().message()));
      }
      EngineRuns& a = acc[e];
      a.rollout.push_back(j->value("rollout_tokens_per_second", 0.0));
      a.step.push_back(j->value("step_tokens_per_second", 0.0));
      a.runs.push_back(*j);
    }
  }
  return acc;
}

// The result: the shape, each engine's medians and runs, and the ratios
// between the engines measured.
nlohmann::ordered_json RolloutBenchResult(
    const BenchRolloutArgs& args, const RolloutBenchPlan& p,
    std::map<std::string, EngineRuns>& acc) {
  const ModelConfig& m = p.config.model;
  nlohmann::ordered_json result;
  result["config"] = args.config_path;
  result["shape"] = {{"vocab", p.vocab},
                     {"d_model", m.d_model},
                     {"n_layers", m.n_layers},
                     {"n_heads", m.n_heads},
                     {"d_ff", m.d_ff},
                     {"prompts", p.config.rollout.prompts_per_step},
                     {"group_size", p.config.rollout.group_size},
                     {"prompt_len", args.prompt_len},
                     {"max_new_tokens", p.config.rollout.max_new_tokens},
                     {"threads", p.config.num_threads}};
  result["repeats"] = args.repeats;
  result["iterations"] = args.iterations;
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const std::string& e : p.engines) {
    const EngineRuns& a = acc[e];
    out[e] = {{"median_rollout_tokens_per_second", Median(a.rollout)},
              {"median_step_tokens_per_second", Median(a.step)},
              {"runs", a.runs}};
  }
  result["engines"] = out;
  nlohmann::ordered_json ratios = nlohmann::ordered_json::object();
  for (const auto& [num, den] :
       {std::pair<std::string, std::string>{"fused", "python"},
        {"composite", "python"},
        {"fused", "composite"},
        {"composite", "static"}}) {
    if (!acc.count(num) || !acc.count(den)) continue;
    ratios[num + "/" + den] = {
        {"rollout", Median(acc[num].rollout) / Median(acc[den].rollout)},
        {"step", Median(acc[num].step) / Median(acc[den].step)}};
  }
  result["ratios"] = ratios;
  return result;
}

}  // namespace

int RunBenchRollout(const BenchRolloutArgs& args) {
  if (!args.measure.empty()) {
    if (args.measure != "fused" && args.measure != "composite" &&
        args.measure != "static") {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--measure: '", args.measure, "' (fused|composite|static)")));
    }
    return MeasureRolloutEngine(args, args.measure);
  }
  absl::StatusOr<RolloutBenchPlan> plan = PlanRolloutBench(args);
  if (!plan.ok()) return Fail(plan.status());
  absl::StatusOr<std::map<std::string, EngineRuns>> acc =
      RunMeasurements(args, *plan);
  if (!acc.ok()) return Fail(acc.status());
  return WriteBenchResult(RolloutBenchResult(args, *plan, *acc), args.out);
}

}  // namespace fusionrl::cli
