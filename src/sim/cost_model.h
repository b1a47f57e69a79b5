// The simulator's cost model: how long a simulated card takes to sample and
// to train a step, and how long the gradient collectives take, as pure
// functions of a few measured or assumed constants (docs/simulate.md).
//
// Nothing here runs a model: the times are formulas over sampled response
// lengths. The defaults describe a 7B-parameter bf16 policy on 8-card super
// nodes of an H100-class accelerator (400 GB/s inside a super node, 50 GB/s
// per card across); every default is an assumption written down in
// docs/simulate.md, not a measurement of this machine.
#ifndef FUSIONRL_SIM_COST_MODEL_H_
#define FUSIONRL_SIM_COST_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace fusionrl::sim {

// Response lengths: lognormal around `median` (sigma 0 = always the median),
// stochastically rounded to whole tokens, clipped to 1..max.
struct ResponseLengthModel {
  double median = 512;  // tokens
  double sigma = 0.7;   // of log(length); 0.7 gives a long tail (p99 ~5x)
  int max = 4096;       // tokens (the job's max_new_tokens in practice)
};

struct CostModel {
  // --- rollout (per card) -------------------------------------------------
  // One decode step of the card's batch costs base + per_token x rows still
  // decoding; the batch decodes until its longest response is done, so a
  // long tail keeps the card busy at a small batch.
  double decode_seconds_per_step_base = 0.005;  // weight reads (14 GB / HBM)
  double decode_seconds_per_token = 5e-5;       // per row and decode step
  double prefill_seconds_per_token = 3e-5;      // prompt tokens, once
  int prompt_length = 256;                      // tokens per prompt
  ResponseLengthModel response_length;
  // --- training (per card) ------------------------------------------------
  double train_seconds_per_token = 1.4e-4;    // prompt + response tokens
  double train_seconds_per_step_base = 0.05;  // optimizer step, fixed work
  double step_overhead_seconds = 0;  // per step: metric sums, bookkeeping
  // --- fused (RL Fusion) --------------------------------------------------
  // When rollout and training run on a card at the same time, each
  // progresses at this fraction of its solo speed (0.5 = pure time
  // slicing; > 0.5 = the two overlap, as memory-bound decode and
  // compute-bound training partly do). Alone, each gets the whole card.
  double fused_concurrency_share = 0.6;
  // --- collectives --------------------------------------------------------
  double model_params = 7e9;
  double bytes_per_param = 2;         // bf16 gradients
  double intra_bandwidth_gbps = 400;  // GB/s per card inside a super node
  double inter_bandwidth_gbps = 50;   // GB/s per card across super nodes
  double intra_latency_us = 5;        // per ring hop
  double inter_latency_us = 20;       // per ring hop
  // --- heterogeneity --------------------------------------------------------
  // The last `straggler_super_nodes` super nodes of a run are slower by
  // `straggler_slowdown` (only when the run has more super nodes than
  // stragglers: a straggler is slow relative to the others).
  int straggler_super_nodes = 1;
  double straggler_slowdown = 1.3;
  // Every card's rollout and training time of a step is multiplied by a
  // mean-1 lognormal factor with this sigma (0 = none).
  double jitter_sigma = 0.05;
  // --- hosts shared by simulated super nodes (validation on one machine) --
  // 0: every card has its own hardware. > 0: all super nodes share this
  // many host threads, as the embedded `fusionrl run` splits them (each
  // super node max(1, threads / N)); compute times scale by
  // calibration_threads / (threads of the super node's card), i.e. linear
  // thread scaling from the threads the costs were measured with.
  int shared_host_threads = 0;
  int calibration_threads = 1;
  uint64_t seed = 1;
};

// `node` is the cost_model mapping of `source` (a file name, for errors).
// Unknown keys, wrong types and out-of-range values are InvalidArgument
// "<source>: cost_model.<key>: <reason>". Keys not given keep `defaults`.
absl::StatusOr<CostModel> ParseCostModel(const YAML::Node& node,
                                         const std::string& source,
                                         const CostModel& defaults = {});

// Range checks; messages name the key ("cost_model.<key>: ...").
absl::Status ValidateCostModel(const CostModel& m);

// `count` response lengths for one card's batch, drawn from a generator
// seeded by (seed, super node, card, step): the same lengths whatever the
// order the simulator asks in, and the same across modes.
std::vector<int> SampleResponseLengths(const CostModel& m, int super_node,
                                       int card, int64_t step, int count);

// The jitter factor of (super node, card, step, what); 1 when
// jitter_sigma is 0.
double JitterFactor(const CostModel& m, int super_node, int card, int64_t step,
                    int what);

// Solo seconds of one card's rollout of `lengths` (one prompt of
// prompt_length per response; prefill of each, then decode steps until the
// longest is done).
double RolloutSeconds(const CostModel& m, const std::vector<int>& lengths);

// Solo seconds of one card's training step on `lengths` (responses) with
// their prompts, plus the per-step base and overhead.
double TrainSeconds(const CostModel& m, const std::vector<int>& lengths);

// The gradient bytes of one optimizer round (model_params x bytes_per_param).
double GradientBytes(const CostModel& m);

// Ring all-reduce of the gradients among the `cards` cards of one super
// node (reduce-scatter + all-gather): 2 (n-1)/n bytes / bw + 2 (n-1) lat.
double IntraCollectiveSeconds(const CostModel& m, int cards);

// The cross-super-node part of the hierarchical all-reduce: each of the
// `cards` rails all-reduces its 1/cards shard over a ring of `super_nodes`.
double InterCollectiveSeconds(const CostModel& m, int super_nodes, int cards);

// How many times slower super node `index` of `super_nodes` computes
// (straggler and shared-host factors; 1 for an ordinary dedicated node).
double ComputeScale(const CostModel& m, int index, int super_nodes);

}  // namespace fusionrl::sim

#endif  // FUSIONRL_SIM_COST_MODEL_H_
