#include "engine/train/activation_planner.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "core/status_macros.h"
#include "engine/collectives/grad_sync.h"
#include "engine/model/model.h"
#include "engine/train/activation_memory.h"
#include "engine/train/trainer.h"
#include "spdlog/spdlog.h"

namespace fusionrl {
namespace {

// The planner's units per layer; the timer's slots are in the same order.
constexpr int kUnits = 5;
constexpr int kAttention = 0, kMlp = 1, kCore = kAttentionCoreSlot,
              kMlpAct = kMlpActSlot;
constexpr const char* kSubBlockNames[kUnits] = {"attention", "mlp", "norm",
                                                "attention_core", "mlp_act"};
constexpr ActivationAction LayerActivationPlan::*kMembers[kUnits] = {
    &LayerActivationPlan::attention, &LayerActivationPlan::mlp,
    &LayerActivationPlan::norm, &LayerActivationPlan::attention_core,
    &LayerActivationPlan::mlp_act};
// The finer unit inside each sub-block, keep or recompute only.
bool IsFinerUnit(int k) { return k == kCore || k == kMlpAct; }
int OuterUnit(int k) { return k == kCore ? kAttention : kMlp; }

// Bytes held for backward by one training forward of `batch` under `plan`.
absl::StatusOr<int64_t> HeldUnder(PolicyModel& model,
                                  const CollatedBatch& batch,
                                  std::vector<LayerActivationPlan> plan,
                                  int* measurements) {
  FUSIONRL_RETURN_IF_ERROR(model.SetActivationPlan(std::move(plan)));
  FUSIONRL_ASSIGN_OR_RETURN(
      ActivationReport r,
      MeasureTrainStep(model, batch, nullptr, /*run_backward=*/false));
  ++*measurements;
  return r.held_bytes;
}

struct TimedProfile {
  double step_seconds = 0;  // median forward + backward
  // [layer][sub-block] median forward seconds.
  std::vector<std::array<double, kUnits>> sub_block_seconds;
};

// `repeats` timed forward + backward steps under `plan` (after one warm-up),
// the backward through autograd::grad so no .grad is touched.
absl::StatusOr<TimedProfile> TimeSteps(PolicyModel& model,
                                       const CollatedBatch& batch,
                                       std::vector<LayerActivationPlan> plan,
                                       int repeats) {
  FUSIONRL_RETURN_IF_ERROR(model.SetActivationPlan(std::move(plan)));
  const size_t layers = model.activation_plan().size();
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : model.trainable_parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  SubBlockTimer timer;
  if (!model.device().is_cpu()) {
    const c10::Device device = model.device();
    // A host read waits for the device's stream.
    timer.sync = [device] { at::zeros({1}, at::device(device)).item(); };
  }
  std::vector<double> steps;
  std::vector<std::vector<double>> per(layers * kUnits);
  model.set_training(true);
  try {
    for (int i = 0; i <= repeats; ++i) {
      model.set_sub_block_timer(&timer);
      at::AutoGradMode grad_on(true);
      if (timer.sync) timer.sync();
      const absl::Time start = RealClock().MonotonicNow();
      at::Tensor logits =
          model.Forward(batch.input_ids, batch.positions, batch.valid);
      model.set_sub_block_timer(nullptr);
      at::Tensor loss = DefaultStepLoss(model, batch, logits);
      logits.reset();
      torch::autograd::grad({loss}, params, /*grad_outputs=*/{},
                            /*retain_graph=*/false, /*create_graph=*/false,
                            /*allow_unused=*/true);
      if (timer.sync) timer.sync();
      const double seconds = RealClock().SecondsSince(start);
      if (i == 0) continue;  // warm-up
      steps.push_back(seconds);
      for (size_t l = 0; l < layers; ++l) {
        for (int k = 0; k < kUnits; ++k) {
          per[l * kUnits + k].push_back(timer.seconds[l][k]);
        }
      }
    }
  } catch (const c10::Error& e) {
    model.set_sub_block_timer(nullptr);
    return absl::InternalError(absl::StrCat("activation planner: step failed: ",
                                            e.what_without_backtrace()));
  }
  TimedProfile out;
  out.step_seconds = Median(steps);
  out.sub_block_seconds.resize(layers);
  for (size_t l = 0; l < layers; ++l) {
    for (int k = 0; k < kUnits; ++k) {
      out.sub_block_seconds[l][k] = Median(per[l * kUnits + k]);
    }
  }
  return out;
}

struct Candidate {
  size_t unit;  // layer * kUnits + sub-block
  ActivationAction action;
  int64_t freed;
  double extra;
  // Bytes freed per second; a free candidate (extra <= 0) ranks first.
  double Rate() const {
    return extra > 0 ? freed / extra : std::numeric_limits<double>::infinity();
  }
};

bool Better(const Candidate& a, const Candidate& b) {
  if (a.Rate() != b.Rate()) return a.Rate() > b.Rate();
  if (a.freed != b.freed) return a.freed > b.freed;
  return a.unit < b.unit;  // deterministic
}

}  // namespace

std::string FormatActivationPlan(const std::vector<LayerActivationPlan>& plan) {
  std::vector<std::string> layers;
  for (size_t l = 0; l < plan.size(); ++l) {
    std::vector<std::string> items;
    for (int k = 0; k < kUnits; ++k) {
      items.push_back(absl::StrCat(kSubBlockNames[k], "=",
                                   ActivationActionName(plan[l].*kMembers[k])));
    }
    layers.push_back(absl::StrCat(l, ": ", absl::StrJoin(items, ",")));
  }
  return absl::StrJoin(layers, "; ");
}

namespace {

// Step 2: every sub-block's candidates (recompute; swap where it frees
// device memory), each measured alone against the all-keep plan, that free
// anything, most efficient first. Fills report.sub_blocks.
absl::StatusOr<std::vector<Candidate>> MeasureCandidates(
    PolicyModel& model, const CollatedBatch& batch,
    const std::vector<LayerActivationPlan>& keep, const TimedProfile& timed,
    bool swap_frees, const TimedProfile& swapped,
    ActivationPlanReport& report) {
  std::vector<Candidate> candidates;
  for (size_t l = 0; l < keep.size(); ++l) {
    for (int k = 0; k < kUnits; ++k) {
      SubBlockProfile p;
      p.layer = static_cast<int>(l);
      p.sub_block = kSubBlockNames[k];
      p.forward_seconds = timed.sub_block_seconds[l][k];
      std::vector<LayerActivationPlan> one = keep;
      one[l].*kMembers[k] = ActivationAction::kRecompute;
      FUSIONRL_ASSIGN_OR_RETURN(
          int64_t held, HeldUnder(model, batch, one, &report.measurements));
      p.recompute_freed_bytes = report.keep_held_bytes - held;
      p.recompute_extra_seconds = p.forward_seconds;
      candidates.push_back({l * kUnits + k, ActivationAction::kRecompute,
                            p.recompute_freed_bytes,
                            p.recompute_extra_seconds});
      if (swap_frees && !IsFinerUnit(k)) {  // keep or recompute only
        one[l].*kMembers[k] = ActivationAction::kSwap;
        FUSIONRL_ASSIGN_OR_RETURN(
            held, HeldUnder(model, batch, one, &report.measurements));
        p.swap_candidate = true;
        p.swap_freed_bytes = report.keep_held_bytes - held;
        p.swap_extra_seconds =
            2 *
            std::max(0.0, swapped.sub_block_seconds[l][k] - p.forward_seconds);
        candidates.push_back({l * kUnits + k, ActivationAction::kSwap,
                              p.swap_freed_bytes, p.swap_extra_seconds});
      }
      report.sub_blocks.push_back(std::move(p));
    }
  }
  candidates.erase(
      std::remove_if(candidates.begin(), candidates.end(),
                     [](const Candidate& c) { return c.freed <= 0; }),
      candidates.end());
  std::sort(candidates.begin(), candidates.end(), Better);
  return candidates;
}

// A plan under construction: the actions, the bytes it holds for backward
// (measured), and the candidates picked into it.
struct PlanSearch {
  std::vector<LayerActivationPlan> plan;
  int64_t held = 0;
  std::vector<Candidate> chosen;
};

// Step 3: greedy by bytes freed per second, measuring the plan after each
// pick, until it fits the budget (or the candidates run out).
absl::Status PickGreedily(PolicyModel& model, const CollatedBatch& batch,
                          const std::vector<Candidate>& candidates,
                          int64_t budget, ActivationPlanReport& report,
                          PlanSearch& search) {
  std::vector<bool> taken(search.plan.size() * kUnits, false);
  for (const Candidate& c : candidates) {
    if (search.held <= budget) break;
    if (taken[c.unit]) continue;
    taken[c.unit] = true;
    search.plan[c.unit / kUnits].*kMembers[c.unit % kUnits] = c.action;
    FUSIONRL_ASSIGN_OR_RETURN(search.held, HeldUnder(model, batch, search.plan,
                                                     &report.measurements));
    search.chosen.push_back(c);
  }
  return absl::OkStatus();
}

// Pruning: drop the least efficient picks while the plan still fits.
absl::Status PrunePicks(PolicyModel& model, const CollatedBatch& batch,
                        int64_t budget, ActivationPlanReport& report,
                        PlanSearch& search) {
  for (auto it = search.chosen.rbegin(); it != search.chosen.rend(); ++it) {
    ActivationAction& slot =
        search.plan[it->unit / kUnits].*kMembers[it->unit % kUnits];
    slot = ActivationAction::kKeep;
    FUSIONRL_ASSIGN_OR_RETURN(
        int64_t without,
        HeldUnder(model, batch, search.plan, &report.measurements));
    if (without <= budget) {
      search.held = without;
    } else {
      slot = it->action;
    }
  }
  return absl::OkStatus();
}

// Step 4's report: the chosen actions and their estimated extra time.
void ReportPlan(PlanSearch& search, ActivationPlanReport& report) {
  report.planned_held_bytes = search.held;
  for (const Candidate& c : search.chosen) {
    const LayerActivationPlan& layer = search.plan[c.unit / kUnits];
    if (layer.*kMembers[c.unit % kUnits] != c.action) continue;
    report.sub_blocks[c.unit].chosen = c.action;
    // A finer unit inside a recomputed sub-block costs nothing more.
    const int k = static_cast<int>(c.unit % kUnits);
    if (IsFinerUnit(k) &&
        layer.*kMembers[OuterUnit(k)] == ActivationAction::kRecompute) {
      continue;
    }
    report.estimated_extra_seconds += c.extra;
  }
  report.estimated_step_time_ratio =
      report.keep_step_seconds > 0
          ? (report.keep_step_seconds + report.estimated_extra_seconds) /
                report.keep_step_seconds
          : 1;
  report.plan = std::move(search.plan);
}

}  // namespace

absl::StatusOr<ActivationPlanReport> PlanActivations(
    PolicyModel& model, const CollatedBatch& batch,
    const PlannerOptions& options) {
  if (options.budget_bytes <= 0 || options.repeats < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activation planner: budget must be > 0 bytes and repeats >= 1, got ",
        options.budget_bytes, " and ", options.repeats));
  }
  const size_t layers = model.activation_plan().size();
  const std::vector<LayerActivationPlan> keep(layers);
  ActivationPlanReport report;
  report.budget_bytes = options.budget_bytes;

  // 1. The all-keep profile.
  FUSIONRL_ASSIGN_OR_RETURN(TimedProfile timed,
                            TimeSteps(model, batch, keep, options.repeats));
  report.keep_step_seconds = timed.step_seconds;
  FUSIONRL_ASSIGN_OR_RETURN(
      report.keep_held_bytes,
      HeldUnder(model, batch, keep, &report.measurements));

  // Swap's cost where it frees anything: the copies' forward time (a
  // swap-everything profile), doubled for the copies back.
  const bool swap_frees = SwapFreesDeviceMemory(model.device());
  TimedProfile swapped;
  if (swap_frees) {
    std::vector<LayerActivationPlan> all_swap(
        layers,
        LayerActivationPlan{ActivationAction::kSwap, ActivationAction::kSwap,
                            ActivationAction::kSwap, ActivationAction::kKeep});
    FUSIONRL_ASSIGN_OR_RETURN(
        swapped, TimeSteps(model, batch, all_swap, options.repeats));
  }

  // 2. Candidates, each measured alone.
  FUSIONRL_ASSIGN_OR_RETURN(const std::vector<Candidate> candidates,
                            MeasureCandidates(model, batch, keep, timed,
                                              swap_frees, swapped, report));

  // 3. Greedy picks until the budget is met, then pruning.
  PlanSearch search{keep, report.keep_held_bytes, {}};
  FUSIONRL_RETURN_IF_ERROR(PickGreedily(model, batch, candidates,
                                        options.budget_bytes, report, search));
  if (search.held > options.budget_bytes) {
    // Leave the model as configured (keep) rather than half-planned.
    FUSIONRL_RETURN_IF_ERROR(model.SetActivationPlan(keep));
    return absl::FailedPreconditionError(absl::StrCat(
        "activation budget of ", options.budget_bytes / 1048576.0,
        " MiB cannot be met: every sub-block kept holds ",
        report.keep_held_bytes / 1048576.0,
        " MiB for backward and the best plan the planner found still holds ",
        search.held / 1048576.0, " MiB (batch of ", batch.input_ids.size(0),
        " x ", batch.input_ids.size(1), " tokens)"));
  }
  FUSIONRL_RETURN_IF_ERROR(
      PrunePicks(model, batch, options.budget_bytes, report, search));

  // 4. Install and report.
  FUSIONRL_RETURN_IF_ERROR(model.SetActivationPlan(search.plan));
  ReportPlan(search, report);
  return report;
}

