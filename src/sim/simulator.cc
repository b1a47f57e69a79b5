// The event loop of `fusionrl simulate`: simulated cards on a virtual
// clock, the real JobManager deciding plans, gates and commits.
//
// A card has two activities, rollout and training. colocated-sync runs them
// one after the other on the step's plan; fused runs the rollout ahead on
// predicted groups (as worker/fused_rollout.h does) under the policy-lag
// rule, and the training of step u once its plan, its rollout and version
// u-1 are there; while both run, each progresses at the rate the
// co-location model gives for the demands of their current segments
// (CoLocatedRates: the decode on the bandwidth the trainer leaves, the
// trainer on the compute the decode leaves). A super node's step ends with
// the intra-node all-reduce; the cross-node part of step c starts once all
// nodes finished c's backward (and the previous cross-node collective is
// done), and a node applies step u once the collectives of the steps up to
// the plan's updates_due_step (u - k; u for synchronous steps) are done.
#include "sim/simulator.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/job_manager.h"
#include "core/fake_clock.h"
#include "core/node_registry.h"
#include "core/status_macros.h"
#include "core/step_protocol.h"
#include "fusionrl/config.h"
#include "sim/simulation.h"

namespace fusionrl::sim {
namespace internal {

std::string Simulation::StallReport() const {
  std::vector<std::string> parts;
  for (const auto& n : nodes_) {
    parts.push_back(absl::StrCat(
        n->id, ": version ", n->version, ", plan ", n->plan_step,
        n->waiting ? absl::StrCat(", waiting for step ", n->want) : "",
        n->pending ? absl::StrCat(", step ", n->pending_step,
                                  " waiting for collectives")
                   : "",
        n->done ? ", done" : ""));
  }
  return absl::StrJoin(parts, "; ");
}

absl::StatusOr<SimRunResult> Simulation::Run() {
  for (int i = 0; i < n_; ++i) {
    NodeSpec spec;
    spec.host = "sim";
    spec.super_node = absl::StrCat("sn-", i);
    for (int c = 0; c < c_; ++c) spec.cards.push_back(CardSpec{c, "cpu", 0});
    FUSIONRL_ASSIGN_OR_RETURN(std::string id, registry_.Register(spec));
    auto node = std::make_unique<Node>();
    node->id = id;
    node->index = i;
    node->scale = ComputeScale(cost_, i, n_);
    node->cards.resize(c_);
    nodes_.push_back(std::move(node));
  }
  jobs_.Schedule();
  JobSubmission submission;
  submission.config = job_;
  FUSIONRL_ASSIGN_OR_RETURN(job_id_, jobs_.Submit(std::move(submission)));
  FUSIONRL_ASSIGN_OR_RETURN(JobStatus st, jobs_.Status(job_id_));
  if (st.phase != JobPhase::kRunning) {
    return absl::FailedPreconditionError(
        absl::StrCat(spec_.source_name, ": the controller did not start the ",
                     "job: ", JobPhaseText(st.phase), " ", st.message));
  }
  skewed_ = k_ > 0 && n_ > 1;
  for (auto& n : nodes_) {
    absl::StatusOr<Assignment> a = Call(
        true, [&] { return jobs_.GetAssignment(n->id, absl::ZeroDuration()); });
    if (!a.ok()) return a.status();
    if (a->job_id != job_id_) {
      return absl::InternalError(
          absl::StrCat(n->id, " was not assigned ", job_id_));
    }
  }
  for (auto& n : nodes_) {
    RequestPlan(*n, 1, /*repoll=*/false);
    if (!status_.ok()) return status_;
  }
  while (!events_.empty() && status_.ok()) {
    Event e = events_.top();
    events_.pop();
    if (e.t > now_) {
      clock_.Advance(absl::Seconds(e.t - now_));
      now_ = e.t;
    }
    e.fn();
  }
  FUSIONRL_RETURN_IF_ERROR(status_);
  for (const auto& n : nodes_) {
    if (!n->done) {
      return absl::InternalError(
          absl::StrCat("simulation stalled at ", now_, " s: ", StallReport()));
    }
  }
  FUSIONRL_ASSIGN_OR_RETURN(st, jobs_.Status(job_id_));
  SimRunResult r;
  r.mode = spec_.mode.name;
  r.super_nodes = n_;
  r.cards = n_ * c_;
  r.steps = st.step;
  r.job_phase = JobPhaseText(st.phase);
  if (st.phase != JobPhase::kSucceeded) {
    return absl::InternalError(absl::StrCat("the simulated job ended ",
                                            r.job_phase, ": ", st.message));
  }
  r.groups_submitted = st.groups_submitted;
  r.groups_trained = st.groups_trained;
  r.controller_rollout_tokens = st.rollout_tokens;
  r.max_clock_skew = st.max_clock_skew_seen;
  r.tokens = tokens_;
  r.seconds = end_time_;
  r.mean_step_seconds = r.steps > 0 ? end_time_ / r.steps : 0;
  r.tokens_per_second = end_time_ > 0 ? tokens_ / end_time_ : 0;
  double busy = 0;
  for (const auto& n : nodes_) {
    for (const Card& c : n->cards) busy += c.busy;
  }
  r.card_busy_fraction =
      end_time_ > 0 ? busy / (static_cast<double>(r.cards) * end_time_) : 0;
  r.max_staleness = max_staleness_;
  const double steps = std::max<int64_t>(1, r.steps);
  r.controller_messages_per_step = messages_ / steps;
  r.controller_cpu_seconds_per_step = cpu_ / steps;
  r.controller_tensor_bytes_per_step =
      static_cast<double>(jobs_.tensor_bytes()) / steps;
  return r;
}

}  // namespace internal

using internal::Simulation;

absl::StatusOr<SimMode> ParseSimMode(const std::string& text) {
  return ParseModeSpec(text, ModeGrammar::kSimulate);
}

namespace {

// The job the controller runs: one super node's job (`per_node`) scaled to
// the run's super nodes (weak scaling: N x its prompt groups), on the
// run's cluster, in the run's mode, on the c10d data plane.
JobConfig SimulatedJob(const SimRunSpec& spec, const JobConfig& per_node) {
  JobConfig job = per_node;
  job.placement.super_nodes = spec.super_nodes;
  job.placement.cards_per_super_node = spec.cards_per_super_node;
  job.rollout.prompts_per_step =
      per_node.rollout.prompts_per_step * spec.super_nodes;
  ApplyModeSpec(spec.mode, job);
  job.run.data_plane = DataPlane::kC10d;
  job.output_dir = spec.output_dir;
  return job;
}

}  // namespace

absl::StatusOr<SimRunResult> RunSimulation(const SimRunSpec& spec) {
  if (spec.super_nodes < 1 || spec.cards_per_super_node < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("super nodes and cards per super node must be >= 1, got ",
                     spec.super_nodes, " x ", spec.cards_per_super_node));
  }
  if (spec.output_dir.empty()) {
    return absl::InvalidArgumentError("output_dir: empty");
  }
  FUSIONRL_RETURN_IF_ERROR(ValidateCostModel(spec.cost));
  FUSIONRL_ASSIGN_OR_RETURN(
      JobConfig job,
      ParseJobConfig(spec.job_yaml, spec.source_name, spec.job_overrides));
  const int per_node = job.rollout.prompts_per_step;
  if (per_node % spec.cards_per_super_node != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.source_name, ": job.rollout.prompts_per_step: the prompt groups ",
        "of one super node (", per_node, ") must be a multiple of its ",
        spec.cards_per_super_node, " cards"));
  }
  Simulation sim(spec, SimulatedJob(spec, job));
  return sim.Run();
}

}  // namespace fusionrl::sim
