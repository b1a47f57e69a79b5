// The cost model's strict YAML reader (the cost_model section of a
// simulation config) and its range checks.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "sim/cost_model.h"

namespace fusionrl::sim {
namespace {

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

}  // namespace fusionrl::sim