absl::StatusOr<std::optional<ActivationPlanReport>> PlanActivationsForJob(
    PolicyModel& model, int64_t rows) {
  const ModelConfig& c = model.config();
  if (c.activations.policy != ActivationPolicy::kAuto) return std::nullopt;
  // An expert shard's measuring passes would exchange tokens with its
  // group, pass for pass, while each card's timings pick its next pass: the
  // whole model is planned before it is sharded (ExpertShardOf keeps the
  // plan) and the group takes one plan (ShareActivationPlan).
  if (model.expert_shard().size > 1) return std::nullopt;
  CollatedBatch batch;
  try {
    const int64_t t = c.max_seq_len;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(/*seed=*/1);
    batch.input_ids =
        at::randint(model.vocab_size(), {std::max<int64_t>(1, rows), t}, gen,
                    at::kLong)
            .to(model.device());
    batch.valid = at::ones_like(batch.input_ids, at::kBool);
    batch.positions = PositionsFromValid(batch.valid);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("activation planner: ", e.what_without_backtrace()));
  }
  PlannerOptions options;
  options.budget_bytes =
      static_cast<int64_t>(c.activations.budget_mib * 1048576.0);
  absl::StatusOr<ActivationPlanReport> report =
      PlanActivations(model, batch, options);
  if (!report.ok()) {
    return absl::Status(report.status().code(),
                        absl::StrCat("model.activations (policy auto): ",
                                     report.status().message()));
  }
  spdlog::info(
      "activation plan for {} x {} tokens: holds {:.1f} MiB (budget {:.1f}, "
      "all kept {:.1f}), estimated step time x{:.2f}: {}",
      batch.input_ids.size(0), batch.input_ids.size(1),
      report->planned_held_bytes / 1048576.0, c.activations.budget_mib,
      report->keep_held_bytes / 1048576.0, report->estimated_step_time_ratio,
      FormatActivationPlan(report->plan));
  return std::optional<ActivationPlanReport>(*std::move(report));
}

