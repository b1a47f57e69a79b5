// RenderRunReport (plot_report.h): one run directory as an HTML page.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/plot/plot_html.h"
#include "cli/plot/plot_report.h"
#include "cli/plot/svg_chart.h"

namespace fusionrl::cli {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
using Points = std::vector<std::pair<double, double>>;

std::optional<double> Field(const MetricRow& row, const std::string& key) {
  auto it = row.find(key);
  if (it == row.end() || !std::isfinite(it->second)) return std::nullopt;
  return it->second;
}

Points Series(const std::vector<MetricRow>& rows, const std::string& key) {
  Points points;
  for (const MetricRow& r : rows) {
    if (std::optional<double> v = Field(r, key)) {
      points.push_back({r.at("step"), *v});
    }
  }
  return points;
}

// A number of summary.json, or NaN.
double SummaryNumber(const nlohmann::json& summary, const char* key) {
  if (!summary.is_object()) return kNaN;
  auto it = summary.find(key);
  if (it == summary.end() || !it->is_number()) return kNaN;
  return it->get<double>();
}

std::string ConfigValue(const std::map<std::string, std::string>& config,
                        const std::string& key) {
  auto it = config.find(key);
  return it == config.end() ? "" : it->second;
}

// The record of each step, by step (the last one when a step repeats).
std::vector<MetricRow> ByStep(const std::vector<MetricRow>& rows,
                              int* superseded) {
  std::map<double, MetricRow> by_step;
  *superseded = 0;
  for (const MetricRow& r : rows) {
    auto it = r.find("step");
    if (it == r.end()) continue;
    if (!by_step.emplace(it->second, r).second) {
      by_step[it->second] = r;
      ++*superseded;
    }
  }
  std::vector<MetricRow> out;
  for (auto& [step, r] : by_step) out.push_back(std::move(r));
  return out;
}

// The "<phase>_seconds" fields that split a step (not the step itself, nor
// evals, which run after it), in reading order.
std::vector<std::string> PhaseFields(const std::vector<MetricRow>& rows) {
  static const char* const kOrder[] = {
      "train_seconds",        "rollout_seconds",
      "rollout_wait_seconds", "rollout_gate_wait_seconds",
      "weight_sync_seconds",  "cross_node_seconds"};
  std::set<std::string> keys;
  for (const MetricRow& r : rows) {
    for (const auto& [k, v] : r) {
      if (absl::EndsWith(k, "_seconds") && k != "step_seconds" &&
          k != "eval_seconds" && k != "simulated_seconds") {
        keys.insert(k);
      }
    }
  }
  std::vector<std::string> out;
  for (const char* k : kOrder) {
    if (keys.erase(k) > 0) out.push_back(k);
  }
  out.insert(out.end(), keys.begin(), keys.end());
  return out;
}

// Memory figures of a record: "...memory..._bytes|_mib" or "mem_...".
bool IsMemoryField(const std::string& k) {
  return (absl::StrContains(k, "memory") || absl::StartsWith(k, "mem_")) &&
         (absl::EndsWith(k, "_bytes") || absl::EndsWith(k, "_mib"));
}

std::string Fraction(double v) { return absl::StrFormat("%.3g", v); }

std::string Percent(double v) { return absl::StrFormat("%.3g%%", v * 100); }

std::vector<Tile> Tiles(const RunReportInput& in,
                        const std::vector<MetricRow>& rows) {
  const nlohmann::json& s = in.summary;
  std::vector<Tile> tiles;
  // Steps.
  const double last_step = rows.empty() ? 0 : rows.back().at("step");
  Tile steps{"steps", FormatNumber(last_step), ""};
  const std::string total = ConfigValue(in.config, "run.total_steps");
  if (!total.empty()) steps.detail = absl::StrCat("of ", total, " planned");
  const double resumed = SummaryNumber(s, "resumed_from_step");
  if (resumed > 0) {
    absl::StrAppend(&steps.detail, steps.detail.empty() ? "" : ", ",
                    "resumed from step ", FormatNumber(resumed));
  }
  tiles.push_back(steps);
  // Eval accuracy: summary.json's initial -> final, else the records'.
  const double initial = SummaryNumber(s, "initial_eval_accuracy");
  const double final_acc = SummaryNumber(s, "final_eval_accuracy");
  const Points evals = Series(rows, "eval_accuracy");
  if (std::isfinite(final_acc)) {
    tiles.push_back({"eval accuracy",
                     initial >= 0 ? absl::StrCat(Fraction(initial), " → ",
                                                 Fraction(final_acc))
                                  : Fraction(final_acc),
                     initial >= 0 ? "initial → final" : "final"});
  } else if (!evals.empty()) {
    tiles.push_back(
        {"eval accuracy",
         evals.size() > 1 ? absl::StrCat(Fraction(evals.front().second), " → ",
                                         Fraction(evals.back().second))
                          : Fraction(evals.back().second),
         absl::StrCat(
             "evals at steps ", FormatNumber(evals.front().first),
             evals.size() > 1 ? "…" : "",
             evals.size() > 1 ? FormatNumber(evals.back().first) : "")});
  } else {
    tiles.push_back({"eval accuracy", "-", "no eval yet"});
  }
  // Throughput and time.
  const double tps = SummaryNumber(s, "tokens_per_second");
  double step_sum = 0, train_sum = 0;
  std::vector<double> tps_steps;
  for (const MetricRow& r : rows) {
    step_sum += Field(r, "step_seconds").value_or(0);
    train_sum += Field(r, "train_seconds").value_or(0);
    if (auto v = Field(r, "tokens_per_second")) tps_steps.push_back(*v);
  }
  if (std::isfinite(tps)) {
    tiles.push_back({"tokens / s", FormatNumber(tps), "run (summary.json)"});
  } else if (!tps_steps.empty()) {
    std::sort(tps_steps.begin(), tps_steps.end());
    tiles.push_back({"tokens / s",
                     FormatNumber(tps_steps[tps_steps.size() / 2]),
                     "median of the steps"});
  }
  const double wall = SummaryNumber(s, "wall_seconds");
  if (std::isfinite(wall)) {
    tiles.push_back({"wall time", FormatSeconds(wall), "summary.json"});
  } else if (step_sum > 0) {
    tiles.push_back(
        {"wall time", FormatSeconds(step_sum), "sum of step_seconds"});
  }
  if (step_sum > 0 && train_sum > 0) {
    tiles.push_back({"trainer busy", Percent(train_sum / step_sum),
                     "train_seconds / step_seconds"});
  }
  // An SFT run has no reward (its summary says 0).
  const bool sft = s.is_object() && s.contains("kind") &&
                   s["kind"].is_string() && s["kind"] == "sft";
  const double reward = sft ? kNaN : SummaryNumber(s, "final_train_reward");
  if (std::isfinite(reward)) {
    tiles.push_back({"final reward", Fraction(reward), "last step's mean"});
  } else if (!rows.empty() && Field(rows.back(), "reward_mean")) {
    tiles.push_back({"reward", Fraction(*Field(rows.back(), "reward_mean")),
                     "last step's mean"});
  }
  return tiles;
}

std::vector<std::string> Facts(const RunReportInput& in) {
  std::vector<std::string> facts;
  facts.push_back(absl::StrCat("run directory ", in.source));
  std::vector<std::string> cfg;
  auto add = [&](const char* label, const std::string& key) {
    const std::string v = ConfigValue(in.config, key);
    if (!v.empty() && v != "\"\"") cfg.push_back(absl::StrCat(label, v));
  };
  add("device ", "device");
  add("placement ", "placement.mode");
  const std::string nodes = ConfigValue(in.config, "placement.super_nodes");
  const std::string cards =
      ConfigValue(in.config, "placement.cards_per_super_node");
  if (!nodes.empty() && !cards.empty()) {
    cfg.push_back(absl::StrCat(nodes, " super node(s) × ", cards, " card(s)"));
  }
  add("max_policy_lag ", "stalesync.max_policy_lag");
  add("model ", "model.hf_path");
  if (!cfg.empty()) {
    facts.push_back(absl::StrCat("config: ", absl::StrJoin(cfg, " · ")));
  }
  if (in.summary.is_object()) {
    const auto it = in.summary.find("interrupted");
    const bool interrupted =
        it != in.summary.end() && it->is_boolean() && it->get<bool>();
    const auto kind = in.summary.find("kind");
    facts.push_back(
        absl::StrCat(interrupted ? "stopped early (summary.json: interrupted)"
                                 : "finished (summary.json written)",
                     kind != in.summary.end() && kind->is_string()
                         ? absl::StrCat(" · kind ", kind->get<std::string>())
                         : ""));
  } else {
    facts.push_back(
        "no summary.json yet: the run is still going, or stopped before "
        "writing one");
  }
  return facts;
}

// What the run report's charts share: the run, its records by step, and
// the fields that have no chart (listed in the notes).
struct RunCharts {
  const RunReportInput& in;
  const std::vector<MetricRow>& rows;
  std::vector<std::string> absent;

