// DetectBenchKind and RenderBenchReport (plot_report.h): a benchmark's JSON
// (`fusionrl bench`, `bench-memory`, `bench-weights`, `bench-logits`) as an
// HTML page. The JSON is read defensively: a missing or mistyped member is
// drawn as "-", never an exception.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/plot/plot_html.h"
#include "cli/plot/plot_report.h"
#include "cli/plot/svg_chart.h"

namespace fusionrl::cli {
namespace {

using json = nlohmann::ordered_json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kMiB = 1024.0 * 1024.0;

const json* Member(const json& j, const std::string& key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

double Num(const json& j, const std::string& key) {
  const json* m = Member(j, key);
  return m != nullptr && m->is_number() ? m->get<double>() : kNaN;
}

// A scalar member as text ("" when missing).
std::string Text(const json& j, const std::string& key) {
  const json* m = Member(j, key);
  if (m == nullptr || m->is_null()) return "";
  if (m->is_string()) return m->get<std::string>();
  if (m->is_boolean()) return m->get<bool>() ? "yes" : "no";
  if (m->is_number()) return FormatNumber(m->get<double>());
  return "";
}

// The members of object `j`, in file order.
std::vector<std::pair<std::string, const json*>> Entries(const json& j) {
  std::vector<std::pair<std::string, const json*>> out;
  if (!j.is_object()) return out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    out.push_back({it.key(), &it.value()});
  }
  return out;
}

std::vector<double> Numbers(const json& j, const std::string& key,
                            const std::string& inner = "") {
  std::vector<double> out;
  const json* m = Member(j, key);
  if (m == nullptr || !m->is_array()) return out;
  for (const json& e : *m) {
    if (inner.empty()) {
      out.push_back(e.is_number() ? e.get<double>() : kNaN);
    } else {
      out.push_back(Num(e, inner));
    }
  }
  return out;
}

Cell N(std::string text) { return {std::move(text), true}; }
Cell T(std::string text) { return {std::move(text), false}; }
std::string Ratio(double v) {
  return std::isfinite(v) ? absl::StrFormat("%.3gx", v) : "-";
}
std::string Frac(double v) {
  return std::isfinite(v) ? absl::StrFormat("%.3g", v) : "-";
}
std::string Basename(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

using ModeEntries = std::vector<std::pair<std::string, const json*>>;

// The header's lines: where the result came from and how it was run.
std::vector<std::string> BenchFacts(const json& r, const std::string& source,
                                    const std::string& config) {
  std::vector<std::string> facts = {absl::StrCat("result ", source)};
  facts.push_back(absl::StrCat(
      "config ", config.empty() ? "-" : config, " · ", Text(r, "steps"),
      " steps × ", Text(r, "repeats"), " repeat(s) per mode, interleaved"));
  const std::string init = Text(r, "init_checkpoint");
  if (!init.empty()) facts.push_back(absl::StrCat("init_checkpoint ", init));
  const std::string omp = Text(r, "omp_wait_policy");
  if (!omp.empty()) facts.push_back(absl::StrCat("OMP_WAIT_POLICY ", omp));
  return facts;
}

// The header's tiles: the mode count, the fastest mode, steps x repeats.
std::vector<Tile> BenchTiles(const json& r, const ModeEntries& modes) {
  std::vector<Tile> tiles;
  tiles.push_back({"modes", absl::StrCat(modes.size()), ""});
  double best = -1;
  std::string best_name;
  for (const auto& [name, m] : modes) {
    const double t = Num(*m, "median_tokens_per_second");
    if (std::isfinite(t) && t > best) best = t, best_name = name;
  }
  if (!best_name.empty()) {
    const json& m = *Member(*Member(r, "modes"), best_name);
    tiles.push_back({"fastest", best_name,
                     absl::StrCat(FormatNumber(best), " tokens/s, ",
                                  Ratio(Num(m, "ratio_to_colocated_sync")),
                                  " colocated-sync")});
  }
  tiles.push_back({"steps × repeats",
                   absl::StrCat(Text(r, "steps"), " × ", Text(r, "repeats")),
                   "per mode"});
  return tiles;
}

// "Modes side by side": four bar charts over the modes; appends one row a
// mode to `table` ("Every figure").
std::string ModesSideBySide(const ModeEntries& modes,
                            std::vector<std::vector<Cell>>& table) {
  BarChartSpec tps;
  tps.title = "Tokens / s by mode";
  tps.y_label = "tokens / s";
  BarSeries tps_s{"median", {}, {}};
  BarChartSpec busy;
  busy.title = "Busy fraction by mode (median)";
  busy.y_label = "fraction of step_seconds";
  BarSeries trainer{"trainer (train_seconds)", {}, {}};
  BarSeries rollout{"rollout (rollout_seconds)", {}, {}};
  BarChartSpec acc;
  acc.title = "Final eval accuracy by mode";
  acc.y_label = "accuracy";
  BarSeries acc_s{"median", {}, {}};
  BarChartSpec ratio;
  ratio.title = "Tokens / s vs colocated-sync";
  ratio.y_label = "ratio (median)";
  BarSeries ratio_s{"ratio", {}, {}};
  for (const auto& [name, m] : modes) {
    tps.categories.push_back(name);
    busy.categories.push_back(name);
    acc.categories.push_back(name);
    ratio.categories.push_back(name);
    tps_s.values.push_back(Num(*m, "median_tokens_per_second"));
    tps_s.dots.push_back(Numbers(*m, "runs", "tokens_per_second"));
    trainer.values.push_back(Num(*m, "median_trainer_busy_fraction"));
    trainer.dots.push_back(Numbers(*m, "runs", "trainer_busy_fraction"));
    rollout.values.push_back(Num(*m, "median_rollout_busy_fraction"));
    rollout.dots.push_back(Numbers(*m, "runs", "rollout_busy_fraction"));
    acc_s.values.push_back(Num(*m, "median_final_eval_accuracy"));
    acc_s.dots.push_back(Numbers(*m, "runs", "final_eval_accuracy"));
    ratio_s.values.push_back(Num(*m, "ratio_to_colocated_sync"));
    std::vector<std::string> each;
    for (const double t : tps_s.dots.back()) each.push_back(FormatNumber(t));
    table.push_back(
        {T(name), T(Text(*m, "placement")), N(Text(*m, "max_policy_lag")),
         N(FormatNumber(tps_s.values.back())), N(Ratio(ratio_s.values.back())),
         N(absl::StrJoin(each, ", ")), N(Frac(acc_s.values.back())),
         N(Frac(trainer.values.back())), N(Frac(rollout.values.back())),
         N(Text(*m, "max_staleness"))});
  }
  tps.series = {tps_s};
  busy.series = {trainer, rollout};
  acc.series = {acc_s};
  ratio.series = {ratio_s};
  return absl::StrCat(
      SectionHtml("Modes side by side"),
      GridHtml(
          {FigureHtml(BarChartSvg(tps),
                      "Bars: the median over the repeats of each run's "
                      "tokens/s (summary.json: rollout tokens over the "
                      "steps' wall time); dots: each repeat."),
           FigureHtml(BarChartSvg(ratio),
                      absl::StrCat(Code("ratio_to_colocated_sync"),
                                   ": median tokens/s over "
                                   "colocated-sync's (1 = as fast).")),
           FigureHtml(BarChartSvg(busy),
                      "Sum over the run of train_seconds (rollout_seconds) "
                      "over the sum of step_seconds: 1 means the card "
                      "was busy with that phase the whole step. Rollout "
                      "and training overlap in fused and disaggregated "
                      "modes, so the two can add up to more than 1."),
           FigureHtml(BarChartSvg(acc),
                      "Greedy accuracy on the held-out split after the "
                      "last step; dots: each repeat.")}));
}

// The metrics of one mode's first run, as read from its output_dir.
struct ModeRows {
  std::string name;
  int color;  // the mode's place in the JSON: the same colour everywhere
  const std::vector<MetricRow>* rows;
};

// The modes whose first run's metrics.jsonl was read.
std::vector<ModeRows> ModesWithRows(const BenchReportInput& in,
                                    const ModeEntries& modes) {
  std::vector<ModeRows> curves;
  int index = -1;
  for (const auto& [name, m] : modes) {
    ++index;
    const json* runs = Member(*m, "runs");
    if (runs == nullptr || !runs->is_array() || runs->empty()) continue;
    const std::string dir = Text((*runs)[0], "output_dir");
    auto it = in.run_rows.find(dir);
    if (it != in.run_rows.end()) curves.push_back({name, index, &it->second});
  }
  return curves;
}

// One per-step chart: a line a mode of `field` (`field` empty: the trainer's
// busy fraction, train_seconds / step_seconds).
std::string PerStepFigure(const std::vector<ModeRows>& curves,
                          const char* title, const char* y_label,
                          const char* field, bool integer) {
  LineChartSpec c;
  c.title = title;
  c.x_label = "step";
  c.y_label = y_label;
  c.y_integer = integer;
  for (const ModeRows& mode : curves) {
    LineSeries s{mode.name, {}};
    s.color = mode.color;
    for (const MetricRow& row : *mode.rows) {
      auto step = row.find("step");
      if (step == row.end()) continue;
      if (*field != '\0') {
        auto v = row.find(field);
        if (v != row.end()) s.points.push_back({step->second, v->second});
      } else {
        auto t = row.find("train_seconds");
        auto st = row.find("step_seconds");
        if (t != row.end() && st != row.end() && st->second > 0) {
          s.points.push_back({step->second, t->second / st->second});
        }
      }
    }
    c.series.push_back(std::move(s));
  }
  return FigureHtml(LineChartSvg(c), "");
}

// Per-step curves of each mode's first run, when their metrics were read;
// a note in `notes` for the modes without.
std::string PerStepSection(const BenchReportInput& in, const ModeEntries& modes,
                           std::vector<std::string>& notes) {
  const std::vector<ModeRows> curves = ModesWithRows(in, modes);
  if (curves.empty()) {
    notes.push_back(
        "No per-step curves: the runs' output_dir (in the JSON) holds no "
        "readable metrics.jsonl from here.");
    return "";
  }
  const std::vector<std::string> figures = {
      PerStepFigure(curves, "Tokens / s per step", "tokens / s",
                    "tokens_per_second", false),
      PerStepFigure(curves, "Reward per step", "reward_mean", "reward_mean",
                    false),
      PerStepFigure(curves, "Trainer busy per step",
                    "train_seconds / step_seconds", "", false),
      PerStepFigure(curves, "Max staleness per step", "policy versions",
                    "max_staleness", true)};
  if (curves.size() < modes.size()) {
    notes.push_back(absl::StrCat(
        "Per-step curves of ", modes.size() - curves.size(),
        " mode(s) are missing: their run's metrics.jsonl was not found."));
  }
  return absl::StrCat(SectionHtml("Per step (the first run of each mode, from "
                                  "its metrics.jsonl)"),
                      GridHtml(figures));
}

std::string RenderBench(const BenchReportInput& in) {
  const json& r = in.result;
  std::vector<std::string> notes = in.notes;
  const ModeEntries modes = Entries(*Member(r, "modes"));
  const std::string config = Text(r, "config");
  std::vector<std::vector<Cell>> table;
  std::string body =
      HeaderHtml(absl::StrCat("fusionrl bench · ", Basename(config)),
                 BenchFacts(r, in.source, config), BenchTiles(r, modes));
  absl::StrAppend(&body, ModesSideBySide(modes, table));
  absl::StrAppend(&body, PerStepSection(in, modes, notes));
  absl::StrAppend(&body, SectionHtml("Every figure"),
                  TableHtml({"mode", "placement", "max_policy_lag",
                             "median tokens/s", "vs colocated-sync",
                             "each run tokens/s", "median final eval acc",
                             "trainer busy", "rollout busy", "max staleness"},
                            table),
                  NotesHtml("Notes", notes));
  return HtmlPage("fusionrl bench report", body);
}

std::string RenderBenchMemory(const BenchReportInput& in) {
  const json& r = in.result;
  const auto variants = Entries(*Member(r, "variants"));
  std::vector<std::string> policies;
  for (const auto& [v, pol] : variants) {
    for (const auto& [p, x] : Entries(*pol)) {
      if (std::find(policies.begin(), policies.end(), p) == policies.end()) {
        policies.push_back(p);
      }
    }
  }
  const std::vector<std::string> facts = {
      absl::StrCat("result ", in.source),
      absl::StrCat("config ", Text(r, "config"), " · device ",
                   Text(r, "device"), " · batch ", Text(r, "batch_size"), " · ",
                   Text(r, "repeats"), " timed step(s) per policy"),
      absl::StrCat("held bytes count the host pool: ",
                   Text(r, "held_counts_host_pool"))};
  struct Chart {
    const char* title;
    const char* y_label;
    const char* field;
    double scale;
    const char* caption;
  };
  const Chart kCharts[] = {
      {"Activation bytes held for backward", "MiB", "held_bytes", 1 / kMiB,
       ": activation bytes kept from the forward for the backward (on a CPU "
       "the host pool counts: it is the same memory)."},
      {"Device peak", "MiB", "device_peak_bytes", 1 / kMiB,
       ": the most device bytes the training step held at once."},
      {"Median step time", "ms", "median_step_seconds", 1e3,
       ": forward + backward of one training step (median of the repeats)."},
      {"Step time vs none", "ratio", "step_time_ratio_to_none", 1,
       ": the price of the policy in time (1 = as fast as keeping every "
       "activation)."}};
  std::vector<std::string> figures;
  for (const Chart& ch : kCharts) {
    BarChartSpec c;
    c.title = ch.title;
    c.y_label = ch.y_label;
    c.categories = policies;
    for (const auto& [v, pol] : variants) {
      BarSeries s{v, {}, {}};
      for (const std::string& p : policies) {
        const json* e = Member(*pol, p);
        s.values.push_back(e == nullptr ? kNaN : Num(*e, ch.field) * ch.scale);
      }
      c.series.push_back(std::move(s));
    }
    figures.push_back(
        FigureHtml(BarChartSvg(c), absl::StrCat(Code(ch.field), ch.caption)));
  }
  std::vector<std::vector<Cell>> table;
  for (const auto& [v, pol] : variants) {
    for (const auto& [p, e] : Entries(*pol)) {
      const std::string error = Text(*e, "error");
      if (!error.empty()) {
        table.push_back({T(v), T(p), T(Text(*e, "activation_policy")),
                         T(absl::StrCat("error: ", error))});
        continue;
      }
      table.push_back(
          {T(v), T(p), T(Text(*e, "activation_policy")),
           N(FormatBytes(Num(*e, "held_bytes"))),
           N(FormatBytes(Num(*e, "device_held_bytes"))),
           N(FormatBytes(Num(*e, "device_peak_bytes"))),
           N(FormatBytes(Num(*e, "host_pool_bytes"))),
           N(FormatSeconds(Num(*e, "median_step_seconds"))),
           N(Ratio(Num(*e, "held_ratio_to_none"))),
           N(Ratio(Num(*e, "step_time_ratio_to_none"))),
           N(absl::StrFormat("%.3g", Num(*e, "max_abs_grad_diff_vs_none")))});
    }
  }
  std::string body = HeaderHtml(
      absl::StrCat("fusionrl bench-memory · ", Basename(Text(r, "config"))),
      facts,
      {{"variants", absl::StrCat(variants.size()), ""},
       {"policies", absl::StrCat(policies.size()), ""}});
  absl::StrAppend(
      &body, SectionHtml("Policies side by side"), GridHtml(figures),
      SectionHtml("Every figure"),
      TableHtml({"variant", "policy", "activation_policy", "held",
                 "device held", "device peak", "host pool", "median step",
                 "held vs none", "time vs none", "max |grad diff|"},
                table),
      NotesHtml("Notes", in.notes));
  return HtmlPage("fusionrl bench-memory report", body);
}

std::string RenderBenchWeights(const BenchReportInput& in) {
  const json& r = in.result;
  const json* sizes = Member(r, "sizes");
  std::vector<std::string> paths;
  std::vector<const json*> rows;
  if (sizes != nullptr && sizes->is_array()) {
    for (const json& row : *sizes) {
      rows.push_back(&row);
      for (const auto& [k, v] : Entries(row)) {
        if (v->is_object() &&
            std::find(paths.begin(), paths.end(), k) == paths.end()) {
          paths.push_back(k);
        }
      }
    }
  }
  BarChartSpec bps;
  bps.title = "Bytes / s by path";
  bps.y_label = "GB / s";
  bps.categories = paths;
  bps.width = 1120;
  bps.height = 330;
  BarChartSpec ratio = bps;
  ratio.title = "Bytes / s vs memcpy";
  ratio.y_label = "ratio (median)";
  std::vector<std::vector<Cell>> table;
  for (const json* row : rows) {
    const double mib = Num(*row, "mib");
    const std::string name = absl::StrCat(FormatNumber(mib), " MiB");
    BarSeries s{name, {}, {}}, q{name, {}, {}};
    for (const std::string& p : paths) {
      const json* e = Member(*row, p);
      if (e == nullptr) {
        s.values.push_back(kNaN), q.values.push_back(kNaN);
        s.dots.push_back({});
        continue;
      }
      s.values.push_back(Num(*e, "bytes_per_second") / 1e9);
      q.values.push_back(Num(*e, "ratio_to_memcpy"));
      std::vector<double> dots;
      std::vector<std::string> each;
      for (const double sec : Numbers(*e, "seconds")) {
        dots.push_back(sec > 0 ? mib * kMiB / sec / 1e9 : kNaN);
        each.push_back(FormatSeconds(sec));
      }
      s.dots.push_back(dots);
      table.push_back(
          {N(name), T(p), N(FormatSeconds(Num(*e, "median_seconds"))),
           N(absl::StrFormat("%.3g", s.values.back())),
           N(Ratio(q.values.back())), N(absl::StrJoin(each, ", "))});
    }
    bps.series.push_back(std::move(s));
    ratio.series.push_back(std::move(q));
  }
  const std::vector<std::string> facts = {
      absl::StrCat("result ", in.source),
      absl::StrCat(Text(r, "ranks"), " ranks · ", Text(r, "repeats"),
                   " repeat(s) · ", Text(r, "threads"), " threads · chunk ",
                   FormatBytes(Num(r, "chunk_bytes")), " · gradient bucket ",
                   FormatBytes(Num(r, "gradient_bucket_bytes")),
                   " · CRC-32C instruction: ", Text(r, "crc32c_instruction"))};
  std::string body = HeaderHtml("fusionrl bench-weights", facts,
                                {{"sizes", absl::StrCat(rows.size()), ""},
                                 {"paths", absl::StrCat(paths.size()), ""}});
  absl::StrAppend(
      &body, SectionHtml("Paths side by side"),
      GridHtml({FigureHtml(BarChartSvg(bps),
                           "Bars: payload bytes over the median seconds "
                           "(10<sup>9</sup> bytes/s); dots: each repeat.",
                           true),
                FigureHtml(BarChartSvg(ratio),
                           absl::StrCat(Code("ratio_to_memcpy"),
                                        ": a path's bytes/s over memcpy's, "
                                        "the ceiling."),
                           true)}),
      SectionHtml("Every figure"),
      TableHtml({"size", "path", "median", "GB/s", "vs memcpy", "each run"},
                table),
      NotesHtml("Notes", in.notes));
  return HtmlPage("fusionrl bench-weights report", body);
}

std::string RenderBenchLogits(const BenchReportInput& in) {
  const json& r = in.result;
  const auto settings = Entries(*Member(r, "settings"));
  BarChartSpec mem;
  mem.title = "LM head + loss memory by chunk size";
  mem.y_label = "MiB";
  mem.x_label = "chunk_tokens (0 = whole batch)";
  BarChartSpec time = mem;
  time.title = "Median time by chunk size";
  time.y_label = "ms";
  BarSeries peak{"peak_bytes", {}, {}}, held{"held_bytes", {}, {}};
  BarSeries fwd{"forward", {}, {}}, bwd{"backward", {}, {}},
      step{"step", {}, {}};
  std::vector<std::vector<Cell>> table;
  for (const auto& [k, e] : settings) {
    mem.categories.push_back(k);
    time.categories.push_back(k);
    peak.values.push_back(Num(*e, "peak_bytes") / kMiB);
    held.values.push_back(Num(*e, "held_bytes") / kMiB);
    fwd.values.push_back(Num(*e, "median_forward_seconds") * 1e3);
    bwd.values.push_back(Num(*e, "median_backward_seconds") * 1e3);
    step.values.push_back(Num(*e, "median_step_seconds") * 1e3);
    std::vector<double> each = Numbers(*e, "step_seconds");
    for (double& s : each) s *= 1e3;
    fwd.dots.push_back({});
    bwd.dots.push_back({});
    step.dots.push_back(each);
    table.push_back(
        {N(k), N(FormatBytes(Num(*e, "peak_bytes"))),
         N(FormatBytes(Num(*e, "held_bytes"))),
         N(FormatSeconds(Num(*e, "median_step_seconds"))),
         N(Ratio(Num(*e, "peak_ratio_to_chunk0"))),
         N(Ratio(Num(*e, "time_ratio_to_chunk0"))),
         N(absl::StrFormat("%.3g", Num(*e, "max_abs_logp_diff_vs_chunk0"))),
         N(absl::StrFormat("%.3g", Num(*e, "max_rel_grad_diff_vs_chunk0")))});
  }
  mem.series = {peak, held};
  time.series = {fwd, bwd, step};
  const json* batch = Member(r, "batch");
  const std::vector<std::string> facts = {
      absl::StrCat("result ", in.source),
      absl::StrCat("config ", Text(r, "config"), " · device ",
                   Text(r, "device"), " · ", Text(r, "num_threads"),
                   " threads · vocab ", Text(r, "vocab_size"), " · ",
                   Text(r, "num_parameters"), " parameters"),
      absl::StrCat("batch ",
                   batch ? Text(*batch, "sequences") : std::string("-"),
                   " sequences × ",
                   batch ? Text(*batch, "sequence_tokens") : std::string("-"),
                   " tokens · ", Text(r, "repeats"), " repeat(s)")};
  std::string body = HeaderHtml(
      absl::StrCat("fusionrl bench-logits · ", Basename(Text(r, "config"))),
      facts,
      {{"settings", absl::StrCat(settings.size()), ""},
       {"logits (response)", FormatBytes(Num(r, "logits_bytes_response")),
        "one full-precision copy"}});
  absl::StrAppend(
      &body, SectionHtml("Chunk sizes side by side"),
      GridHtml({FigureHtml(BarChartSvg(mem), ""),
                FigureHtml(BarChartSvg(time), "Dots: each repeat's step.")}),
      SectionHtml("Every figure"),
      TableHtml({"chunk_tokens", "peak", "held", "median step", "peak vs 0",
                 "time vs 0", "max |logp diff|", "max rel grad diff"},
                table),
      NotesHtml("Notes", in.notes));
  return HtmlPage("fusionrl bench-logits report", body);
}

}  // namespace

absl::StatusOr<BenchKind> DetectBenchKind(const json& result) {
  if (!result.is_object()) {
    return absl::InvalidArgumentError(
        "not a benchmark result: the JSON is not an object");
  }
  auto object = [&](const char* key) {
    const json* m = Member(result, key);
    return m != nullptr && m->is_object();
  };
  const json* sizes = Member(result, "sizes");
  if (object("modes")) return BenchKind::kBench;
  if (object("variants")) return BenchKind::kBenchMemory;
  if (Text(result, "benchmark") == "bench-weights" ||
      (sizes != nullptr && sizes->is_array())) {
    return BenchKind::kBenchWeights;
  }
  if (object("settings")) return BenchKind::kBenchLogits;
  return absl::InvalidArgumentError(
      "not a benchmark result: expected a \"modes\" (fusionrl bench), "
      "\"variants\" (bench-memory), \"sizes\" (bench-weights) or "
      "\"settings\" (bench-logits) member");
}

absl::StatusOr<std::string> RenderBenchReport(const BenchReportInput& input) {
  absl::StatusOr<BenchKind> kind = DetectBenchKind(input.result);
  if (!kind.ok()) return kind.status();
  switch (*kind) {
    case BenchKind::kBench:
      return RenderBench(input);
    case BenchKind::kBenchMemory:
      return RenderBenchMemory(input);
    case BenchKind::kBenchWeights:
      return RenderBenchWeights(input);
    case BenchKind::kBenchLogits:
      return RenderBenchLogits(input);
  }
  return absl::InternalError("unknown benchmark kind");
}

}  // namespace fusionrl::cli
