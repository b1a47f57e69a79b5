// The cost model's formulas (roofline and linear timings, the co-location
// model, the collectives); its YAML reader is cost_model_reader.cc.
#include "sim/cost_model.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace fusionrl::sim {
namespace {

// SplitMix64: mixes ids into a well-spread generator seed.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t SeedOf(uint64_t seed, int super_node, int card, int64_t step,
                int what) {
  uint64_t h = Mix(seed);
  h = Mix(h ^ static_cast<uint64_t>(super_node));
  h = Mix(h ^ static_cast<uint64_t>(card));
  h = Mix(h ^ static_cast<uint64_t>(step));
  return Mix(h ^ static_cast<uint64_t>(what));
}

}  // namespace

std::vector<int> SampleResponseLengths(const CostModel& m, int super_node,
                                       int card, int64_t step, int count) {
  std::mt19937_64 rng(SeedOf(m.seed, super_node, card, step, 0));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const ResponseLengthModel& r = m.response_length;
  std::vector<int> out(count);
  for (int i = 0; i < count; ++i) {
    const double z = normal(rng);
    const double len = r.median * std::exp(r.sigma * z);
    // Stochastic rounding keeps the mean of a fractional median.
    const double rounded = std::floor(len + unit(rng));
    out[i] =
        static_cast<int>(std::clamp(rounded, 1.0, static_cast<double>(r.max)));
  }
  return out;
}

double JitterFactor(const CostModel& m, int super_node, int card, int64_t step,
                    int what) {
  if (m.jitter_sigma == 0) return 1.0;
  std::mt19937_64 rng(SeedOf(m.seed, super_node, card, step, 1 + what));
  std::normal_distribution<double> normal(0.0, 1.0);
  const double s = m.jitter_sigma;
  return std::exp(s * normal(rng) - 0.5 * s * s);  // mean 1
}

const char* TimingName(Timing t) {
  return t == Timing::kRoofline ? "roofline" : "linear";
}

double Work::Seconds() const {
  double total = 0;
  for (const WorkSegment& s : segments) total += s.seconds;
  return total;
}

void Work::Scale(double factor) {
  for (WorkSegment& s : segments) s.seconds *= factor;
}

CoRates CoLocatedRates(const Demand& rollout, const Demand& train,
                       double interference) {
  // The largest rate of `other` that leaves room for `mine` at rate x.
  auto room = [](double x, const Demand& mine, const Demand& other) {
    double y = 1;
    if (other.hbm > 0) y = std::min(y, (1 - x * mine.hbm) / other.hbm);
    if (other.compute > 0) {
      y = std::min(y, (1 - x * mine.compute) / other.compute);
    }
    return std::max(0.0, y);
  };
  // The feasible rates form a convex polygon; the best pair is one of its
  // corners: one role at full speed, both resources used up, or (when both
  // roles are bound by the same resource) an even split of it.
  std::vector<CoRates> corners;
  corners.push_back({1, room(1, rollout, train)});
  corners.push_back({room(1, train, rollout), 1});
  double even = 1;
  for (double sum :
       {rollout.hbm + train.hbm, rollout.compute + train.compute}) {
    if (sum > 0) even = std::min(even, 1 / sum);
  }
  corners.push_back({even, even});
  const double det = rollout.hbm * train.compute - train.hbm * rollout.compute;
  if (std::abs(det) > 1e-12) {
    const double x = (train.compute - train.hbm) / det;
    const double y = (rollout.hbm - rollout.compute) / det;
    if (x >= 0 && x <= 1 && y >= 0 && y <= 1) corners.push_back({x, y});
  }
  CoRates best = corners.front();
  for (const CoRates& c : corners) {
    const double sum = c.rollout + c.train;
    const double best_sum = best.rollout + best.train;
    if (sum > best_sum + 1e-12 ||
        (sum > best_sum - 1e-12 &&
         std::min(c.rollout, c.train) > std::min(best.rollout, best.train))) {
      best = c;
    }
  }
  best.rollout *= interference;
  best.train *= interference;
  return best;
}

CoRates CoLocatedRates(const CostModel& m, const Demand& rollout,
                       const Demand& train) {
  if (m.fused_concurrency_share > 0) {
    return {m.fused_concurrency_share, m.fused_concurrency_share};
  }
  return CoLocatedRates(rollout, train, m.interference);
}

namespace {

double AchievedFlops(const CostModel& m) {
  return m.peak_tflops * 1e12 * m.mfu;
}
double AchievedBytesPerSecond(const CostModel& m) {
  return m.hbm_gbps * 1e9 * m.hbm_utilization;
}
double WeightBytes(const CostModel& m) {
  return m.model_params * m.bytes_per_param;
}

// A segment of `memory` and `compute` seconds summed over its steps, which
// took `seconds` (each step the max of its two).
WorkSegment Segment(double seconds, double memory, double compute) {
  WorkSegment s;
  s.seconds = seconds;
  if (seconds > 0) s.demand = {memory / seconds, compute / seconds};
  return s;
}

// The linear timing's single resource: the host's cores.
constexpr Demand kCores = {0, 1};

}  // namespace

