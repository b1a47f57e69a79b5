// Fits the cost model's per-card decode and train costs to a real run's
// metrics (least squares or ratio, see calibration.h).
#include "sim/calibration.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/yaml_load.h"
#include "nlohmann/json.hpp"

namespace fusionrl::sim {
namespace {

struct Fit {
  double intercept = 0;
  double slope = 0;
  std::string method;
};

// y = a + b x: least squares when x varies enough and both come out >= 0;
// otherwise y = b x with b = sum(y) / sum(x).
Fit FitLine(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
  }
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
  }
  const double cv = mx > 0 ? std::sqrt(sxx / n) / mx : 0;
  if (cv >= 0.1 && sxx > 0) {
    Fit f;
    f.slope = sxy / sxx;
    f.intercept = my - f.slope * mx;
    f.method = "least squares";
    if (f.slope >= 0 && f.intercept >= 0) return f;
  }
  Fit f;
  f.slope = sx > 0 ? sy / sx : 0;
  f.method = "ratio";
  return f;
}

}  // namespace

absl::StatusOr<Calibration> CalibrateFromRun(const std::string& run_dir,
                                             const CostModel& base) {
  const std::string config_path = run_dir + "/config.yaml";
  std::ifstream file(config_path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("--calibrate-from: ", config_path,
                     ": cannot open the file (a "
                     "`fusionrl run` output directory holds config.yaml and "
                     "metrics.jsonl)"));
  }
  std::ostringstream text;
  text << file.rdbuf();
  YAML::Node cfg;
  try {
    cfg = LoadYaml(text.str());
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--calibrate-from: ", config_path, ": ", e.what()));
  }
  int threads = 0, super_nodes = 0, cards_per = 0, max_new = 0;
  try {
    threads = cfg["num_threads"].as<int>();
    super_nodes = cfg["placement"]["super_nodes"].as<int>();
    cards_per = cfg["placement"]["cards_per_super_node"].as<int>();
    max_new = cfg["rollout"]["max_new_tokens"].as<int>();
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--calibrate-from: ", config_path,
        ": needs num_threads, placement.super_nodes, "
        "placement.cards_per_super_node and rollout.max_new_tokens: ",
        e.what()));
  }
  if (threads < 1 || super_nodes < 1 || cards_per < 1 || max_new < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--calibrate-from: ", config_path,
                     ": num_threads, super_nodes, "
                     "cards_per_super_node and max_new_tokens must be >= 1"));
  }
  Calibration cal;
  cal.cards = super_nodes * cards_per;
  cal.threads_per_card = std::max(1, threads / super_nodes / cards_per);

  const std::string metrics_path = run_dir + "/metrics.jsonl";
  std::ifstream in(metrics_path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("--calibrate-from: ", metrics_path,
                                            ": cannot open the file"));
  }
  std::vector<double> tokens, rollout, train, overhead, step;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--calibrate-from: ", metrics_path, ":", line_no,
                       ": not a JSON object"));
    }
    if (!j.contains("step")) continue;  // e.g. a resume marker
    for (const char* key : {"rollout_tokens", "rollout_seconds",
                            "train_seconds", "step_seconds"}) {
      if (!j.contains(key) || !j[key].is_number()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--calibrate-from: ", metrics_path, ":", line_no, ": ",
                         key, ": missing or not a number"));
      }
    }
    if (j["step"].get<double>() <= 1) continue;  // warm-up
    const double per_card = j["rollout_tokens"].get<double>() / cal.cards;
    tokens.push_back(per_card);
    rollout.push_back(j["rollout_seconds"].get<double>());
    train.push_back(j["train_seconds"].get<double>());
    step.push_back(j["step_seconds"].get<double>());
    overhead.push_back(
        std::max(0.0, step.back() - rollout.back() - train.back()));
  }
  if (tokens.size() < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--calibrate-from: ", metrics_path, ": ", tokens.size(),
                     " step records after the first; need at least 3"));
  }
  const double n = static_cast<double>(tokens.size());
  auto mean = [n](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / n;
  };
  cal.steps_used = static_cast<int>(tokens.size());
  cal.tokens_per_card = mean(tokens);
  cal.mean_step_seconds = mean(step);
  cal.mean_rollout_seconds = mean(rollout);
  cal.mean_train_seconds = mean(train);

  // Responses per card and step, from the run's shape.
  const int prompts = cfg["rollout"]["prompts_per_step"].as<int>(0);
  const int group = cfg["rollout"]["group_size"].as<int>(0);
  const double rows = cal.cards > 0 && prompts > 0 && group > 0
                          ? static_cast<double>(prompts) / cal.cards * group
                          : 0;
  if (rows <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--calibrate-from: ", config_path,
                     ": rollout.prompts_per_step and group_size must be > 0"));
  }
  const double len_mean = cal.tokens_per_card / rows;
  CostModel& m = cal.cost;
  m = base;
  // Measured seconds of this host, whose roles share its cores.
  m.timing = Timing::kLinear;
  m.response_length.median = std::max(1.0, len_mean);
  m.response_length.sigma = 0;
  m.response_length.max = max_new;
  m.prompt_length = 0;
  m.prefill_seconds_per_token = 0;
  const Fit r = FitLine(tokens, rollout);
  // With sigma 0 the batch decodes ceil(mean) steps (stochastic rounding).
  const double decode_steps = std::ceil(m.response_length.median);
  m.decode_seconds_per_token = r.slope;
  m.decode_seconds_per_step_base = r.intercept / decode_steps;
  const Fit t = FitLine(tokens, train);
  m.train_seconds_per_token = t.slope;
  m.train_seconds_per_step_base = t.intercept;
  m.step_overhead_seconds = mean(overhead);
  m.calibration_threads = cal.threads_per_card;
  cal.rollout_fit = r.method;
  cal.train_fit = t.method;
  return cal;
}

}  // namespace fusionrl::sim
