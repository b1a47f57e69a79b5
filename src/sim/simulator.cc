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

#include <time.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "controller/job_manager.h"
#include "core/config_override.h"
#include "core/fake_clock.h"
#include "core/node_registry.h"
#include "core/status_macros.h"
#include "core/step_protocol.h"
#include "fusionrl/v1/job.pb.h"

namespace fusionrl::sim {
namespace {

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

class Simulation {
 public:
  Simulation(const SimRunSpec& spec, const JobConfig& job)
      : spec_(spec),
        cost_(spec.cost),
        n_(spec.super_nodes),
        c_(spec.cards_per_super_node),
        s_(spec.mode.policy_lag),
        k_(spec.mode.clock_skew),
        fused_(spec.mode.placement == PlacementMode::kFused),
        total_steps_(job.run.total_steps),
        prompts_per_node_(job.rollout.prompts_per_step),
        rows_per_card_(job.rollout.prompts_per_step / c_ *
                       job.rollout.group_size),
        registry_(clock_, absl::Hours(24 * 365)),
        jobs_(registry_, clock_) {}

  absl::StatusOr<SimRunResult> Run();

 private:
  struct Activity {
    bool active = false;
    Work work;
    size_t segment = 0;       // the segment under way
    double segment_left = 0;  // its solo seconds left
    double since = 0;         // when `segment_left` was last brought up to date
    double started = 0;
    uint64_t gen = 0;  // invalidates scheduled events
    int64_t step = 0;
    int64_t behaviour = 0;  // rollout: the version it samples from

    bool Done() const { return segment >= work.segments.size(); }
    const Demand& demand() const { return work.segments[segment].demand; }
    // Solo seconds left, all segments.
    double Remaining() const {
      double left = segment_left;
      for (size_t i = segment + 1; i < work.segments.size(); ++i) {
        left += work.segments[i].seconds;
      }
      return left;
    }
    // Moves `solo` seconds of work forward, across segment ends (a segment
    // within a nanosecond of its end counts as ended).
    void Consume(double solo) {
      while (!Done() && solo >= segment_left - 1e-9) {
        solo -= segment_left;
        ++segment;
        segment_left = Done() ? 0 : work.segments[segment].seconds;
      }
      if (!Done()) segment_left -= std::max(0.0, solo);
    }
  };
  struct Batch {
    std::vector<int> lengths;
    int64_t behaviour = 0;
    int64_t tokens = 0;
  };
  struct Card {
    Activity roll, train;
    int64_t next_rollout = 1;  // fused: the next step to sample
    int64_t next_train = 1;
    std::map<int64_t, Batch> ready;  // sampled, not yet trained
    double busy = 0;
    double busy_since = 0;
  };
  struct Node {
    std::string id;
    int index = 0;  // super node index (stragglers are the last ones)
    double scale = 1;
    std::vector<Card> cards;
    int64_t version = 0;    // optimizer steps applied
    int64_t plan_step = 0;  // the step whose plan the node holds
    StepPlan plan;
    bool waiting = false;  // in a long poll for step `want`
    double wait_since = 0;
    int64_t want = 0;
    bool done = false;
    std::map<int64_t, int> trained;  // cards done training a step
    std::map<int64_t, int64_t> tokens;
    std::map<int64_t, int64_t> staleness;
    bool pending = false;  // backward + intra-node reduce done, not applied
    int64_t pending_step = 0;
    double last_apply = 0;
    double lead_rollout_seconds = 0, lead_train_seconds = 0;
  };
  struct Collective {
    int nodes = 0;
    double ready = 0;
  };
  struct Event {
    double t;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Event& o) const {
      return t != o.t ? t > o.t : seq > o.seq;
    }
  };

  void At(double t, std::function<void()> fn) {
    events_.push(Event{t, next_seq_++, std::move(fn)});
  }
  void Fail(absl::Status s) {
    if (status_.ok()) status_ = std::move(s);
  }

  // Times a JobManager call (thread CPU) and counts it as a message.
  template <typename F>
  auto Call(bool count, F f) {
    if (count) ++messages_;
    const double t0 = ThreadCpuSeconds();
    auto r = f();
    cpu_ += ThreadCpuSeconds() - t0;
    return r;
  }

  // The speeds of the card's activities, as fractions of solo speed.
  CoRates Rates(const Card& card) const {
    if (!card.roll.active || !card.train.active || card.roll.Done() ||
        card.train.Done()) {
      return {};
    }
    return CoLocatedRates(cost_, card.roll.demand(), card.train.demand());
  }
  // Brings both activities' remaining work and the busy time up to now.
  void Advance(Card& card) {
    const CoRates rates = Rates(card);
    for (bool rollout : {true, false}) {
      Activity& a = rollout ? card.roll : card.train;
      if (!a.active) continue;
      a.Consume((rollout ? rates.rollout : rates.train) * (now_ - a.since));
      a.since = now_;
    }
    if (card.roll.active || card.train.active) {
      card.busy += now_ - card.busy_since;
    }
    card.busy_since = now_;
  }
  void Reschedule(Node& node, int c);
  void Start(Node& node, int c, bool rollout, int64_t step, Work work,
             int64_t behaviour);
  void Finished(Node& node, int c, bool rollout, uint64_t gen);

