// Simulation: one run of `fusionrl simulate`'s event loop (see
// sim/simulator.cc for what a card does, sim/simulation_events.cc for the
// events' handlers). Internal to sim/.
#ifndef FUSIONRL_SIM_SIMULATION_H_
#define FUSIONRL_SIM_SIMULATION_H_

#include <time.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/job_manager.h"
#include "core/fake_clock.h"
#include "core/node_registry.h"
#include "sim/simulator.h"

namespace fusionrl::sim::internal {

// The calling thread's CPU seconds (the controller's cost per step).
inline double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

class Simulation {
 public:
  // `job`: the config submitted to the controller, the run's mode and
  // cluster set on it (SimulatedJob).
  Simulation(const SimRunSpec& spec, const JobConfig& job)
      : spec_(spec),
        job_(job),
        cost_(spec.cost),
        n_(spec.super_nodes),
        c_(spec.cards_per_super_node),
        s_(job.stalesync.max_policy_lag),
        k_(job.stalesync.max_clock_skew),
        fused_(job.placement.mode == PlacementMode::kFused),
        total_steps_(job.run.total_steps),
        prompts_per_node_(job.rollout.prompts_per_step / n_),
        rows_per_card_(prompts_per_node_ / c_ * job.rollout.group_size),
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
  const JobConfig job_;
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

}  // namespace fusionrl::sim::internal

#endif  // FUSIONRL_SIM_SIMULATION_H_
