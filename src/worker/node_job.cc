#include "worker/node_job.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/collectives/grad_sync.h"
#include "fusionrl/config.h"
#include "spdlog/spdlog.h"
#include "worker/card_runner.h"
#include "worker/controller_store.h"
#include "worker/plan_rendezvous.h"

namespace fusionrl {

namespace {

using Groups = std::vector<std::unique_ptr<GradientSync>>;

// One assignment on this node, from its checks to its cards' end: Run's
// steps over the job's groups and counters. The cards that train are the
// local ranks; disaggregated rollout cards are served by a rollout thread
// of each training card they feed.
class NodeJob {
 public:
  NodeJob(const NodeContext& node, const Assignment& assignment)
      : node_(node),
        assignment_(assignment),
        config_(assignment.config.get()),
        assigned_(static_cast<int>(assignment.card_indices.size())),
        rollout_cards_(assignment.rollout_cards),
        cards_(assigned_ - rollout_cards_),
        offset_(assignment.train_rank_offset),
        experts_span_nodes_(std::max(cards_, 0), false) {}

  absl::Status Run();

 private:
  // Reports `status` to the controller as this node's failure of the job
  // (the job fails) and returns it.
  absl::Status ReportFailure(const absl::Status& status) const;
  // The assignment carries a config and fits the node's cards.
  absl::Status CheckAssignment() const;
  // The node's c10d group over its training cards, and the expert groups.
  absl::Status FormGroups();
  // Forms the expert groups of this node's cards into `groups`, those
  // spanning nodes under the store prefix `prefix`<group>/.
  absl::Status FormExpertGroups(const std::string& prefix, Groups& groups);
  // Card i joins its expert group (number `group`) spanning worker
  // processes, through the controller's store.
  void JoinSpanningExpertGroup(const std::string& prefix, int group, int i,
                               std::unique_ptr<GradientSync>& joined,
                               absl::Status& status) const;
  // Expert groups spanning worker processes were formed: whether the job
  // allows them, then each card's join.
  absl::Status CheckSpanningExpertGroups(
      const std::vector<absl::Status>& joined) const;
  void AssignRoles() const;
  CardJob CardJobOf(int r, PlanRendezvous& rendezvous) const;
  // Runs every training card on its own thread to its end.
  std::vector<absl::Status> RunCards(const std::vector<CardJob>& jobs,
                                     PlanRendezvous& rendezvous) const;
  // The job's result on this node from its cards' results.
  absl::Status Outcome(const std::vector<absl::Status>& status) const;

  absl::Duration Timeout() const {
    return absl::Seconds(config_->run.collective_timeout_seconds);
  }
  int ExpertParallel() const { return config_->placement.expert_parallel; }
  CardCounters* CountersOf(int index) const {
    const auto& cards = *node_.cards;
    return cards[std::min<size_t>(index, cards.size() - 1)].get();
  }
  std::string DeviceOf(int index) const {
    // A node of several GPUs: card i runs on cuda:<its index>.
    return node_.device == "cuda" && config_->device == "cuda"
               ? absl::StrCat("cuda:", index)
               : config_->device;
  }

  const NodeContext& node_;
  const Assignment& assignment_;
  const JobConfig* const config_;  // null: the assignment is refused
  const int assigned_;             // all the node's cards in the job
  const int rollout_cards_;        // of them, disaggregated rollout cards
  const int cards_;                // of them, training cards (local ranks)
  const int offset_;               // the job's rank of local rank 0
  Groups local_;                   // one per training card; empty for one
  // Expert parallelism: each run of E consecutive training cards of the
  // job (card i is the job's card offset + i; E divides a super node's
  // cards, so no run crosses super nodes) holds one policy's expert shards,
  // connected by a group of their own: a local Gloo group where the run's
  // cards are all this node's, a group formed through the controller's
  // store where it spans nodes (worker processes).
  Groups experts_;
  // Fused cards sampling from their shards (expert_sampling shard): the
  // rollout thread exchanges beside the trainer, over a second group of
  // the same cards.
  Groups rollout_experts_;
  std::vector<bool> experts_span_nodes_;
};

absl::Status NodeJob::Run() {
  if (absl::Status s = CheckAssignment(); !s.ok()) return ReportFailure(s);
  if (absl::Status s = FormGroups(); !s.ok()) return ReportFailure(s);
  AssignRoles();
  spdlog::info(
      "{}: running {} on {} card(s){}", node_.node_id, assignment_.job_id,
      assigned_,
      rollout_cards_ > 0
          ? absl::StrCat(" (", rollout_cards_, " rollout, ", cards_, " train)")
          : std::string());
  PlanRendezvous::Options ro;
  ro.job_id = assignment_.job_id;
  ro.node_id = node_.node_id;
  ro.local_cards = cards_;
  ro.timeout = Timeout();
  PlanRendezvous rendezvous(*node_.client, ro, node_.stopping, *node_.clock);
  std::vector<CardJob> jobs;
  for (int r = 0; r < cards_; ++r) jobs.push_back(CardJobOf(r, rendezvous));
  return Outcome(RunCards(jobs, rendezvous));
}

absl::Status NodeJob::ReportFailure(const absl::Status& status) const {
  StepReport report;
  report.job_id = assignment_.job_id;
  report.node_id = node_.node_id;
  report.error = status;
  node_.client->FinishStep(report, absl::ZeroDuration()).IgnoreError();
  return status;
}

absl::Status NodeJob::CheckAssignment() const {
  if (config_ == nullptr) {
    return !assignment_.config_error.ok()
               ? assignment_.config_error
               : absl::InvalidArgumentError("assignment without a job config");
  }
  const size_t node_cards = node_.cards->size();
  if (assigned_ < 1 || assigned_ > static_cast<int>(node_cards) ||
      rollout_cards_ < 0 || rollout_cards_ >= assigned_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "assignment uses ", assigned_, " card(s), ", rollout_cards_,
        " of them for rollout only; this node has ", node_cards));
  }
  return absl::OkStatus();
}

