// The simulator's cost model: how long a simulated card takes to sample and
// to train a step, what each of the two uses of the card's memory bandwidth
// and compute while it does, how fast each runs when both share the card
// (the co-location model), and how long the gradient collectives take: pure
// functions of a few published or assumed constants (docs/simulate.md).
//
// Nothing here runs a model: the times are formulas over sampled response
// lengths. The defaults describe a 7B-parameter bf16 policy on 8-card super
// nodes of H100 SXM cards (989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 400 GB/s
// inside a super node, 50 GB/s per card across); every default is a
// published figure or an assumption written down in docs/simulate.md, not a
// measurement of this machine.
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

// How a card's rollout and training times are computed.
enum class Timing {
  // From the card and the model: a decode step takes max(bytes /
  // bandwidth, FLOPs / peak), prefill and training FLOPs / (peak x mfu).
  kRoofline,
  // From measured per-token seconds (what --calibrate-from fits); both
  // roles use one resource (the host's cores).
  kLinear,
};

// "roofline" | "linear".
const char* TimingName(Timing t);

struct CostModel {
  Timing timing = Timing::kRoofline;
  // --- the card (timing: roofline) -----------------------------------------
  double peak_tflops = 989;  // dense bf16 (H100 SXM datasheet)
  double hbm_gbps = 3350;    // HBM bandwidth (H100 SXM datasheet)
  double mfu = 0.40;         // achieved / peak FLOPs of training and prefill
  // Achieved / peak bandwidth, every role (1: the datasheet's, the
  // roofline's bound).
  double hbm_utilization = 1;
  // --- the model (timing: roofline; model_params, bytes_per_param below) ---
  // K and V of one context token over all layers, read by every decode step
  // (7B-like: 28 layers x 4 KV heads x 128 x 2 (K, V) x 2 bytes).
  double kv_bytes_per_token = 57344;
  // Training FLOPs per parameter and token (prompt + response): 6 for the
  // forward and backward, 2 for the log-prob forward of the old policy.
  double train_flops_per_param_token = 8;
  // The share of the achieved bandwidth the trainer uses while it trains at
  // its solo speed (activations, norms, elementwise kernels); its compute
  // share is 1: training is compute-bound.
  double train_hbm_fraction = 0.15;
  // --- rollout and training, measured (timing: linear) ----------------------
  // One decode step of the card's batch costs base + per_token x rows still
  // decoding; the batch decodes until its longest response is done, so a
  // long tail keeps the card busy at a small batch.
  double decode_seconds_per_step_base = 0.005;
  double decode_seconds_per_token = 5e-5;  // per row and decode step
  double prefill_seconds_per_token = 3e-5;
  double train_seconds_per_token = 1.4e-4;    // prompt + response tokens
  double train_seconds_per_step_base = 0.05;  // optimizer step, fixed work
  // --- both timings ----------------------------------------------------------
  int prompt_length = 256;  // tokens per prompt
  ResponseLengthModel response_length;
  double step_overhead_seconds = 0;  // per step: metric sums, bookkeeping
  // --- fused (RL Fusion): rollout and training on one card at once --------
  // Each role gets what the other leaves of the resource it is bound by
  // (CoLocatedRates), times `interference`: the share of that speed left
  // after the two contend for caches, schedulers and launch slots (1 = none).
  double interference = 0.9;
  // The old model, kept for comparison with earlier figures: > 0 replaces
  // the co-location model by this fixed share of solo speed for both roles.
  // 0 (the default) = the co-location model.
  double fused_concurrency_share = 0;
  // --- collectives --------------------------------------------------------
  double model_params = 7e9;
  double bytes_per_param = 2;         // bf16 weights and gradients
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

// What a piece of work uses of the card while it runs alone at its solo
// speed, as fractions of the achieved bandwidth and compute (each in
// [0, 1]; the resource it is bound by is at 1).
struct Demand {
  double hbm = 0;
  double compute = 0;
};

// A stretch of one activity's work with one demand.
struct WorkSegment {
  double seconds = 0;  // solo seconds
  Demand demand;
};

// One activity (a card's rollout or training of one step): its segments in
// order. The rollout has a prefill segment and one decode segment per batch
// size (rows finish one by one, so its demand changes along the tail).
struct Work {
  std::vector<WorkSegment> segments;
  double Seconds() const;     // solo seconds, all segments
  void Scale(double factor);  // a slower (> 1) or faster card
};

// Speeds of the two roles sharing a card, as fractions of their solo
// speeds.
struct CoRates {
  double rollout = 1;
  double train = 1;
};

// The co-location model. Each role gets what the other leaves: on every
// resource the two demands, each scaled by its role's rate, add up to at
// most 1, and of the rates that allow, the pair with the largest combined
// speed (rollout + train) is taken, ties going to the more even pair. With
// a bandwidth-bound decode and a compute-bound trainer that is the point
// where both resources are used up: the decode runs on the bandwidth the
// trainer leaves, the trainer on the compute the decode leaves. Both rates
// are then multiplied by `interference`. Never above 1 (solo speed).
// REQUIRES: demands in [0, 1], interference in (0, 1].
CoRates CoLocatedRates(const Demand& rollout, const Demand& train,
                       double interference);

// The rates of the model `m` (fused_concurrency_share when > 0).
CoRates CoLocatedRates(const CostModel& m, const Demand& rollout,
                       const Demand& train);

// `node` is the cost_model mapping of `source` (a file name, for errors).
// Unknown keys, wrong types and out-of-range values are InvalidArgument
// "<source>: cost_model.<key>: <reason>"; so is a key of the other timing
// (decode_seconds_per_token under timing: roofline, the default, names what
// replaced it). Keys not given keep `defaults`.
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

// One decode step (timing: roofline) of `rows` rows each attending to
// `context` tokens: reads the weights and the rows' KV cache (at
// hbm_gbps x hbm_utilization), computes 2 x model_params FLOPs a row (at
// peak_tflops); the max of the two times. Its demand is each time over the
// step's.
WorkSegment DecodeStep(const CostModel& m, int rows, double context);

// One card's rollout of `lengths` (one prompt of prompt_length per
// response; prefill of each, then decode steps until the longest is done).
Work RolloutWork(const CostModel& m, const std::vector<int>& lengths);

// One card's training step on `lengths` (responses) with their prompts,
// then the per-step overhead (and, timing: linear, the optimizer base).
Work TrainWork(const CostModel& m, const std::vector<int>& lengths);

// Solo seconds of the two above.
double RolloutSeconds(const CostModel& m, const std::vector<int>& lengths);
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
