// The two reports of `fusionrl plot`, rendered from data already read and
// parsed (no file access here, so tests build their inputs in code):
//   - a run report: one run directory's per-step records (metrics.jsonl),
//     its summary.json and a few config values, as charts vs step (reward,
//     accuracy with evals, tokens/s, loss, staleness, step-time split,
//     memory when recorded) under a header of summary tiles;
//   - a bench report: the JSON of `fusionrl bench` (modes side by side,
//     with per-step curves of the runs when their metrics are at hand),
//     `bench-memory`, `bench-weights` or `bench-logits`, as bar charts with
//     the repeats as dots, and a table of every figure.
// Both are one self-contained HTML page (plot_html.h, svg_chart.h).
// Pure functions; thread-safe.
#ifndef FUSIONRL_CLI_PLOT_PLOT_REPORT_H_
#define FUSIONRL_CLI_PLOT_PLOT_REPORT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace fusionrl::cli {

// One metrics.jsonl record: its numeric fields (booleans as 0/1). Every
// record has "step".
using MetricRow = std::map<std::string, double>;

struct RunReportInput {
  std::string name;    // the run's name (config `name`, else the folder)
  std::string source;  // the run directory, as the user gave it
  // The records in file order. A step recorded twice (a resumed run) keeps
  // its last record.
  std::vector<MetricRow> rows;
  // summary.json's object, or null while the run has none (still running,
  // or stopped without one).
  nlohmann::json summary;
  // config.yaml's scalars as "section.key" -> value ("name", "device",
  // "placement.mode", "stalesync.max_policy_lag", "run.total_steps", ...);
  // empty without a config.yaml.
  std::map<std::string, std::string> config;
  // What the reader noticed (e.g. an incomplete last line); listed as is.
  std::vector<std::string> notes;
};

std::string RenderRunReport(const RunReportInput& input);

enum class BenchKind { kBench, kBenchMemory, kBenchWeights, kBenchLogits };

// Which command wrote `result`, from its shape: "modes" (bench),
// "variants" (bench-memory), "sizes" or "benchmark": "bench-weights",
// "settings" (bench-logits). InvalidArgument for anything else.
absl::StatusOr<BenchKind> DetectBenchKind(const nlohmann::ordered_json& result);

struct BenchReportInput {
  std::string source;             // the JSON file, as the user gave it
  nlohmann::ordered_json result;  // its content, members in file order
  // `fusionrl bench` only: the records of the runs whose output_dir could
  // be read, by output_dir as written in the JSON (per-step curves).
  std::map<std::string, std::vector<MetricRow>> run_rows;
  std::vector<std::string> notes;  // what the reader noticed
};

// InvalidArgument when the JSON is not one of the benchmarks' results.
absl::StatusOr<std::string> RenderBenchReport(const BenchReportInput& input);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_PLOT_PLOT_REPORT_H_
