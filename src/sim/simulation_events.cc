// The event handlers of a Simulation (sim/simulation.h): a card's
// activities starting and finishing at the rates of the co-location model,
// plans asked of the real JobManager, and the steps' collectives and
// updates applied. The loop that dispatches them is in sim/simulator.cc.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/step_protocol.h"
#include "sim/simulation.h"

namespace fusionrl::sim::internal {

void Simulation::Reschedule(Node& node, int c) {
  Card& card = node.cards[c];
  const CoRates rates = Rates(card);
  const bool shared = card.roll.active && card.train.active;
  for (bool rollout : {true, false}) {
    Activity& a = rollout ? card.roll : card.train;
    if (!a.active) continue;
    const uint64_t gen = ++a.gen;
    Node* n = &node;
    // Shared, the rates change where either segment ends: wake up at the
    // end of this one. Alone, the activity runs at solo speed to its end.
    const double at =
        shared ? a.segment_left / (rollout ? rates.rollout : rates.train)
               : a.Remaining();
    At(now_ + at,
       [this, n, c, rollout, gen] { Finished(*n, c, rollout, gen); });
  }
}

void Simulation::Start(Node& node, int c, bool rollout, int64_t step, Work work,
                       int64_t behaviour) {
  Card& card = node.cards[c];
  Advance(card);
  Activity& a = rollout ? card.roll : card.train;
  a.active = true;
  a.work = std::move(work);
  a.segment = 0;
  a.segment_left = a.work.segments.empty() ? 0 : a.work.segments[0].seconds;
  a.Consume(0);  // skips empty segments
  a.since = now_;
  a.started = now_;
  a.step = step;
  a.behaviour = behaviour;
  Reschedule(node, c);
}

void Simulation::Finished(Node& node, int c, bool rollout, uint64_t gen) {
  Card& card = node.cards[c];
  Activity& a = rollout ? card.roll : card.train;
  if (!a.active || a.gen != gen) return;  // rescheduled since
  Advance(card);
  if (!a.Done()) {
    // A segment ended while the card is shared: the rates change.
    Reschedule(node, c);
    return;
  }
  a.active = false;
  ++a.gen;
  Reschedule(node, c);  // the other activity now runs alone
  const Activity done = a;
  if (rollout) {
    OnRolloutDone(node, c, done);
  } else {
    OnTrainDone(node, c, done);
  }
}

void Simulation::RequestPlan(Node& node, int64_t want, bool repoll) {
  node.want = want;
  absl::StatusOr<StepPlan> plan = Call(!repoll, [&] {
    return jobs_.GetStepPlan(job_id_, node.id, 0, want, absl::ZeroDuration());
  });
  if (!plan.ok()) return Fail(plan.status());
  switch (plan->kind) {
    case PlanKind::kWait:
      if (!node.waiting) {
        node.waiting = true;
        node.wait_since = now_;
      }
      return;
    case PlanKind::kAbandon:
      if (node.version == total_steps_) {
        // The lead ended the job before this node asked: as for a real
        // worker, the end of a job that ran all its steps.
        node.waiting = false;
        node.done = true;
        return;
      }
      return Fail(absl::InternalError(
          absl::StrCat(node.id, " told to abandon the job: ", plan->message)));
    case PlanKind::kEnd: {
      node.waiting = false;
      node.done = true;
      if (plan->rank == 0) {
        StepReport report;
        report.job_id = job_id_;
        report.node_id = node.id;
        report.step = plan->step;
        absl::StatusOr<bool> ended = Call(true, [&] {
          return jobs_.FinishStep(report, absl::ZeroDuration());
        });
        if (!ended.ok()) return Fail(ended.status());
      }
      return;
    }
    case PlanKind::kTrain:
      break;
  }
  if (node.waiting) {
    // The long poll is re-asked every kPlanWaitSeconds while it waits.
    messages_ +=
        static_cast<int64_t>((now_ - node.wait_since) / kPlanWaitSeconds);
    node.waiting = false;
  }
  for (int r = 1; r < c_; ++r) {
    absl::StatusOr<StepPlan> other = Call(true, [&] {
      return jobs_.GetStepPlan(job_id_, node.id, r, want, absl::ZeroDuration());
    });
    if (!other.ok()) return Fail(other.status());
    if (other->kind != PlanKind::kTrain || other->step != plan->step ||
        other->attempt != plan->attempt) {
      return Fail(absl::InternalError(absl::StrCat(
          node.id, ": card ", r, " got a different plan of step ", want)));
    }
  }
  node.plan = *std::move(plan);
  node.plan_step = want;
  OnPlan(node);
}

void Simulation::RepollWaiting(const Node* except) {
  for (auto& n : nodes_) {
    if (!status_.ok()) return;
    if (n.get() == except || !n->waiting) continue;
    RequestPlan(*n, n->want, /*repoll=*/true);
  }
}

void Simulation::OnPlan(Node& node) {
  const int64_t u = node.plan_step;
  for (int c = 0; c < c_; ++c) {
    if (fused_) {
      TryStartRollout(node, c);
      TryStartTrain(node, c);
      continue;
    }
    // colocated: sample the plan's groups now, then train on them.
    const std::vector<int> lengths =
        SampleResponseLengths(cost_, node.index, c, u, rows_per_card_);
    Work work = RolloutWork(cost_, lengths);
    work.Scale(node.scale * JitterFactor(cost_, node.index, c, u, 0));
    node.cards[c].next_rollout = u + 1;
    Start(node, c, /*rollout=*/true, u, std::move(work), node.version);
  }
}

void Simulation::TryStartRollout(Node& node, int c) {
  Card& card = node.cards[c];
  const int64_t r = card.next_rollout;
  if (!fused_ || card.roll.active || r > total_steps_) return;
  // Policy lag: the rollout of step r samples from version >= r - 1 - s.
  if (node.version < r - 1 - s_) return;
  const std::vector<int> lengths =
      SampleResponseLengths(cost_, node.index, c, r, rows_per_card_);
  Work work = RolloutWork(cost_, lengths);
  work.Scale(node.scale * JitterFactor(cost_, node.index, c, r, 0));
  card.next_rollout = r + 1;
  Start(node, c, /*rollout=*/true, r, std::move(work), node.version);
}

void Simulation::TryStartTrain(Node& node, int c) {
  Card& card = node.cards[c];
  const int64_t u = node.plan_step;
  if (card.train.active || u == 0 || card.next_train != u) return;
  auto it = card.ready.find(u);
  if (it == card.ready.end() || node.version < u - 1) return;
  Work work = TrainWork(cost_, it->second.lengths);
  work.Scale(node.scale * JitterFactor(cost_, node.index, c, u, 1));
  const int64_t staleness = (u - 1) - it->second.behaviour;
  node.staleness[u] = std::max(node.staleness[u], staleness);
  max_staleness_ = std::max(max_staleness_, staleness);
  Start(node, c, /*rollout=*/false, u, std::move(work), it->second.behaviour);
}

void Simulation::OnRolloutDone(Node& node, int c, const Activity& a) {
  Card& card = node.cards[c];
  Batch b;
  b.lengths =
      SampleResponseLengths(cost_, node.index, c, a.step, rows_per_card_);
  b.behaviour = a.behaviour;
  for (int len : b.lengths) b.tokens += len;
  card.ready[a.step] = std::move(b);
  if (node.index == 0 && c == 0) {
    node.lead_rollout_seconds = now_ - a.started;
  }
  TryStartTrain(node, c);
  TryStartRollout(node, c);
}

void Simulation::OnTrainDone(Node& node, int c, const Activity& a) {
  Card& card = node.cards[c];
  const int64_t u = a.step;
  const int64_t tokens = card.ready[u].tokens;
  card.ready.erase(u);
  card.next_train = u + 1;
  node.tokens[u] += tokens;
  step_tokens_[u] += tokens;
  tokens_ += tokens;
  if (node.index == 0 && c == 0) node.lead_train_seconds = now_ - a.started;
  if (++node.trained[u] == c_) {
    Node* n = &node;
    At(now_ + IntraCollectiveSeconds(cost_, c_),
       [this, n, u] { OnNodeBackward(*n, u); });
  }
}

void Simulation::OnNodeBackward(Node& node, int64_t step) {
  node.pending = true;
  node.pending_step = step;
  Collective& coll = collectives_[step];
  coll.ready = std::max(coll.ready, now_);
  if (++coll.nodes == n_) {
    // The cross-node ring of this step; one at a time on the links.
    const double start = std::max(coll.ready, last_inter_end_);
    const double end = start + InterCollectiveSeconds(cost_, n_, c_);
    last_inter_end_ = end;
    At(end, [this, step] { OnInterDone(step); });
  }
  TryApply(node);
}

void Simulation::OnInterDone(int64_t step) {
  inter_done_upto_ = std::max(inter_done_upto_, step);
  for (auto& n : nodes_) {
    if (!status_.ok()) return;
    TryApply(*n);
  }
}

void Simulation::TryApply(Node& node) {
  if (!node.pending) return;
  const int64_t u = node.pending_step;
  const int64_t due =
      node.plan.exchange_updates ? node.plan.updates_due_step : u;
  if (inter_done_upto_ < due) return;
  node.pending = false;
  node.version = u;
  const double step_seconds = now_ - node.last_apply;
  node.last_apply = now_;
  if (u == total_steps_) end_time_ = std::max(end_time_, now_);
  // The rollout may run further ahead now.
  for (int c = 0; c < c_; ++c) TryStartRollout(node, c);

  StepReport report;
  report.job_id = job_id_;
  report.node_id = node.id;
  report.step = u;
  report.attempt = node.plan.attempt;
  report.policy_version = u;
  const bool lead = node.plan.node_rank == 0;
  if (skewed_) report.rollout_tokens = node.tokens[u];
  if (lead) {
    const int64_t tokens = skewed_ ? node.tokens[u] : step_tokens_[u];
    const double samples =
        static_cast<double>(rows_per_card_) * c_ * (skewed_ ? 1 : n_);
    report.rollout_tokens = tokens;
    report.loop_seconds = step_seconds;
    report.metrics = {{"step", static_cast<double>(u)},
                      {"policy_version", static_cast<double>(u)},
                      {"response_len_mean", tokens / samples},
                      {"max_staleness", static_cast<double>(node.staleness[u])},
                      {"rollout_tokens", static_cast<double>(tokens)},
                      {"rollout_seconds", node.lead_rollout_seconds},
                      {"train_seconds", node.lead_train_seconds},
                      {"step_seconds", step_seconds},
                      {"cards", static_cast<double>(node.plan.world_size)},
                      {"nodes", static_cast<double>(node.plan.nodes)},
                      {"attempt", static_cast<double>(node.plan.attempt)},
                      {"simulated_seconds", now_}};
  }
  node.tokens.erase(u);
  node.staleness.erase(u);
  absl::StatusOr<bool> finished = Call(
      true, [&] { return jobs_.FinishStep(report, absl::ZeroDuration()); });
  // With timeout 0, a synchronous step not yet committed answers
  // DEADLINE_EXCEEDED after recording the node's finish.
  bool committed = false;
  if (finished.ok()) {
    committed = *finished;
  } else if (!absl::IsDeadlineExceeded(finished.status())) {
    return Fail(finished.status());
  }
  RequestPlan(node, u + 1, /*repoll=*/false);
  // A commit (or, skewed, any node's progress) may answer the long polls.
  if (committed || skewed_) RepollWaiting(&node);
}

}  // namespace fusionrl::sim::internal
