// `fusionrl plot INPUT [--out FILE]`: a self-contained HTML report (inline
// SVG and CSS, no script, no network) of a run directory (its
// metrics.jsonl, summary.json and config.yaml; a run still going is fine)
// or of a benchmark's JSON (`fusionrl bench`, bench-memory, bench-weights,
// bench-logits; told apart by content). This file reads the inputs and
// writes the page; plot_report.h renders it.
#ifndef FUSIONRL_CLI_PLOT_PLOT_CLI_H_
#define FUSIONRL_CLI_PLOT_PLOT_CLI_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/plot/plot_report.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fusionrl::cli {

struct PlotArgs {
  std::string input;  // a run directory (or its metrics.jsonl), or a JSON
  // "" = <run dir>/report.html, or the JSON's path without ".json" + ".html"
  std::string out;
};

CLI::App* AddPlotCommand(CLI::App& app, PlotArgs& args);

// Writes the report and prints its path. Returns the exit code: 2 for a
// missing input, a directory without metrics.jsonl, malformed JSON or a JSON
// that no benchmark wrote; 1 when --out cannot be written.
int RunPlot(const PlotArgs& args);

// metrics.jsonl's text as records. `path` names the file in errors
// ("PATH:LINE: why"). Blank lines are skipped; a last line without its
// newline that does not parse is a record still being written: skipped,
// with a note. InvalidArgument for a malformed line, a line that is not an
// object, or a record without a numeric "step".
absl::StatusOr<std::vector<MetricRow>> ParseMetricsJsonl(
    const std::string& text, const std::string& path,
    std::vector<std::string>* notes);

// The scalars of a config.yaml as written by `fusionrl run`: top-level
// "key: value" as "key", and "  key: value" under "section:" as
// "section.key" (deeper levels are skipped). Never fails: lines it does not
// understand are ignored.
std::map<std::string, std::string> ParseConfigScalars(const std::string& text);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_PLOT_PLOT_CLI_H_
