// Self-contained SVG charts for the `fusionrl plot` report: a line chart
// (numeric x, one polyline per series) and a grouped bar chart (categories,
// one bar per series, optional dots for the individual repeats), each with
// axes, "nice" ticks, axis labels, a title and a legend. The output is one
// `<svg>` element string with presentation attributes only (no CSS, no
// script, no external reference besides the SVG namespace), so it can be
// inlined in any HTML page or saved as a .svg file. Also the number
// formatting and XML escaping the report shares.
//
// Pure functions of their input; thread-safe.
#ifndef FUSIONRL_CLI_PLOT_SVG_CHART_H_
#define FUSIONRL_CLI_PLOT_SVG_CHART_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fusionrl::cli {

// `text` with &, <, >, " and ' escaped for XML/HTML text and attributes.
std::string EscapeXml(const std::string& text);

// A number for people: 3 significant digits, thousands as k/M/G ("2.34k"),
// integers below 10000 without an exponent ("2338"), an exponent from
// 10^12 ("1.2e+15"), "0" for zero, "-" for NaN or infinity.
std::string FormatNumber(double value);

// Bytes with a binary unit: "512 B", "1.5 KiB", "3.21 MiB", "1.02 GiB".
std::string FormatBytes(double bytes);

// A duration: "850 us", "12.3 ms", "4.56 s", "3m 07s", "2h 05m".
std::string FormatSeconds(double seconds);

// The chart palette: colour `i` (wraps around), colour-blind friendly.
std::string ChartColor(int i);

struct LineSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), x ascending
  bool dashed = false;
  // Markers are drawn on every point when the series has at most 60
  // points, or always when this is set (sparse series such as evals).
  bool markers = false;
  int color = -1;  // ChartColor index; -1 = the series' position
};

struct LineChartSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<LineSeries> series;
  // Axis range; unset = from the data (y also includes 0 when every value
  // is non-negative and y_from_zero is set).
  std::optional<double> y_min, y_max;
  bool y_from_zero = true;
  bool x_integer = true;   // x ticks on integers only (steps)
  bool y_integer = false;  // y ticks on integers only (counts)
  int width = 560;
  int height = 300;  // plot height grows with a legend of several rows
};

// REQUIRES: width >= 200, height >= 150. Series without points are listed
// in the legend but draw nothing; a chart without any point says "no data".
std::string LineChartSvg(const LineChartSpec& spec);

struct BarSeries {
  std::string name;
  std::vector<double> values;  // one per category (NaN = no bar)
  // Optional, per category: the individual measurements (drawn as dots
  // over the bar, e.g. each repeat of a benchmark).
  std::vector<std::vector<double>> dots;
};

struct BarChartSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<std::string> categories;
  std::vector<BarSeries> series;
  // The value above each bar (left out when some value is wider than its
  // bar).
  bool value_labels = true;
  int width = 560;
  int height = 300;
};

// REQUIRES: width >= 200, height >= 150. Long category labels are slanted.
std::string BarChartSvg(const BarChartSpec& spec);

// Evenly spaced round tick values (1, 2 or 5 times a power of ten) that
// cover [lo, hi], about `count` of them. Exposed for tests.
std::vector<double> NiceTicks(double lo, double hi, int count);

}  // namespace fusionrl::cli

#endif  // FUSIONRL_CLI_PLOT_SVG_CHART_H_