WorkSegment DecodeStep(const CostModel& m, int rows, double context) {
  const double memory =
      (WeightBytes(m) + rows * context * m.kv_bytes_per_token) /
      AchievedBytesPerSecond(m);
  // The roofline's bound: decode's GEMMs are as wide as the batch, far
  // from training's, so the trainer's MFU is not theirs.
  const double compute = 2 * m.model_params * rows / (m.peak_tflops * 1e12);
  return Segment(std::max(memory, compute), memory, compute);
}

Work RolloutWork(const CostModel& m, const std::vector<int>& lengths) {
  Work w;
  if (lengths.empty()) return w;
  std::vector<int> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  const double rows = static_cast<double>(sorted.size());
  if (m.timing == Timing::kLinear) {
    // rows still decoding at decode step t = #{lengths > t}.
    double total_row_steps = 0;
    for (int len : sorted) total_row_steps += len;
    w.segments.push_back({m.prefill_seconds_per_token * m.prompt_length * rows +
                              m.decode_seconds_per_step_base * sorted.back() +
                              m.decode_seconds_per_token * total_row_steps,
                          kCores});
    return w;
  }
  // Prefill: every prompt token's FLOPs, the weights read once and the
  // prompts' KV cache written.
  const double prompt_tokens = rows * m.prompt_length;
  if (prompt_tokens > 0) {
    const double compute =
        2 * m.model_params * prompt_tokens / AchievedFlops(m);
    const double memory =
        (WeightBytes(m) + prompt_tokens * m.kv_bytes_per_token) /
        AchievedBytesPerSecond(m);
    w.segments.push_back(Segment(std::max(compute, memory), memory, compute));
  }
  // Decode step t (0-based) has the rows longer than t, each attending to
  // its prompt and t generated tokens. One segment per batch size.
  size_t done = 0;  // rows finished before step t
  int t = 0;
  while (done < sorted.size()) {
    const int rows_now = static_cast<int>(sorted.size() - done);
    const int until = sorted[done];  // the batch shrinks after this step
    double seconds = 0, memory = 0, compute = 0;
    for (; t < until; ++t) {
      const WorkSegment step = DecodeStep(m, rows_now, m.prompt_length + t);
      seconds += step.seconds;
      memory += step.seconds * step.demand.hbm;
      compute += step.seconds * step.demand.compute;
    }
    if (seconds > 0) w.segments.push_back(Segment(seconds, memory, compute));
    while (done < sorted.size() && sorted[done] <= t) ++done;
  }
  return w;
}

Work TrainWork(const CostModel& m, const std::vector<int>& lengths) {
  double tokens = 0;
  for (int len : lengths) tokens += len + m.prompt_length;
  Work w;
  if (m.timing == Timing::kLinear) {
    w.segments.push_back(
        {m.train_seconds_per_step_base + m.train_seconds_per_token * tokens,
         kCores});
  } else {
    w.segments.push_back({m.train_flops_per_param_token * m.model_params *
                              tokens / AchievedFlops(m),
                          {m.train_hbm_fraction, 1}});
  }
  // Bookkeeping on the host: neither resource of the card.
  if (m.step_overhead_seconds > 0) {
    w.segments.push_back({m.step_overhead_seconds, {0, 0}});
  }
  return w;
}

double RolloutSeconds(const CostModel& m, const std::vector<int>& lengths) {
  return RolloutWork(m, lengths).Seconds();
}

double TrainSeconds(const CostModel& m, const std::vector<int>& lengths) {
  return TrainWork(m, lengths).Seconds();
}

double GradientBytes(const CostModel& m) {
  return m.model_params * m.bytes_per_param;
}

double IntraCollectiveSeconds(const CostModel& m, int cards) {
  if (cards <= 1) return 0;
  const double n = cards;
  return 2 * (n - 1) / n * GradientBytes(m) / (m.intra_bandwidth_gbps * 1e9) +
         2 * (n - 1) * m.intra_latency_us * 1e-6;
}

double InterCollectiveSeconds(const CostModel& m, int super_nodes, int cards) {
  if (super_nodes <= 1) return 0;
  const double n = super_nodes;
  const double shard = GradientBytes(m) / std::max(1, cards);
  return 2 * (n - 1) / n * shard / (m.inter_bandwidth_gbps * 1e9) +
         2 * (n - 1) * m.inter_latency_us * 1e-6;
}

double ComputeScale(const CostModel& m, int index, int super_nodes) {
  double scale = 1;
  if (super_nodes > m.straggler_super_nodes &&
      index >= super_nodes - m.straggler_super_nodes) {
    scale *= m.straggler_slowdown;
  }
  if (m.shared_host_threads > 0) {
    const int threads = std::max(1, m.shared_host_threads / super_nodes);
    scale *= static_cast<double>(m.calibration_threads) / threads;
  }
  return scale;
}

}  // namespace fusionrl::sim