  bool Has(const std::string& key) const {
    return std::any_of(rows.begin(), rows.end(), [&](const MetricRow& r) {
      return Field(r, key).has_value();
    });
  }
  void Missing(const std::string& what) { absent.push_back(what); }
};

// A section of figures, or "" when it has none.
std::string Section(const std::string& title,
                    const std::vector<std::string>& figures) {
  if (figures.empty()) return "";
  return absl::StrCat(SectionHtml(title), GridHtml(figures));
}

void RewardFigure(RunCharts& rc, std::vector<std::string>& figures) {
  if (!rc.Has("reward_mean")) {
    rc.Missing("reward_mean (an SFT run has none)");
    return;
  }
  LineChartSpec c;
  c.title = "Reward";
  c.x_label = "step";
  c.y_label = "reward_mean";
  c.series.push_back({"reward_mean", Series(rc.rows, "reward_mean")});
  figures.push_back(FigureHtml(
      LineChartSvg(c),
      absl::StrCat(Code("reward_mean"),
                   ": mean reward of the samples trained at the step.")));
}

void AccuracyFigure(RunCharts& rc, std::vector<std::string>& figures) {
  Points evals = Series(rc.rows, "eval_accuracy");
  const double initial = SummaryNumber(rc.in.summary, "initial_eval_accuracy");
  if (initial >= 0 && std::isfinite(initial)) {
    evals.insert(evals.begin(), {0.0, initial});
  }
  if (!rc.Has("train_accuracy") && evals.empty()) {
    rc.Missing("train_accuracy or eval_accuracy");
    return;
  }
  LineChartSpec c;
  c.title = "Accuracy";
  c.x_label = "step";
  c.y_label = "accuracy";
  c.y_max = 1;
  if (rc.Has("train_accuracy")) {
    c.series.push_back({"train_accuracy", Series(rc.rows, "train_accuracy")});
  }
  if (!evals.empty()) {
    LineSeries eval{"eval_accuracy", evals};
    eval.markers = true;
    c.series.push_back(eval);
  }
  figures.push_back(FigureHtml(
      LineChartSvg(c),
      absl::StrCat(
          Code("train_accuracy"),
          ": share of the step's rollout samples graded correct. ",
          Code("eval_accuracy"),
          ": greedy accuracy on the held-out split (every run.eval_every "
          "steps and after the last step",
          evals.empty() ? "; none yet" : "", ")",
          initial >= 0 && std::isfinite(initial)
              ? absl::StrCat("; step 0 is summary.json's ",
                             Code("initial_eval_accuracy"))
              : "",
          ".")));
}

void ThroughputFigure(RunCharts& rc, std::vector<std::string>& figures) {
  if (!rc.Has("tokens_per_second")) {
    rc.Missing("tokens_per_second");
    return;
  }
  LineChartSpec c;
  c.title = "Throughput";
  c.x_label = "step";
  c.y_label = "tokens / s";
  c.series.push_back(
      {"tokens_per_second", Series(rc.rows, "tokens_per_second")});
  figures.push_back(FigureHtml(
      LineChartSvg(c),
      absl::StrCat(Code("tokens_per_second"),
                   ": response tokens sampled so far over the run's rollout "
                   "+ training "
                   "seconds (cumulative, as the controller reports it).")));
}

void LossFigure(RunCharts& rc, std::vector<std::string>& figures) {
  if (!rc.Has("loss")) {
    rc.Missing("loss");
    return;
  }
  LineChartSpec c;
  c.title = "Loss";
  c.x_label = "step";
  c.y_label = "loss";
  c.y_from_zero = false;
  c.series.push_back({"loss", Series(rc.rows, "loss")});
  figures.push_back(FigureHtml(
      LineChartSvg(c),
      absl::StrCat(Code("loss"), ": the trainer's loss at the step.")));
}

std::string LearningSection(RunCharts& rc) {
  std::vector<std::string> figures;
  RewardFigure(rc, figures);
  AccuracyFigure(rc, figures);
  ThroughputFigure(rc, figures);
  LossFigure(rc, figures);
  return Section("Learning", figures);
}

// The staleness_<k> sample counts, summed over the records.
std::map<int, double> StalenessHistogram(const std::vector<MetricRow>& rows) {
  std::map<int, double> hist;
  for (const MetricRow& r : rows) {
    for (const auto& [k, v] : r) {
      int lag = 0;
      if (absl::StartsWith(k, "staleness_") &&
          absl::SimpleAtoi(k.substr(10), &lag) && lag >= 0 && lag < 10000 &&
          std::isfinite(v)) {
        hist[lag] += v;
      }
    }
  }
  return hist;
}

void StalenessHistogramFigure(RunCharts& rc,
                              std::vector<std::string>& figures) {
  std::map<int, double> hist = StalenessHistogram(rc.rows);
  if (hist.empty()) {
    rc.Missing("staleness_k sample counts");
    return;
  }
  const std::string lag_cfg =
      ConfigValue(rc.in.config, "stalesync.max_policy_lag");
  BarChartSpec c;
  c.title = "Samples by staleness (whole run)";
  c.x_label = "staleness (policy versions behind)";
  c.y_label = "samples";
  BarSeries counts{"samples", {}, {}};
  double total = 0;
  for (int k = 0; k <= hist.rbegin()->first; ++k) {
    c.categories.push_back(absl::StrCat(k));
    counts.values.push_back(hist.count(k) ? hist[k] : 0.0);
    total += counts.values.back();
  }
  c.series.push_back(counts);
  double over = 0;
  for (const MetricRow& r : rc.rows) {
    over += Field(r, "over_stale_samples").value_or(0);
  }
  figures.push_back(FigureHtml(
      BarChartSvg(c),
      absl::StrCat(
          "Samples trained, summed over the steps (", Code("staleness_k"),
          " fields; ", FormatNumber(total),
          " in all), by how many policy versions older than the trained "
          "policy the sampling policy was: 0 is on-policy. StaleSync "
          "bounds it by ",
          Code("stalesync.max_policy_lag"),
          lag_cfg.empty() ? "" : absl::StrCat(" (", lag_cfg, " here)"), "; ",
          Code("over_stale_samples"), " over the run: ", FormatNumber(over),
          ".")));
}

void MaxStalenessFigure(RunCharts& rc, std::vector<std::string>& figures) {
  if (!rc.Has("max_staleness")) {
    rc.Missing("max_staleness");
    return;
  }
  LineChartSpec c;
  c.title = "Max staleness per step";
  c.x_label = "step";
  c.y_label = "policy versions";
  c.y_integer = true;
  c.series.push_back({"max_staleness", Series(rc.rows, "max_staleness")});
  figures.push_back(
      FigureHtml(LineChartSvg(c),
                 absl::StrCat(Code("max_staleness"),
                              ": the stalest sample trained at the step.")));
}

std::string StalenessSection(RunCharts& rc) {
  std::vector<std::string> figures;
  StalenessHistogramFigure(rc, figures);
  MaxStalenessFigure(rc, figures);
  return Section("Staleness", figures);
}

// The busy chart: each phase's seconds over the step's. Phases that are
// zero at every step are named in `zero` instead of drawn.
LineChartSpec BusyChart(const std::vector<MetricRow>& rows,
                        const std::vector<std::string>& phases,
                        std::vector<std::string>& zero) {
  LineChartSpec c;
  c.title = "Card busy: share of each step's time";
  c.x_label = "step";
  c.y_label = "fraction of step_seconds";
  c.y_max = 1;
  c.width = 1120;
  c.height = 320;
  for (const std::string& f : phases) {
    LineSeries s{f, {}};
    bool nonzero = false;
    for (const MetricRow& r : rows) {
      const std::optional<double> step = Field(r, "step_seconds");
      const std::optional<double> v = Field(r, f);
      if (!step || !v || *step <= 0) continue;
      s.points.push_back({r.at("step"), *v / *step});
      nonzero = nonzero || *v != 0;
    }
    if (nonzero) {
      c.series.push_back(std::move(s));
    } else {
      zero.push_back(f);
    }
  }
  return c;
}

// "Where the time went".
std::string TimeSection(RunCharts& rc) {
  const std::vector<std::string> phases = PhaseFields(rc.rows);
  if (!rc.Has("step_seconds") || phases.empty()) {
    rc.Missing("step_seconds and its phases (*_seconds), for the busy chart");
    return "";
  }
  std::vector<std::string> zero;
  const LineChartSpec c = BusyChart(rc.rows, phases, zero);
  return Section(
      "Where the time went",
      {FigureHtml(
          LineChartSvg(c),
          absl::StrCat(
              "Each line is a phase's seconds divided by the same step's ",
              Code("step_seconds"),
              " (the lead card's wall time of the step, from taking its "
              "batch "
              "to the end of the weight sync; evals come after it). ",
              Code("train_seconds"),
              " / step is the trainer's busy fraction (1: it never waited; "
              "what ",
              Code("fusionrl bench"), " reports as trainer_busy_fraction). ",
              Code("rollout_wait_seconds"),
              ": the trainer idle, waiting for the batch (rollout behind); ",
              Code("rollout_gate_wait_seconds"),
              ": the rollout thread waiting for the policy version StaleSync "
              "admits (trainer behind). In colocated-sync the phases run one "
              "after another on the card and add up to at most 1; in fused "
              "and disaggregated modes the rollout runs beside training, so "
              "the lines can add up to more than 1.",
              zero.empty() ? ""
                           : absl::StrCat(" Zero at every step, not drawn: ",
                                          absl::StrJoin(zero, ", "), ".")),
          /*wide=*/true)});
}

// "Memory": every memory field in MiB; a note instead when there is none.
std::string MemorySection(const std::vector<MetricRow>& rows,
                          std::vector<std::string>& notes) {
  std::set<std::string> memory_fields;
  for (const MetricRow& r : rows) {
    for (const auto& [k, v] : r) {
      if (IsMemoryField(k)) memory_fields.insert(k);
    }
  }
  if (memory_fields.empty()) {
    notes.push_back(
        "Memory: no memory fields in this run's records (no key that names "
        "memory and ends in _bytes or _mib), so no memory chart.");
    return "";
  }
  LineChartSpec c;
  c.title = "Memory by category";
  c.x_label = "step";
  c.y_label = "MiB";
  c.width = 1120;
  for (const std::string& f : memory_fields) {
    Points p = Series(rows, f);
    if (absl::EndsWith(f, "_bytes")) {
      for (auto& xy : p) xy.second /= 1024.0 * 1024.0;
    }
    c.series.push_back({f, std::move(p)});
  }
  return absl::StrCat(
      SectionHtml("Memory"),
      GridHtml({FigureHtml(
          LineChartSvg(c),
          "The memory fields of the records, in MiB (bytes fields divided by "
          "2<sup>20</sup>).",
          /*wide=*/true)}));
}

}  // namespace

