// The cost model's formulas (roofline and linear timings, the co-location
// model, the collectives) and its strict YAML reader.
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

// One key of the reader: parses `value` into its field or says why not.
using Setter =
    std::function<absl::Status(const YAML::Node& value, CostModel& m)>;

absl::StatusOr<double> Number(const YAML::Node& value) {
  if (!value.IsScalar()) return absl::InvalidArgumentError("must be a number");
  try {
    return value.as<double>();
  } catch (const YAML::Exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be a number, got '", value.Scalar(), "'"));
  }
}

absl::StatusOr<int64_t> Integer(const YAML::Node& value) {
  if (!value.IsScalar()) {
    return absl::InvalidArgumentError("must be an integer");
  }
  try {
    return value.as<int64_t>();
  } catch (const YAML::Exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be an integer, got '", value.Scalar(), "'"));
  }
}

Setter Double(double CostModel::*field) {
  return [field](const YAML::Node& v, CostModel& m) -> absl::Status {
    FUSIONRL_ASSIGN_OR_RETURN(m.*field, Number(v));
    return absl::OkStatus();
  };
}

Setter Int(int CostModel::*field) {
  return [field](const YAML::Node& v, CostModel& m) -> absl::Status {
    FUSIONRL_ASSIGN_OR_RETURN(int64_t x, Integer(v));
    if (x < INT32_MIN || x > INT32_MAX) {
      return absl::InvalidArgumentError("out of range");
    }
    m.*field = static_cast<int>(x);
    return absl::OkStatus();
  };
}

absl::Status ReadMap(const YAML::Node& node, const std::string& path,
                     const std::map<std::string, Setter>& keys, CostModel& m) {
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": must be a map"));
  }
  std::vector<std::string> known;
  for (const auto& [k, s] : keys) known.push_back(k);
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    auto it = keys.find(key);
    if (it == keys.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ".", key,
          ": unknown key (known keys: ", absl::StrJoin(known, ", "), ")"));
    }
    absl::Status s = it->second(kv.second, m);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ".", key, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

// The top-level keys of cost_model (response_length is a map of its own).
std::map<std::string, Setter> CostModelKeys() {
  return {
      {"timing",
       [](const YAML::Node& v, CostModel& c) -> absl::Status {
         const std::string t = v.IsScalar() ? v.Scalar() : "";
         if (t == "roofline") {
           c.timing = Timing::kRoofline;
         } else if (t == "linear") {
           c.timing = Timing::kLinear;
         } else {
           return absl::InvalidArgumentError(
               absl::StrCat("must be roofline or linear, got '", t, "'"));
         }
         return absl::OkStatus();
       }},
      {"peak_tflops", Double(&CostModel::peak_tflops)},
      {"hbm_gbps", Double(&CostModel::hbm_gbps)},
      {"mfu", Double(&CostModel::mfu)},
      {"hbm_utilization", Double(&CostModel::hbm_utilization)},
      {"kv_bytes_per_token", Double(&CostModel::kv_bytes_per_token)},
      {"train_flops_per_param_token",
       Double(&CostModel::train_flops_per_param_token)},
      {"train_hbm_fraction", Double(&CostModel::train_hbm_fraction)},
      {"interference", Double(&CostModel::interference)},
      {"decode_seconds_per_step_base",
       Double(&CostModel::decode_seconds_per_step_base)},
      {"decode_seconds_per_token",
       Double(&CostModel::decode_seconds_per_token)},
      {"prefill_seconds_per_token",
       Double(&CostModel::prefill_seconds_per_token)},
      {"prompt_length", Int(&CostModel::prompt_length)},
      {"train_seconds_per_token", Double(&CostModel::train_seconds_per_token)},
      {"train_seconds_per_step_base",
       Double(&CostModel::train_seconds_per_step_base)},
      {"step_overhead_seconds", Double(&CostModel::step_overhead_seconds)},
      {"fused_concurrency_share", Double(&CostModel::fused_concurrency_share)},
      {"model_params", Double(&CostModel::model_params)},
      {"bytes_per_param", Double(&CostModel::bytes_per_param)},
      {"intra_bandwidth_gbps", Double(&CostModel::intra_bandwidth_gbps)},
      {"inter_bandwidth_gbps", Double(&CostModel::inter_bandwidth_gbps)},
      {"intra_latency_us", Double(&CostModel::intra_latency_us)},
      {"inter_latency_us", Double(&CostModel::inter_latency_us)},
      {"straggler_super_nodes", Int(&CostModel::straggler_super_nodes)},
      {"straggler_slowdown", Double(&CostModel::straggler_slowdown)},
      {"jitter_sigma", Double(&CostModel::jitter_sigma)},
      {"shared_host_threads", Int(&CostModel::shared_host_threads)},
      {"calibration_threads", Int(&CostModel::calibration_threads)},
      {"seed",
       [](const YAML::Node& v, CostModel& c) -> absl::Status {
         FUSIONRL_ASSIGN_OR_RETURN(int64_t x, Integer(v));
         c.seed = static_cast<uint64_t>(x);
         return absl::OkStatus();
       }},
  };
}

