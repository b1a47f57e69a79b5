// The cost model's formulas and its strict YAML reader.
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

}  // namespace

absl::StatusOr<CostModel> ParseCostModel(const YAML::Node& node,
                                         const std::string& source,
                                         const CostModel& defaults) {
  CostModel m = defaults;
  if (!node.IsDefined() || node.IsNull()) return m;
  std::map<std::string, Setter> keys = {
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
  const std::map<std::string, Setter> length_keys = {
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
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": cost_model: must be a map"));
  }
  std::vector<std::string> known;
  for (const auto& [k, s] : keys) known.push_back(k);
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
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
  if (!(m.fused_concurrency_share > 0 && m.fused_concurrency_share <= 1)) {
    return bad(
        "fused_concurrency_share",
        absl::StrCat("must be in (0, 1], got ", m.fused_concurrency_share));
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

double RolloutSeconds(const CostModel& m, const std::vector<int>& lengths) {
  if (lengths.empty()) return 0;
  // rows still decoding at decode step t = #{lengths > t}.
  std::vector<int> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  const int longest = sorted.back();
  double total_row_steps = 0;
  for (int len : sorted) total_row_steps += len;
  return m.prefill_seconds_per_token * m.prompt_length *
             static_cast<double>(lengths.size()) +
         m.decode_seconds_per_step_base * longest +
         m.decode_seconds_per_token * total_row_steps;
}

double TrainSeconds(const CostModel& m, const std::vector<int>& lengths) {
  double tokens = 0;
  for (int len : lengths) tokens += len + m.prompt_length;
  return m.train_seconds_per_step_base + m.train_seconds_per_token * tokens +
         m.step_overhead_seconds;
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