  void RequestPlan(Node& node, int64_t want, bool repoll);
  void RepollWaiting(const Node* except);
  void OnPlan(Node& node);
  void TryStartRollout(Node& node, int c);
  void TryStartTrain(Node& node, int c);
  void OnRolloutDone(Node& node, int c, const Activity& a);
  void OnTrainDone(Node& node, int c, const Activity& a);
  void OnNodeBackward(Node& node, int64_t step);
  void OnInterDone(int64_t step);
  void TryApply(Node& node);
  std::string StallReport() const;

  const SimRunSpec& spec_;
  const CostModel cost_;
  const int n_, c_;
  const int s_;  // stalesync.max_policy_lag
  const int k_;  // stalesync.max_clock_skew
  const bool fused_;
  const int64_t total_steps_;
  const int prompts_per_node_;
  const int rows_per_card_;
  FakeClock clock_;
  NodeRegistry registry_;
  JobManager jobs_;
  std::string job_id_;
  bool skewed_ = false;

  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t next_seq_ = 0;
  double now_ = 0;
  absl::Status status_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<int64_t, Collective> collectives_;
  double last_inter_end_ = 0;
  int64_t inter_done_upto_ = 0;
  std::map<int64_t, int64_t> step_tokens_;  // all nodes
  int64_t tokens_ = 0;
  int64_t max_staleness_ = 0;
  double end_time_ = 0;
  int64_t messages_ = 0;
  double cpu_ = 0;
};

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
  v1::SubmitJobRequest submit;
  submit.set_config_yaml(spec_.job_yaml);
  submit.set_source_name(spec_.source_name);
  auto add = [&submit](const std::string& o) { submit.add_overrides(o); };
  for (const std::string& o : spec_.job_overrides) add(o);
  add(absl::StrCat("placement.mode=", PlacementModeName(spec_.mode.placement)));
  add(absl::StrCat("placement.super_nodes=", n_));
  add(absl::StrCat("placement.cards_per_super_node=", c_));
  // The prompts of N super nodes (weak scaling).
  add(absl::StrCat("rollout.prompts_per_step=", prompts_per_node_ * n_));
  add(absl::StrCat("stalesync.max_policy_lag=", s_));
  add(absl::StrCat("stalesync.max_clock_skew=", k_));
  if (s_ > 0) add("algorithm.decoupled_loss=true");
  add("run.data_plane=c10d");
  add(QuotedOverride("output_dir", spec_.output_dir));
  FUSIONRL_ASSIGN_OR_RETURN(job_id_, jobs_.Submit(submit));
  FUSIONRL_ASSIGN_OR_RETURN(v1::JobStatus st, jobs_.Status(job_id_));
  if (st.phase() != v1::JOB_PHASE_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        spec_.source_name, ": the controller did not start the ",
        "job: ", v1::JobPhase_Name(st.phase()), " ", st.message()));
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
  r.steps = st.step();
  r.job_phase = v1::JobPhase_Name(st.phase());
  if (st.phase() != v1::JOB_PHASE_SUCCEEDED) {
    return absl::InternalError(absl::StrCat("the simulated job ended ",
                                            r.job_phase, ": ", st.message()));
  }
  r.groups_submitted = st.groups_submitted();
  r.groups_trained = st.groups_trained();
  r.controller_rollout_tokens = st.rollout_tokens();
  r.max_clock_skew = st.max_clock_skew_seen();
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

}  // namespace

absl::StatusOr<SimMode> ParseSimMode(const std::string& text) {
  SimMode m;
  m.name = text;
  if (text == "colocated-sync") return m;
  if (text == "fused") {
    m.placement = PlacementMode::kFused;
    return m;
  }
  const std::string prefix = "fused+stalesync";
  if (text.rfind(prefix, 0) == 0) {
    m.placement = PlacementMode::kFused;
    m.policy_lag = 2;
    m.clock_skew = 2;
    const std::string rest = text.substr(prefix.size());
    if (rest.empty()) return m;
    const std::vector<std::string> parts = absl::StrSplit(rest.substr(1), ':');
    bool ok = rest[0] == ':' && parts.size() <= 2 &&
              absl::SimpleAtoi(parts[0], &m.policy_lag);
    m.clock_skew = m.policy_lag;
    if (ok && parts.size() == 2) ok = absl::SimpleAtoi(parts[1], &m.clock_skew);
    if (!ok || m.policy_lag < 0 || m.policy_lag > 1024 || m.clock_skew < 0 ||
        m.clock_skew > 1024) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--modes: '", text,
          "': expected fused+stalesync[:s[:k]] (policy lag s, clock skew k, "
          "each in 0..1024; k = s when omitted)"));
    }
    return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--modes: unknown mode '", text,
                   "' (colocated-sync, fused, fused+stalesync[:s[:k]])"));
}

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
  Simulation sim(spec, job);
  return sim.Run();
}

}  // namespace fusionrl::sim