absl::Status ShareActivationPlan(PolicyModel& model) {
  if (model.expert_shard().size == 1) return absl::OkStatus();
  if (model.expert_group() == nullptr) {
    return absl::FailedPreconditionError(
        "activation plan: an expert shard without its group");
  }
  const std::vector<LayerActivationPlan>& plan = model.activation_plan();
  std::vector<int64_t> codes;
  for (const LayerActivationPlan& l : plan) {
    for (ActivationAction a :
         {l.attention, l.mlp, l.norm, l.attention_core, l.mlp_act}) {
      codes.push_back(static_cast<int64_t>(a));
    }
  }
  std::vector<at::Tensor> tensors = {at::tensor(codes, at::kLong)};
  FUSIONRL_RETURN_IF_ERROR(model.expert_group()->Broadcast(tensors, 0));
  const int64_t* c = tensors[0].data_ptr<int64_t>();
  std::vector<LayerActivationPlan> shared(plan.size());
  for (LayerActivationPlan& l : shared) {
    for (ActivationAction* a :
         {&l.attention, &l.mlp, &l.norm, &l.attention_core, &l.mlp_act}) {
      *a = static_cast<ActivationAction>(*c++);
    }
  }
  return model.SetActivationPlan(std::move(shared));
}

}  // namespace fusionrl
