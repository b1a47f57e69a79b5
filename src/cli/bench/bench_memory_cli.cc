#include "cli/bench/bench_memory_cli.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/bench/bench_common.h"
#include "cli/common/exit_codes.h"
#include "core/clock.h"
#include "core/status_macros.h"
#include "engine/collectives/grad_sync.h"
#include "engine/jobs/job_setup.h"
#include "engine/kernels/op_counter.h"
#include "engine/model/model.h"
#include "engine/rollout/sample.h"
#include "engine/train/activation_memory.h"
#include "engine/train/activation_planner.h"
#include "engine/train/memory_accounting.h"
#include "engine/train/trainer.h"
#include "fusionrl/config.h"
#include "fusionrl/task.h"
#include "fusionrl/tokenizer.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace fusionrl::cli {
namespace {

struct Policy {
  std::string name;                                   // as given
  ActivationPolicy action = ActivationPolicy::kKeep;  // model.activations
  // selective: the finer units recomputed in every layer (attention_core
  // and mlp_act), every sub-block kept.
  bool finer_units = false;
  // auto: the budget in MiB, or with budget_is_percent in percent of what
  // none holds for the same variant (0..100].
  double budget_mib = 0;
  bool budget_is_percent = false;
};

absl::StatusOr<Policy> ParsePolicy(const std::string& text) {
  Policy p;
  p.name = text;
  if (text == "none") return p;  // keep
  if (text == "recompute" || text == "swap") {
    p.action = *ParseActivationPolicy(text);
    return p;
  }
  if (text == "selective") {
    p.finer_units = true;
    return p;
  }
  if (text.rfind("auto:", 0) == 0) {
    std::string budget = text.substr(5);
    p.budget_is_percent = !budget.empty() && budget.back() == '%';
    if (p.budget_is_percent) budget.pop_back();
    if (absl::SimpleAtod(budget, &p.budget_mib) && p.budget_mib > 0 &&
        (!p.budget_is_percent || p.budget_mib <= 100)) {
      p.action = ActivationPolicy::kAuto;
      return p;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--policies: unknown policy '", text,
                   "' (none, recompute, swap, selective, auto:<budget MiB>, "
                   "auto:<percent of none's held bytes>%)"));
}

// `n` reference solutions of the task's training problems, as one batch.
// Training problems [first, first + n) with their solutions.
absl::StatusOr<CollatedBatch> SolutionBatch(const JobContext& ctx, int n,
                                            int first = 0) {
  std::vector<Sample> samples;
  for (int i = first; i < first + n; ++i) {
    FUSIONRL_ASSIGN_OR_RETURN(
        Sample s,
        SolutionSample(ctx, ctx.task->TrainProblem(static_cast<uint64_t>(i))));
    samples.push_back(std::move(s));
  }
  return Collate(samples, ctx.tokenizer->pad_id(), ctx.device);
}

struct PolicyRun {
  JobContext ctx;
  CollatedBatch batch;
  // Expert parallelism: cards 1..E-1 (ctx and batch are card 0's), and the
  // group of all E.
  std::vector<JobContext> peers;
  std::vector<CollatedBatch> peer_batches;
  std::vector<std::unique_ptr<GradientSync>> group;
  // Card 0's exchanges over the timed steps.
  int64_t alltoall_bytes = 0;
  double alltoall_seconds = 0;
  std::optional<ActivationPlanReport> plan;  // auto only
  std::string error;  // auto whose budget cannot be met: not stepped
  double plan_seconds = 0;
  std::vector<double> step_seconds;
  ActivationReport first;
  int64_t first_ops = 0;          // ATen operators of the first step
  std::vector<at::Tensor> grads;  // after the first step
};

// `measure` on card 0 here and on every expert-parallel peer at once (each
// on its own thread: their exchanges meet); card 0's report.
absl::StatusOr<ActivationReport> OnEveryCard(
    PolicyRun& run, const std::function<absl::StatusOr<ActivationReport>(
                        JobContext&, CollatedBatch&)>& measure) {
  std::vector<absl::Status> peers(run.peers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < run.peers.size(); ++i) {
    threads.emplace_back([&, i] {
      peers[i] = measure(run.peers[i], run.peer_batches[i]).status();
    });
  }
  absl::StatusOr<ActivationReport> mine = measure(run.ctx, run.batch);
  for (auto& t : threads) t.join();
  for (const absl::Status& s : peers) FUSIONRL_RETURN_IF_ERROR(s);
  return mine;
}

// One measured training step of `run` from zeroed gradients.
absl::StatusOr<ActivationReport> Step(PolicyRun& run) {
  return OnEveryCard(run, [](JobContext& ctx, CollatedBatch& batch) {
    for (at::Tensor p : ctx.policy->parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    return MeasureTrainStep(*ctx.policy, batch);
  });
}

// Expert parallelism: cuts run's model (card 0's) and its peers' into
// their shards of `cards`, each with its own batch of `batch_size`
// problems, connected by a new group. Plans were made on the whole models
// (ExpertShardOf keeps them).
absl::Status ShardExperts(PolicyRun& run, const JobConfig& c, int cards,
                          int batch_size) {
  FUSIONRL_ASSIGN_OR_RETURN(run.group,
                            MakeLocalGlooGroup(cards, absl::Seconds(300)));
  for (int r = 1; r < cards; ++r) {
    FUSIONRL_ASSIGN_OR_RETURN(JobContext peer, PrepareJob(c, std::string()));
    FUSIONRL_RETURN_IF_ERROR(
        peer.policy->SetActivationPlan(run.ctx.policy->activation_plan()));
    FUSIONRL_ASSIGN_OR_RETURN(CollatedBatch b,
                              SolutionBatch(peer, batch_size, r * batch_size));
    run.peers.push_back(std::move(peer));
    run.peer_batches.push_back(std::move(b));
  }
  for (int r = 0; r < cards; ++r) {
    JobContext& ctx = r == 0 ? run.ctx : run.peers[r - 1];
    FUSIONRL_ASSIGN_OR_RETURN(std::unique_ptr<PolicyModel> shard,
                              ctx.policy->ExpertShardOf(ExpertShard{r, cards}));
    shard->set_expert_group(run.group[r].get());
    ctx.policy = std::move(shard);
  }
  return absl::OkStatus();
}

// Every policy's model (same seed, so the same weights) and batch; auto
// policies planned on that batch. Then step 0 of each (measured, gradients
// kept) and `repeats` timed steps, interleaved across the policies so each
// ratio compares steps taken side by side.
absl::StatusOr<std::vector<PolicyRun>> RunPolicies(
    const JobConfig& variant, const std::vector<Policy>& policies,
    int batch_size, int repeats, int expert_parallel) {
  std::vector<PolicyRun> runs(policies.size());
  for (size_t i = 0; i < policies.size(); ++i) {
    JobConfig c = variant;
    c.model.activations.policy = policies[i].action;
    c.model.activations.budget_mib = policies[i].budget_mib;
    if (policies[i].finer_units) {
      c.model.activations.attention_core = SubBlockActivation::kRecompute;
      c.model.activations.mlp_act = SubBlockActivation::kRecompute;
    }
    FUSIONRL_ASSIGN_OR_RETURN(runs[i].ctx, PrepareJob(c, std::string()));
    FUSIONRL_ASSIGN_OR_RETURN(runs[i].batch,
                              SolutionBatch(runs[i].ctx, batch_size));
    if (policies[i].action == ActivationPolicy::kAuto) {
      PlannerOptions opts;
      opts.budget_bytes =
          static_cast<int64_t>(policies[i].budget_mib * 1048576.0);
      if (policies[i].budget_is_percent) {
        // What none (runs[0], prepared first) holds for this batch.
        FUSIONRL_ASSIGN_OR_RETURN(
            ActivationReport none,
            OnEveryCard(runs[0], [](JobContext& ctx, CollatedBatch& batch) {
              return MeasureTrainStep(*ctx.policy, batch, nullptr,
                                      /*run_backward=*/false);
            }));
        opts.budget_bytes = static_cast<int64_t>(
            none.held_bytes * policies[i].budget_mib / 100.0);
      }
      const absl::Time start = RealClock().MonotonicNow();
      absl::StatusOr<ActivationPlanReport> plan =
          PlanActivations(*runs[i].ctx.policy, runs[i].batch, opts);
      runs[i].plan_seconds = RealClock().SecondsSince(start);
      if (absl::IsFailedPrecondition(plan.status())) {
        runs[i].error = std::string(plan.status().message());
      } else if (!plan.ok()) {
        return plan.status();
      } else {
        runs[i].plan = *std::move(plan);
      }
    }
    if (expert_parallel > 1) {
      FUSIONRL_RETURN_IF_ERROR(
          ShardExperts(runs[i], c, expert_parallel, batch_size));
    }
  }
  for (PolicyRun& run : runs) {
    if (!run.error.empty()) continue;
    {
      OpCounter ops;
      FUSIONRL_ASSIGN_OR_RETURN(run.first, Step(run));
      run.first_ops = ops.count();
    }
    for (const at::Tensor& p : run.ctx.policy->parameters()) {
      run.grads.push_back(p.grad().defined() ? p.grad().clone()
                                             : at::zeros_like(p));
    }
  }
  for (int r = 0; r < repeats; ++r) {
    for (PolicyRun& run : runs) {
      if (!run.error.empty()) continue;
      const GradientSync::AllToAllTotals before =
          run.group.empty() ? GradientSync::AllToAllTotals{}
                            : run.group[0]->all_to_all_totals();
      FUSIONRL_ASSIGN_OR_RETURN(ActivationReport rep, Step(run));
      run.step_seconds.push_back(
          absl::ToDoubleSeconds(rep.forward_time + rep.backward_time));
      if (!run.group.empty()) {
        const GradientSync::AllToAllTotals& after =
            run.group[0]->all_to_all_totals();
        run.alltoall_bytes += after.bytes - before.bytes;
        run.alltoall_seconds += after.seconds - before.seconds;
      }
    }
  }
  return runs;
}

nlohmann::ordered_json PlanJson(const ActivationPlanReport& r, double seconds) {
  nlohmann::ordered_json subs = nlohmann::ordered_json::array();
  for (const SubBlockProfile& p : r.sub_blocks) {
    subs.push_back({{"layer", p.layer},
                    {"sub_block", p.sub_block},
                    {"forward_seconds", p.forward_seconds},
                    {"recompute_freed_bytes", p.recompute_freed_bytes},
                    {"swap_candidate", p.swap_candidate},
                    {"swap_freed_bytes", p.swap_freed_bytes},
                    {"swap_extra_seconds", p.swap_extra_seconds},
                    {"chosen", ActivationActionName(p.chosen)}});
  }
  return {{"budget_bytes", r.budget_bytes},
          {"plan", FormatActivationPlan(r.plan)},
          {"planned_held_bytes", r.planned_held_bytes},
          {"keep_held_bytes", r.keep_held_bytes},
          {"estimated_step_time_ratio", r.estimated_step_time_ratio},
          {"measurements", r.measurements},
          {"planning_seconds", seconds},
          {"sub_blocks", subs}};
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
                  "comma-separated: none, recompute, swap, selective (the "
                  "attention core and the SwiGLUs' insides recomputed in "
                  "every layer), auto:<MiB>, auto:<percent of none>% "
                  "(default none,recompute,swap)");
  cmd->add_option("--repeats", args.repeats,
                  "timed steps per variant and policy (default 5)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--expert-parallel", args.expert_parallel,
                  "spread the MoE variant's experts over this many cards "
                  "(threads, each with its own batch); card 0 is measured "
                  "(default 1)")
      ->check(CLI::Range(1, 64));
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
  if (base->model.moe_experts % args.expert_parallel != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--expert-parallel ", args.expert_parallel,
        ": must divide model.moe_experts (", base->model.moe_experts, ")")));
  }

  nlohmann::ordered_json result;
  result["config"] = args.config_path;
  result["device"] = base->device;
  result["batch_size"] = batch_size;
  result["repeats"] = args.repeats;
  result["expert_parallel"] = args.expert_parallel;
  // On a CPU the host pool is the same memory: swapped bytes stay held.
  result["held_counts_host_pool"] = base->device == "cpu";
  nlohmann::ordered_json variants = nlohmann::ordered_json::object();
  for (const char* variant : {"dense", "moe"}) {
    JobConfig v = *base;
    if (std::string(variant) == "dense") v.model.moe_experts = 0;
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    spdlog::info("bench-memory: {}", variant);
    absl::StatusOr<std::vector<PolicyRun>> runs =
        RunPolicies(v, policies, batch_size, args.repeats,
                    std::string(variant) == "moe" ? args.expert_parallel : 1);
    if (!runs.ok()) return Fail(runs.status());
    const PolicyRun& none = runs->front();
    const double t_none = Median(none.step_seconds);
    for (size_t i = 0; i < policies.size(); ++i) {
      const Policy& p = policies[i];
      const PolicyRun& r = (*runs)[i];
      if (!r.error.empty()) {
        out[p.name] = {{"activation_policy", ActivationPolicyName(p.action)},
                       {"error", r.error}};
        continue;
      }
      double max_diff = 0;
      for (size_t j = 0; j < r.grads.size() && j < none.grads.size(); ++j) {
        max_diff = std::max(
            max_diff, (r.grads[j] - none.grads[j]).abs().max().item<double>());
      }
      const double t = Median(r.step_seconds);
      const ActivationReport& a = r.first;
      out[p.name] = {
          {"activation_policy", ActivationPolicyName(p.action)},
          {"held_bytes", a.held_bytes},
          {"device_held_bytes", a.device_held_bytes},
          {"device_peak_bytes", a.device_peak_bytes},
          {"host_pool_bytes", a.host_pool_bytes},
          {"host_pool_peak_bytes", a.host_pool_peak_bytes},
          {"median_step_seconds", t},
          {"aten_ops_per_step", r.first_ops},
          {"held_ratio_to_none",
           none.first.held_bytes > 0
               ? static_cast<double>(a.held_bytes) / none.first.held_bytes
               : 0.0},
          {"step_time_ratio_to_none", t_none > 0 ? t / t_none : 0.0},
          {"max_abs_grad_diff_vs_none", max_diff},
          {"loss", a.loss}};
      out[p.name]["parameter_bytes"] = ParameterBytes(*r.ctx.policy);
      if (!r.group.empty()) {
        out[p.name]["alltoall_bytes_per_step"] =
            static_cast<double>(r.alltoall_bytes) / args.repeats;
        out[p.name]["alltoall_seconds_per_step"] =
            r.alltoall_seconds / args.repeats;
      }
      if (r.plan) out[p.name]["planner"] = PlanJson(*r.plan, r.plan_seconds);
    }
    variants[variant] = out;
  }
  result["variants"] = variants;
  return WriteBenchResult(result, args.out);
}

}  // namespace fusionrl::cli
