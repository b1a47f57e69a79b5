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

// The run's config.yaml: the keys calibration needs (the rest stay in `cfg`).
struct RunShape {
  YAML::Node cfg;
  int threads = 0;
  int super_nodes = 0;
  int cards_per_super_node = 0;
  int max_new_tokens = 0;
};

absl::StatusOr<RunShape> ReadRunConfig(const std::string& config_path) {
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
  RunShape shape;
  try {
    shape.cfg = LoadYaml(text.str());
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--calibrate-from: ", config_path, ": ", e.what()));
  }
  YAML::Node& cfg = shape.cfg;
  try {
    shape.threads = cfg["num_threads"].as<int>();
    shape.super_nodes = cfg["placement"]["super_nodes"].as<int>();
    shape.cards_per_super_node =
        cfg["placement"]["cards_per_super_node"].as<int>();
    shape.max_new_tokens = cfg["rollout"]["max_new_tokens"].as<int>();
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--calibrate-from: ", config_path,
        ": needs num_threads, placement.super_nodes, "
        "placement.cards_per_super_node and rollout.max_new_tokens: ",
        e.what()));
  }
  if (shape.threads < 1 || shape.super_nodes < 1 ||
      shape.cards_per_super_node < 1 || shape.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--calibrate-from: ", config_path,
                     ": num_threads, super_nodes, "
                     "cards_per_super_node and max_new_tokens must be >= 1"));
  }
  return shape;
}

// metrics.jsonl's step records after the warm-up step, one entry a step.
struct StepSeries {
  std::vector<double> tokens;  // rollout tokens per card
  std::vector<double> rollout, train, overhead, step;  // seconds
};

absl::StatusOr<StepSeries> ReadStepRecords(const std::string& metrics_path,
                                           int cards) {
  std::ifstream in(metrics_path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("--calibrate-from: ", metrics_path,
                                            ": cannot open the file"));
  }
  StepSeries s;
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
    s.tokens.push_back(j["rollout_tokens"].get<double>() / cards);
    s.rollout.push_back(j["rollout_seconds"].get<double>());
    s.train.push_back(j["train_seconds"].get<double>());
    s.step.push_back(j["step_seconds"].get<double>());
    s.overhead.push_back(
        std::max(0.0, s.step.back() - s.rollout.back() - s.train.back()));
  }
  if (s.tokens.size() < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--calibrate-from: ", metrics_path, ": ", s.tokens.size(),
                     " step records after the first; need at least 3"));
  }
  return s;
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// The linear cost model of this host (its roles share its cores): a
// response length fixed at the run's mean, decode and train seconds fitted
// to the tokens per card.
void FitLinearCosts(const StepSeries& s, double len_mean, int max_new_tokens,
                    Calibration& cal) {
  CostModel& m = cal.cost;
  m.timing = Timing::kLinear;
  m.response_length.median = std::max(1.0, len_mean);
  m.response_length.sigma = 0;
  m.response_length.max = max_new_tokens;
  m.prompt_length = 0;
  m.prefill_seconds_per_token = 0;
  const Fit r = FitLine(s.tokens, s.rollout);
  // With sigma 0 the batch decodes ceil(mean) steps (stochastic rounding).
  const double decode_steps = std::ceil(m.response_length.median);
  m.decode_seconds_per_token = r.slope;
  m.decode_seconds_per_step_base = r.intercept / decode_steps;
  const Fit t = FitLine(s.tokens, s.train);
  m.train_seconds_per_token = t.slope;
  m.train_seconds_per_step_base = t.intercept;
  m.step_overhead_seconds = Mean(s.overhead);
  m.calibration_threads = cal.threads_per_card;
  cal.rollout_fit = r.method;
  cal.train_fit = t.method;
}

}  // namespace

absl::StatusOr<Calibration> CalibrateFromRun(const std::string& run_dir,
                                             const CostModel& base) {
  const std::string config_path = run_dir + "/config.yaml";
  absl::StatusOr<RunShape> shape = ReadRunConfig(config_path);
  if (!shape.ok()) return shape.status();
  Calibration cal;
  cal.cards = shape->super_nodes * shape->cards_per_super_node;
  cal.threads_per_card = std::max(
      1, shape->threads / shape->super_nodes / shape->cards_per_super_node);

  absl::StatusOr<StepSeries> steps =
      ReadStepRecords(run_dir + "/metrics.jsonl", cal.cards);
  if (!steps.ok()) return steps.status();
  cal.steps_used = static_cast<int>(steps->tokens.size());
  cal.tokens_per_card = Mean(steps->tokens);
  cal.mean_step_seconds = Mean(steps->step);
  cal.mean_rollout_seconds = Mean(steps->rollout);
  cal.mean_train_seconds = Mean(steps->train);

  // Responses per card and step, from the run's shape.
  YAML::Node& cfg = shape->cfg;
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
  cal.cost = base;
  FitLinearCosts(*steps, cal.tokens_per_card / rows, shape->max_new_tokens,
                 cal);
  return cal;
}

}  // namespace fusionrl::sim
