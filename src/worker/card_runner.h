// CardRunner: one card's part of one job, the step's orchestration.
//
// For every step the node's PlanRendezvous hands out, the card
//   1. gets its prompt groups' rollout: sampled now by GroupSampler
//      (colocated), or taken from its FusedRollout thread (fused,
//      disaggregated);
//   2. checks the samples' staleness (StalenessFilter);
//   3. trains one step (engine/train/trainer.h), its gradients summed over the
//      node's cards and the attempt's nodes (HierarchicalSync) or, in a
//      StaleSync job with clock skew, exchanged with the other super nodes;
//   4. sums the step's totals over the cards, syncs weights when the plan
//      says so, evaluates and checkpoints (lead card), and reports the step
//      (StepReport) to the controller through its WorkClient.
// An attempt another node can abort is bracketed by a StepSnapshot; an
// aborted or uncommitted attempt is rolled back and the replanned one run.
//
// Thread safety: one CardRunner per card thread; the node's cards share
// the WorkClient, the rendezvous and the c10d group.
#ifndef FUSIONRL_WORKER_CARD_RUNNER_H_
#define FUSIONRL_WORKER_CARD_RUNNER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "fusionrl/config.h"
#include "worker/card_counters.h"
#include "worker/plan_rendezvous.h"
#include "worker/work_client.h"

namespace fusionrl {

class GradientSync;

// Everything one card thread needs for one job (all pointers borrowed).
struct CardJob {
  WorkClient* client = nullptr;
  PlanRendezvous* rendezvous = nullptr;
  const Clock* clock = &RealClock();
  std::string node_id;
  std::string super_node;
  std::string job_id;
  const JobConfig* config = nullptr;  // the node's one copy, shared
  // The card's device; empty = config->device (a node of several GPUs puts
  // card i on cuda:<i>).
  std::string device;
  std::string resume_checkpoint;
  int local_rank = 0;
  int local_cards = 1;            // cards that train (the local ranks)
  int assigned_cards = 1;         // all the node's cards in the job
  int rollout_cards = 0;          // disaggregated: cards that only sample
  int threads = 1;                // intra-op threads the node's cards share
  GradientSync* local = nullptr;  // node's c10d group; null for one card
  // placement.expert_parallel E > 1: the c10d group of the E consecutive
  // training cards of the job whose expert shards make up one policy (this
  // card is its rank job_rank % E); null otherwise. `experts_span_nodes`:
  // the group's cards are on several nodes (worker processes).
  GradientSync* experts = nullptr;
  bool experts_span_nodes = false;
  // Fused with placement.expert_sampling shard: a second group of the same
  // cards, for the rollout thread's exchanges beside the trainer's; null
  // otherwise.
  GradientSync* rollout_experts = nullptr;
  // The job's training card this is while no node is lost
  // (Assignment::train_rank_offset + local_rank).
  int job_rank = 0;
  CardCounters* counters = nullptr;
  // disaggregated: the rollout card serving this one, and its device.
  CardCounters* rollout_counters = nullptr;
  std::string rollout_device;
  // Fault injection for tests: sleep this long after every trained step.
  absl::Duration debug_step_delay = absl::ZeroDuration();
  // Fault injection for tests: pause inside every checkpoint write, before
  // the written directory is moved into place.
  absl::Duration debug_checkpoint_delay = absl::ZeroDuration();
  // Fault injection for tests (fused, disaggregated): the rollout thread
  // samples the steps before this one without taking published weights
  // into its snapshot, as if they never arrived, so samples come over the
  // policy lag (FusedRollout::Options::freeze_snapshot_before_step).
  int64_t debug_freeze_rollout_snapshot_before_step = 0;
};

// Runs the card's part of the job until the plan ends it. OK when the job
// ended (or this node was released from it); the error otherwise, already
// reported to the controller by the lead card.
absl::Status RunCard(const CardJob& job);

// A failure of `job`'s card as the job reports it: for a card whose expert
// group spans worker processes, the message also says that a lost member's
// experts are on no other card and that the job goes on by --resume (once);
// any other status is returned as it is.
absl::Status WithExpertGroupNote(const CardJob& job, absl::Status status);

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_CARD_RUNNER_H_
