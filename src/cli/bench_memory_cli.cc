#include "cli/bench_memory_cli.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/bench_common.h"
#include "cli/exit_codes.h"
#include "core/status_macros.h"
#include "engine/activation_memory.h"
#include "engine/job_common.h"
#include "engine/model.h"
#include "engine/sample.h"
#include "engine/trainer.h"
#include "fusionrl/config.h"
#include "fusionrl/task.h"
#include "fusionrl/tokenizer.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace fusionrl::cli {
namespace {

struct Policy {
  std::string name;    // as given
  std::string action;  // model.activations.policy
  double budget_mib = 0;
};

absl::StatusOr<Policy> ParsePolicy(const std::string& text) {
  Policy p;
  p.name = text;
  if (text == "none") {
    p.action = "keep";
    return p;
  }
  if (text == "recompute" || text == "swap") {
    p.action = text;
    return p;
  }
  if (text.rfind("auto:", 0) == 0 &&
      absl::SimpleAtod(text.substr(5), &p.budget_mib) && p.budget_mib > 0) {
    p.action = "auto";
    return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--policies: unknown policy '", text,
                   "' (none, recompute, swap, auto:<budget MiB>)"));
}

// `n` reference solutions of the task's training problems, as one batch.
absl::StatusOr<CollatedBatch> SolutionBatch(const JobContext& ctx, int n) {
  std::vector<Sample> samples;
  for (int i = 0; i < n; ++i) {
    const Problem p = ctx.task->TrainProblem(static_cast<uint64_t>(i));
    Sample s;
    FUSIONRL_ASSIGN_OR_RETURN(s.prompt_ids,
                              EncodePrompt(*ctx.tokenizer, p.prompt));
    FUSIONRL_ASSIGN_OR_RETURN(s.response_ids,
                              ctx.tokenizer->Encode(ctx.task->Solution(p)));
    s.response_ids.push_back(ctx.tokenizer->eos_id());
    samples.push_back(std::move(s));
  }
  return Collate(samples, ctx.tokenizer->pad_id(), ctx.device);
}

struct PolicyResult {
  std::vector<double> step_seconds;
  ActivationReport first;
  std::vector<at::Tensor> grads;  // after the first step
};

absl::StatusOr<PolicyResult> RunPolicy(const JobConfig& cfg, int batch_size,
                                       int repeats) {
  FUSIONRL_ASSIGN_OR_RETURN(JobContext ctx, PrepareJob(cfg, std::string()));
  FUSIONRL_ASSIGN_OR_RETURN(CollatedBatch batch,
                            SolutionBatch(ctx, batch_size));
  PolicyModel& model = *ctx.policy;
  PolicyResult r;
  // Step 0 (measured, gradients kept) and `repeats` timed steps, each from
  // zeroed gradients on the same weights.
  for (int i = 0; i <= repeats; ++i) {
    for (at::Tensor p : model.parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    FUSIONRL_ASSIGN_OR_RETURN(ActivationReport rep,
                              MeasureTrainStep(model, batch));
    if (i == 0) {
      r.first = rep;
      for (const at::Tensor& p : model.parameters()) {
        r.grads.push_back(p.grad().defined() ? p.grad().clone()
                                             : at::zeros_like(p));
      }
    } else {
      r.step_seconds.push_back(
          absl::ToDoubleSeconds(rep.forward_time + rep.backward_time));
    }
  }
  return r;
}

}  // namespace

CLI::App* AddBenchMemoryCommand(CLI::App& app, BenchMemoryArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "bench-memory",
      "activation memory and step time of a dense and a MoE policy under "
      "selective recompute / swap; JSON out");
  cmd->add_option("config", args.config_path,
                  "job YAML (configs/bench-memory.yaml)")
      ->required();
  cmd->add_option("--policies", args.policies,
                  "comma-separated: none, recompute, swap, auto:<MiB> "
                  "(default none,recompute,swap)");
  cmd->add_option("--repeats", args.repeats,
                  "timed steps per variant and policy (default 5)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--out", args.out, "write the JSON here (default stdout)");
  cmd->add_option("--set", args.overrides,
                  "override a config key: key.path=value (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  return cmd;
}

int RunBenchMemory(const BenchMemoryArgs& args) {
  std::vector<Policy> policies;
  for (const absl::string_view part : absl::StrSplit(args.policies, ',')) {
    absl::StatusOr<Policy> p = ParsePolicy(std::string(part));
    if (!p.ok()) return Fail(p.status());
    policies.push_back(*p);
  }
  if (policies.empty() || policies.front().name != "none") {
    return Fail(absl::InvalidArgumentError(
        "--policies: must start with none (the reference of every ratio)"));
  }
  absl::StatusOr<JobConfig> base =
      LoadBenchConfig(args.config_path, args.overrides);
  if (!base.ok()) return Fail(base.status());
  if (base->model.moe_experts == 0) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(args.config_path,
                     ": model.moe_experts: bench-memory needs a MoE policy "
                     "(its dense variant is the same model with "
                     "moe_experts 0)")));
  }
  const int batch_size = base->sft.batch_size;

  nlohmann::ordered_json result;
  result["config"] = args.config_path;
  result["device"] = base->device;
  result["batch_size"] = batch_size;
  result["repeats"] = args.repeats;
  // On a CPU the host pool is the same memory: swapped bytes stay held.
  result["held_counts_host_pool"] = base->device == "cpu";
  nlohmann::ordered_json variants = nlohmann::ordered_json::object();
  for (const char* variant : {"dense", "moe"}) {
    JobConfig v = *base;
    if (std::string(variant) == "dense") v.model.moe_experts = 0;
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    PolicyResult none;
    for (const Policy& p : policies) {
      JobConfig c = v;
      c.model.activations.policy = p.action;
      c.model.activations.budget_mib = p.budget_mib;
      spdlog::info("bench-memory: {} / {}", variant, p.name);
      absl::StatusOr<PolicyResult> r = RunPolicy(c, batch_size, args.repeats);
      if (!r.ok()) {
        if (absl::IsUnimplemented(r.status())) {
          out[p.name] = {{"error", std::string(r.status().message())}};
          continue;
        }
        return Fail(r.status());
      }
      if (p.name == "none") none = *r;
      double max_diff = 0;
      for (size_t i = 0; i < r->grads.size() && i < none.grads.size(); ++i) {
        max_diff = std::max(
            max_diff, (r->grads[i] - none.grads[i]).abs().max().item<double>());
      }
      const double t = Median(r->step_seconds);
      const double t_none = Median(none.step_seconds);
      const ActivationReport& a = r->first;
      out[p.name] = {
          {"activation_policy", p.action},
          {"held_bytes", a.held_bytes},
          {"device_held_bytes", a.device_held_bytes},
          {"device_peak_bytes", a.device_peak_bytes},
          {"host_pool_bytes", a.host_pool_bytes},
          {"host_pool_peak_bytes", a.host_pool_peak_bytes},
          {"median_step_seconds", t},
          {"held_ratio_to_none",
           none.first.held_bytes > 0
               ? static_cast<double>(a.held_bytes) / none.first.held_bytes
               : 0.0},
          {"step_time_ratio_to_none", t_none > 0 ? t / t_none : 0.0},
          {"max_abs_grad_diff_vs_none", max_diff},
          {"loss", a.loss}};
    }
    variants[variant] = out;
  }
  result["variants"] = variants;
  return WriteBenchResult(result, args.out);
}

}  // namespace fusionrl::cli