// The keys of cost_model.response_length.
std::map<std::string, Setter> ResponseLengthKeys() {
  return {
      {"median",
       [](const YAML::Node& x, CostModel& c) -> absl::Status {
         FUSIONRL_ASSIGN_OR_RETURN(c.response_length.median, Number(x));
         return absl::OkStatus();
       }},
      {"sigma",
       [](const YAML::Node& x, CostModel& c) -> absl::Status {
         FUSIONRL_ASSIGN_OR_RETURN(c.response_length.sigma, Number(x));
         return absl::OkStatus();
       }},
      {"max",
       [](const YAML::Node& x, CostModel& c) -> absl::Status {
         FUSIONRL_ASSIGN_OR_RETURN(int64_t n, Integer(x));
         if (n < 1 || n > (1 << 24)) {
           return absl::InvalidArgumentError("must be in 1..16777216");
         }
         c.response_length.max = static_cast<int>(n);
         return absl::OkStatus();
       }},
  };
}

// A key of the other timing would be silently unused: names what the
// timing in force reads instead. `given`: the keys of the section, in order.
absl::Status CheckTimingKeys(const CostModel& m,
                             const std::vector<std::string>& given,
                             const std::string& source) {
  static const char* const kLinearKeys[] = {
      "decode_seconds_per_step_base", "decode_seconds_per_token",
      "prefill_seconds_per_token", "train_seconds_per_token",
      "train_seconds_per_step_base"};
  static const char* const kRooflineKeys[] = {
      "peak_tflops",       "hbm_gbps",           "mfu",
      "hbm_utilization",   "kv_bytes_per_token", "train_flops_per_param_token",
      "train_hbm_fraction"};
  for (const std::string& key : given) {
    if (m.timing == Timing::kRoofline &&
        std::find(std::begin(kLinearKeys), std::end(kLinearKeys), key) !=
            std::end(kLinearKeys)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": cost_model.", key,
          ": a key of timing: linear (measured seconds), but this cost "
          "model is timing: roofline (the default): decode and training "
          "times come from peak_tflops, hbm_gbps, mfu, hbm_utilization, "
          "kv_bytes_per_token and model_params (docs/simulate.md, "
          "\"Co-location\"); set timing: linear to keep measured seconds"));
    }
    if (m.timing == Timing::kLinear &&
        std::find(std::begin(kRooflineKeys), std::end(kRooflineKeys), key) !=
            std::end(kRooflineKeys)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": cost_model.", key,
          ": a key of timing: roofline, but this cost model is timing: "
          "linear (measured seconds, e.g. from --calibrate-from), which "
          "does not read it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CostModel> ParseCostModel(const YAML::Node& node,
                                         const std::string& source,
                                         const CostModel& defaults) {
  CostModel m = defaults;
  if (!node.IsDefined() || node.IsNull()) return m;
  std::map<std::string, Setter> keys = CostModelKeys();
  const std::map<std::string, Setter> length_keys = ResponseLengthKeys();
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": cost_model: must be a map"));
  }
  std::vector<std::string> known;
  for (const auto& [k, s] : keys) known.push_back(k);
  std::vector<std::string> given;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    given.push_back(key);
    if (key == "response_length") {
      absl::Status s =
          ReadMap(kv.second, "cost_model.response_length", length_keys, m);
      if (!s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": ", s.message()));
      }
      continue;
    }
    auto it = keys.find(key);
    if (it == keys.end()) {
      known.push_back("response_length");
      std::sort(known.begin(), known.end());
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": cost_model.", key,
          ": unknown key (known keys: ", absl::StrJoin(known, ", "), ")"));
    }
    absl::Status s = it->second(kv.second, m);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": cost_model.", key, ": ", s.message()));
    }
  }
  if (absl::Status s = CheckTimingKeys(m, given, source); !s.ok()) return s;
  absl::Status valid = ValidateCostModel(m);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", valid.message()));
  }
  return m;
}

