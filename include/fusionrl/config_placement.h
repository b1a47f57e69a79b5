// A section of the job configuration: where a job runs (placement.*, memory.*,
// cluster.*).
// Include fusionrl/config.h, which holds every section and the functions
// that load and validate a job.
#ifndef FUSIONRL_CONFIG_PLACEMENT_H_
#define FUSIONRL_CONFIG_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fusionrl {

// What each card of a job does (placement.mode).
//   colocated-sync: every card trains and samples, alternating (hybrid
//                   engine).
//   disaggregated:  separate rollout and train cards.
//   fused:          every card trains and samples at the same time (RL
//                   Fusion).
enum class PlacementMode { kColocatedSync, kDisaggregated, kFused };
absl::StatusOr<PlacementMode> ParsePlacementMode(absl::string_view name);
const char* PlacementModeName(PlacementMode mode);

// fused, with a lag and every thread shared: whether a card's trainer and
// rollout compute at the same time or take turns on all its threads
// (worker/step/card_turns.h). probe measures both and keeps the faster; auto
// probes on an accelerator and takes turns (interleaved) on a CPU card,
// where both roles are bound by the same cores (docs/BENCHMARKS.md).
enum class FusedTurns { kAuto, kConcurrent, kInterleaved, kProbe };
absl::StatusOr<FusedTurns> ParseFusedTurns(absl::string_view name);
const char* FusedTurnsName(FusedTurns turns);

// Expert parallelism: what a card samples and evaluates from.
//   gathered: a frozen copy of the whole model, gathered from the group
//             after every step (rollout free of collectives; a whole
//             model's memory on every card).
//   shard:    the card's own expert shard, in lockstep with its group
//             (every decode step exchanges tokens; no whole copy).
enum class ExpertSampling { kGathered, kShard };
absl::StatusOr<ExpertSampling> ParseExpertSampling(absl::string_view name);
const char* ExpertSamplingName(ExpertSampling sampling);

// Which cards a job gets and what each card does. A super node is a group
// of cards with a fast local interconnect (one machine here); the job takes
// the same number of cards in each of the super nodes it spans.
struct PlacementConfig {
  // colocated-sync | disaggregated | fused (see PlacementMode).
  PlacementMode mode = PlacementMode::kColocatedSync;
  int super_nodes = 1;                   // super nodes the job spans
  int cards_per_super_node = 1;          // cards used in each super node
  int rollout_cards_per_super_node = 0;  // disaggregated only: how many of
                                         //   those cards sample; the rest
                                         //   train (0 for the other modes)
  // fused: LibTorch intra-op threads of each card's trainer and rollout
  // thread; 0 = split the card's share of num_threads (trainer half,
  // rollout the rest).
  int fused_train_threads = 0;
  int fused_rollout_threads = 0;
  // fused: a role whose partner is idle borrows the partner's threads (the
  // trainer before each forward pass, the rollout before each decode step),
  // so the card's compute is not left idle. Results do not depend on it
  // (docs/stalesync.md, "Threads").
  bool fused_share_idle_threads = true;
  // fused, s > 0, sharing on: auto | concurrent | interleaved | probe (see
  // FusedTurns). Results do not depend on it, only the speed.
  FusedTurns fused_turns = FusedTurns::kAuto;
  // Expert parallelism (MoE; docs/moe.md): each run of E consecutive
  // training cards of a node holds one policy, each card 1 / E of every
  // block's experts (tokens reach them by all-to-all). 1 = every card
  // holds every expert.
  int expert_parallel = 1;
  // expert_parallel > 1: gathered | shard (see ExpertSampling).
  ExpertSampling expert_sampling = ExpertSampling::kGathered;
  bool fail_if_unplaceable = false;  // false: wait for capacity, showing the
                                     //   reason in status; true: fail the job
};

// Per-card memory accounting and hand-over between the roles of a card
// (src/core/memory_manager.h, docs/stalesync.md "Per-card memory").
// memory.offload_optimizer (see MemoryConfig): never = refuse a request
// that does not fit; auto = offload the optimizer state to host memory to
// make room.
enum class OffloadPolicy { kNever, kAuto };
absl::StatusOr<OffloadPolicy> ParseOffloadPolicy(absl::string_view name);
const char* OffloadPolicyName(OffloadPolicy policy);

struct MemoryConfig {
  // Device memory each card may use for weights, rollout snapshot, optimizer
  // state, gradients, activations and KV cache together, in MiB (2^20
  // bytes); 0 = unlimited (account only, never refuse).
  double card_budget_mib = 0;
  // When the KV cache or the activations would exceed the budget: auto =
  // move the optimizer state to host memory first (it comes back before the
  // next optimizer step once it fits); never = refuse the request.
  OffloadPolicy offload_optimizer = OffloadPolicy::kAuto;
};

// How clients of a cluster controller (`fusionrl submit`, `fusionrl status`)
// authenticate; the controller and workers take the same as flags.
struct ClusterConfig {
  std::string auth_token_file;  // file whose first line is the shared token
  std::string auth_token_env;   // or: environment variable holding it
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONFIG_PLACEMENT_H_