absl::Status NodeJob::FormGroups() {
  if (cards_ > 1) {
    auto group = MakeLocalGlooGroup(cards_, Timeout());
    if (!group.ok()) return group.status();
    local_ = *std::move(group);
  }
  if (ExpertParallel() <= 1) return absl::OkStatus();
  absl::Status s = FormExpertGroups("experts/", experts_);
  if (s.ok() && config_->placement.mode == PlacementMode::kFused &&
      config_->placement.expert_sampling == ExpertSampling::kShard) {
    s = FormExpertGroups("rollout-experts/", rollout_experts_);
  }
  return s;
}

absl::Status NodeJob::FormExpertGroups(const std::string& prefix,
                                       Groups& groups) {
  const int ep = ExpertParallel();
  groups.resize(cards_);
  std::vector<absl::Status> joined(cards_);
  std::vector<std::thread> joining;
  absl::Status local_error;
  for (int r = 0; r < cards_;) {
    const int group = (offset_ + r) / ep;
    const int first = group * ep - offset_;  // local index of its rank 0
    const int end = first + ep;
    if (first >= 0 && end <= cards_) {
      auto local_group = MakeLocalGlooGroup(ep, Timeout());
      if (!local_group.ok()) {
        local_error = local_group.status();  // after the joins below
        break;
      }
      for (int i = 0; i < ep; ++i) {
        groups[first + i] = std::move((*local_group)[i]);
      }
    } else {
      // The group spans nodes: every local member joins it at once (the
      // rendezvous waits for all E).
      for (int i = r; i < std::min(end, cards_); ++i) {
        experts_span_nodes_[i] = true;
        joining.emplace_back([this, &prefix, &groups, &joined, group, i] {
          JoinSpanningExpertGroup(prefix, group, i, groups[i], joined[i]);
        });
      }
    }
    r = std::min(end, cards_);
  }
  for (std::thread& t : joining) t.join();
  if (!local_error.ok()) return local_error;
  if (joining.empty()) return absl::OkStatus();
  return CheckSpanningExpertGroups(joined);
}

void NodeJob::JoinSpanningExpertGroup(const std::string& prefix, int group,
                                      int i,
                                      std::unique_ptr<GradientSync>& joined,
                                      absl::Status& status) const {
  const int ep = ExpertParallel();
  auto formed = FormJobGroup(node_.client, assignment_.job_id, node_.node_id,
                             absl::StrCat(prefix, group, "/"),
                             (offset_ + i) % ep, ep, Timeout());
  if (formed.ok()) {
    joined = *std::move(formed);
  } else {
    status = formed.status();
  }
}

absl::Status NodeJob::CheckSpanningExpertGroups(
    const std::vector<absl::Status>& joined) const {
  const int ep = ExpertParallel();
  if (config_->placement.super_nodes > 1 &&
      config_->stalesync.max_clock_skew > 0) {
    // Each node of a skewed job runs its own clock; a group spanning
    // nodes would tie theirs at every exchange.
    return absl::InvalidArgumentError(absl::StrCat(
        "placement.expert_parallel is ", ep, " but ", node_.node_id, " holds ",
        cards_,
        " card(s) of its super node: an expert group spanning worker "
        "processes is not built for StaleSync across super nodes "
        "(stalesync.max_clock_skew > 0); give each worker a multiple of ",
        ep, " cards"));
  }
  for (int i = 0; i < cards_; ++i) {
    if (joined[i].ok()) continue;
    return absl::Status(
        joined[i].code(),
        absl::StrCat("placement.expert_parallel: ", node_.node_id, " card ", i,
                     " could not join expert group ", (offset_ + i) / ep,
                     " (it spans worker processes): ", joined[i].message()));
  }
  return absl::OkStatus();
}