absl::Status ValidateCostModel(const CostModel& m) {
  auto bad = [](const std::string& key, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost_model.", key, ": ", why));
  };
  const std::vector<std::pair<const char*, double>> non_negative = {
      {"decode_seconds_per_step_base", m.decode_seconds_per_step_base},
      {"decode_seconds_per_token", m.decode_seconds_per_token},
      {"prefill_seconds_per_token", m.prefill_seconds_per_token},
      {"train_seconds_per_token", m.train_seconds_per_token},
      {"train_seconds_per_step_base", m.train_seconds_per_step_base},
      {"step_overhead_seconds", m.step_overhead_seconds},
      {"model_params", m.model_params},
      {"bytes_per_param", m.bytes_per_param},
      {"intra_latency_us", m.intra_latency_us},
      {"inter_latency_us", m.inter_latency_us},
      {"jitter_sigma", m.jitter_sigma},
      {"response_length.sigma", m.response_length.sigma},
      {"kv_bytes_per_token", m.kv_bytes_per_token},
  };
  for (const auto& [key, v] : non_negative) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return bad(key, absl::StrCat("must be a finite number >= 0, got ", v));
    }
  }
  if (!(m.intra_bandwidth_gbps > 0)) {
    return bad("intra_bandwidth_gbps",
               absl::StrCat("must be > 0, got ", m.intra_bandwidth_gbps));
  }
  if (!(m.inter_bandwidth_gbps > 0)) {
    return bad("inter_bandwidth_gbps",
               absl::StrCat("must be > 0, got ", m.inter_bandwidth_gbps));
  }
  if (!(m.response_length.median >= 1)) {
    return bad("response_length.median",
               absl::StrCat("must be >= 1, got ", m.response_length.median));
  }
  if (m.prompt_length < 0) {
    return bad("prompt_length",
               absl::StrCat("must be >= 0, got ", m.prompt_length));
  }
  if (!(m.fused_concurrency_share >= 0 && m.fused_concurrency_share <= 1)) {
    return bad("fused_concurrency_share",
               absl::StrCat("must be in [0, 1] (0 = the co-location model), "
                            "got ",
                            m.fused_concurrency_share));
  }
  const std::vector<std::pair<const char*, double>> positive = {
      {"peak_tflops", m.peak_tflops},
      {"hbm_gbps", m.hbm_gbps},
      {"train_flops_per_param_token", m.train_flops_per_param_token},
  };
  for (const auto& [key, v] : positive) {
    if (!(v > 0) || !std::isfinite(v)) {
      return bad(key, absl::StrCat("must be a finite number > 0, got ", v));
    }
  }
  const std::vector<std::pair<const char*, double>> fractions = {
      {"mfu", m.mfu},
      {"hbm_utilization", m.hbm_utilization},
      {"interference", m.interference},
  };
  for (const auto& [key, v] : fractions) {
    if (!(v > 0 && v <= 1)) {
      return bad(key, absl::StrCat("must be in (0, 1], got ", v));
    }
  }
  if (!(m.train_hbm_fraction >= 0 && m.train_hbm_fraction <= 1)) {
    return bad("train_hbm_fraction",
               absl::StrCat("must be in [0, 1], got ", m.train_hbm_fraction));
  }
  if (m.straggler_super_nodes < 0) {
    return bad("straggler_super_nodes",
               absl::StrCat("must be >= 0, got ", m.straggler_super_nodes));
  }
  if (!(m.straggler_slowdown >= 1)) {
    return bad("straggler_slowdown",
               absl::StrCat("must be >= 1, got ", m.straggler_slowdown));
  }
  if (m.shared_host_threads < 0) {
    return bad("shared_host_threads",
               absl::StrCat("must be >= 0, got ", m.shared_host_threads));
  }
  if (m.calibration_threads < 1) {
    return bad("calibration_threads",
               absl::StrCat("must be >= 1, got ", m.calibration_threads));
  }
  return absl::OkStatus();
}

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