std::string RenderRunReport(const RunReportInput& in) {
  std::vector<std::string> notes = in.notes;
  int superseded = 0;
  const std::vector<MetricRow> rows = ByStep(in.rows, &superseded);
  if (superseded > 0) {
    notes.push_back(absl::StrCat(
        superseded,
        " record(s) repeat an earlier step (a resumed run?); the last record "
        "of each step is drawn."));
  }
  std::string body = HeaderHtml(in.name, Facts(in), Tiles(in, rows));
  if (rows.empty()) {
    notes.push_back("metrics.jsonl has no records yet: nothing to draw.");
    absl::StrAppend(&body, NotesHtml("Notes", notes));
    return HtmlPage(absl::StrCat(in.name, " · fusionrl run report"), body);
  }
  RunCharts rc{in, rows, {}};
  absl::StrAppend(&body, LearningSection(rc));
  absl::StrAppend(&body, StalenessSection(rc));
  absl::StrAppend(&body, TimeSection(rc));
  absl::StrAppend(&body, MemorySection(rows, notes));
  if (!rc.absent.empty()) {
    notes.insert(notes.begin(),
                 absl::StrCat("Not in this run's records, so not drawn: ",
                              absl::StrJoin(rc.absent, "; "), "."));
  }
  absl::StrAppend(&body, NotesHtml("Notes", notes));
  return HtmlPage(absl::StrCat(in.name, " · fusionrl run report"), body);
}

}  // namespace fusionrl::cli