void NodeJob::AssignRoles() const {
  const bool fused = config_->placement.mode == PlacementMode::kFused;
  for (int r = 0; r < assigned_; ++r) {
    CountersOf(assignment_.card_indices[r])->role =
        r < rollout_cards_   ? CardRole::kRollout
        : rollout_cards_ > 0 ? CardRole::kTrain
        : fused              ? CardRole::kFused
                             : CardRole::kColocated;
  }
}

CardJob NodeJob::CardJobOf(int r, PlanRendezvous& rendezvous) const {
  const int index = assignment_.card_indices[rollout_cards_ + r];
  CardJob job;
  job.client = node_.client;
  job.rendezvous = &rendezvous;
  job.clock = node_.clock;
  job.node_id = node_.node_id;
  job.super_node = node_.super_node;
  job.job_id = assignment_.job_id;
  job.config = config_;
  job.device = DeviceOf(index);
  job.resume_checkpoint = assignment_.resume_checkpoint;
  job.local_rank = r;
  job.local_cards = cards_;
  job.assigned_cards = assigned_;
  job.rollout_cards = rollout_cards_;
  job.threads = node_.threads > 0 ? node_.threads : config_->num_threads;
  job.debug_step_delay = node_.debug_step_delay;
  job.debug_checkpoint_delay = node_.debug_checkpoint_delay;
  if (rollout_cards_ > 0) {
    const int rollout_index = assignment_.card_indices[r % rollout_cards_];
    job.rollout_counters = CountersOf(rollout_index);
    job.rollout_device = DeviceOf(rollout_index);
    job.rollout_counters->active = true;
  }
  job.local = cards_ > 1 ? local_[r].get() : nullptr;
  job.experts = ExpertParallel() > 1 ? experts_[r].get() : nullptr;
  job.rollout_experts =
      rollout_experts_.empty() ? nullptr : rollout_experts_[r].get();
  job.experts_span_nodes = experts_span_nodes_[r];
  job.job_rank = offset_ + r;
  job.counters = CountersOf(index);
  return job;
}

// Runs card `r`'s part of the job, its exceptions as Internal errors.
absl::Status RunCardCatching(const CardJob& job, int r) {
  try {
    return RunCard(job);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("card ", r, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("card ", r, ": ", e.what()));
  }
}

// The card's counters read idle again (the heartbeat's card state).
void ReleaseCounters(const CardJob& job) {
  job.counters->active = false;
  job.counters->SetMemory(nullptr);
  if (job.rollout_counters != nullptr) {
    job.rollout_counters->active = false;
    job.rollout_counters->SetMemory(nullptr);
  }
}

std::vector<absl::Status> NodeJob::RunCards(const std::vector<CardJob>& jobs,
                                            PlanRendezvous& rendezvous) const {
  std::vector<absl::Status> status(cards_);
  std::vector<std::thread> threads;
  for (int r = 0; r < cards_; ++r) {
    threads.emplace_back([&status, &rendezvous, &jobs, r] {
      const CardJob& job = jobs[r];
      status[r] = WithExpertGroupNote(job, RunCardCatching(job, r));
      // Card 0 hands out the plans: release the cards waiting for one.
      if (r == 0 && !status[r].ok()) rendezvous.Fail(status[r]);
      ReleaseCounters(job);
    });
  }
  for (auto& t : threads) t.join();
  return status;
}

absl::Status NodeJob::Outcome(const std::vector<absl::Status>& status) const {
  for (int r = 0; r < cards_; ++r) {
    if (status[r].ok()) continue;
    // The job fails with the card's error (a repeat report is ignored by
    // the controller once the job has failed).
    if (!absl::IsCancelled(status[r])) ReportFailure(status[r]).IgnoreError();
    return absl::Status(status[r].code(),
                        absl::StrCat(assignment_.job_id, " card ", r, ": ",
                                     status[r].message()));
  }
  spdlog::info("{}: {} done", node_.node_id, assignment_.job_id);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunNodeJob(const NodeContext& node, const Assignment& assignment) {
  return NodeJob(node, assignment).Run();
}

}  // namespace fusionrl
