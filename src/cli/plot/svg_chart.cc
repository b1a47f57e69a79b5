#include "cli/plot/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace fusionrl::cli {
namespace {

constexpr char kFont[] =
    "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, "
    "sans-serif";
constexpr char kInk[] = "#1f2328";    // titles, values
constexpr char kMuted[] = "#57606a";  // ticks, axis labels
constexpr char kAxis[] = "#8c959f";
constexpr char kGrid[] = "#e6e8eb";
constexpr double kTickFont = 11;
constexpr double kLabelFont = 12;
constexpr double kTitleFont = 14;
constexpr double kLegendRow = 18;

// Rough width of `text` at `font_px` (no font metrics in a pure function):
// good enough to lay out legends and slant long labels.
double TextWidth(const std::string& text, double font_px) {
  return static_cast<double>(text.size()) * font_px * 0.58;
}

std::string Px(double v) { return absl::StrFormat("%.1f", v); }

// 1, 2 or 5 times a power of ten, the nearest to `x`.
double NiceNum(double x) {
  const double e = std::floor(std::log10(x));
  const double f = x / std::pow(10.0, e);
  const double nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  return nf * std::pow(10.0, e);
}

// A tick label: enough decimals to tell ticks `step` apart, k/M/G above
// ten thousand.
std::string FormatTick(double v, double step, double max_abs) {
  if (std::fabs(v) < step * 1e-9) return "0";
  if (max_abs >= 1e12) return absl::StrFormat("%.3g", v);
  double scale = 1;
  const char* suffix = "";
  if (max_abs >= 1e9) {
    scale = 1e9, suffix = "G";
  } else if (max_abs >= 1e6) {
    scale = 1e6, suffix = "M";
  } else if (max_abs >= 1e4) {
    scale = 1e3, suffix = "k";
  }
  const int decimals = std::max(
      0, static_cast<int>(-std::floor(std::log10(step / scale) + 1e-9)));
  if (decimals > 6) return absl::StrFormat("%.2g", v);
  return absl::StrCat(absl::StrFormat("%.*f", decimals, v / scale), suffix);
}

struct Legend {
  struct Item {
    std::string name, color;
    bool dashed = false;
    bool dot = false;  // a dot (repeat) instead of a line swatch
    bool box = false;  // a filled square (bar series)
    double x = 0;
    int row = 0;
  };
  std::vector<Item> items;
  int rows = 0;

  // Lays the items out left to right from `x0`, wrapping before `x1`.
  void Layout(double x0, double x1) {
    double x = x0;
    int row = 0;
    for (Item& it : items) {
      const double w = 22 + TextWidth(it.name, kLabelFont) + 16;
      if (x > x0 && x + w > x1) {
        ++row;
        x = x0;
      }
      it.x = x;
      it.row = row;
      x += w;
    }
    rows = items.empty() ? 0 : row + 1;
  }

  std::string Svg(double y0) const {
    std::string out;
    for (const Item& it : items) {
      const double y = y0 + it.row * kLegendRow;
      if (it.box) {
        absl::StrAppend(&out, "<rect x=\"", Px(it.x + 3), "\" y=\"", Px(y - 6),
                        "\" width=\"12\" height=\"12\" rx=\"2\" "
                        "fill=\"",
                        it.color, "\" fill-opacity=\"0.85\"/>");
      } else if (it.dot) {
        absl::StrAppend(&out, "<circle cx=\"", Px(it.x + 9), "\" cy=\"", Px(y),
                        "\" r=\"3.5\" fill=\"#ffffff\" stroke=\"", it.color,
                        "\" stroke-width=\"1.5\"/>");
      } else {
        absl::StrAppend(&out, "<line x1=\"", Px(it.x), "\" y1=\"", Px(y),
                        "\" x2=\"", Px(it.x + 18), "\" y2=\"", Px(y),
                        "\" stroke=\"", it.color, "\" stroke-width=\"3\"",
                        it.dashed ? " stroke-dasharray=\"5 3\"" : "", "/>");
      }
      absl::StrAppend(&out, "<text x=\"", Px(it.x + 22), "\" y=\"", Px(y + 4),
                      "\" font-size=\"", kLabelFont, "\" fill=\"", kInk, "\">",
                      EscapeXml(it.name), "</text>");
    }
    return out;
  }
};

std::string SvgOpen(int width, double height, const std::string& title) {
  return absl::StrCat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 ", width, " ",
      Px(height), "\" width=\"", width, "\" height=\"", Px(height),
      "\" font-family=\"", kFont, "\" role=\"img\" aria-label=\"",
      EscapeXml(title), "\"><title>", EscapeXml(title), "</title>",
      "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>",
      "<text x=\"12\" y=\"21\" font-size=\"", kTitleFont,
      "\" font-weight=\"600\" fill=\"", kInk, "\">", EscapeXml(title),
      "</text>");
}

// Horizontal grid lines and y tick labels over [top, top + ph]; returns the
// markup. `ticks` ascending, the axis spans ticks.front()..ticks.back().
std::string YAxis(const std::vector<double>& ticks, double left, double right,
                  double top, double ph, const std::string& y_label) {
  const double lo = ticks.front(), hi = ticks.back();
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1;
  const double max_abs = std::max(std::fabs(lo), std::fabs(hi));
  std::string out;
  for (const double t : ticks) {
    const double y = top + ph - (t - lo) / (hi - lo) * ph;
    absl::StrAppend(&out, "<line x1=\"", Px(left), "\" y1=\"", Px(y),
                    "\" x2=\"", Px(right), "\" y2=\"", Px(y), "\" stroke=\"",
                    t == lo ? kAxis : kGrid, "\" stroke-width=\"1\"/>",
                    "<text x=\"", Px(left - 6), "\" y=\"", Px(y + 4),
                    "\" font-size=\"", kTickFont, "\" fill=\"", kMuted,
                    "\" text-anchor=\"end\">",
                    EscapeXml(FormatTick(t, step, max_abs)), "</text>");
  }
  if (!y_label.empty()) {
    const double cy = top + ph / 2;
    absl::StrAppend(&out, "<text x=\"14\" y=\"", Px(cy), "\" font-size=\"",
                    kLabelFont, "\" fill=\"", kMuted,
                    "\" text-anchor=\"middle\" transform=\"rotate(-90 14 ",
                    Px(cy), ")\">", EscapeXml(y_label), "</text>");
  }
  return out;
}

// Width the y tick labels need.
double YTickWidth(const std::vector<double>& ticks) {
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1;
  const double max_abs =
      std::max(std::fabs(ticks.front()), std::fabs(ticks.back()));
  double w = 0;
  for (const double t : ticks) {
    w = std::max(w, TextWidth(FormatTick(t, step, max_abs), kTickFont));
  }
  return w;
}

// The y axis ticks covering [lo, hi] (widened when empty); on integers
// only when `integer`.
std::vector<double> YTicks(double lo, double hi, bool integer) {
  if (!(hi > lo)) {
    if (lo == 0) {
      hi = 1;
    } else {
      const double pad = std::fabs(lo) * 0.5;
      if (lo > 0 && lo - pad < 0) {
        lo = 0;
      } else {
        lo -= pad;
      }
      hi += pad;
    }
  }
  std::vector<double> ticks = NiceTicks(lo, hi, 5);
  if (integer && ticks[1] - ticks[0] < 1) {
    ticks.clear();
    for (double v = std::floor(lo); v < std::ceil(hi) + 0.5; v += 1) {
      ticks.push_back(v);
    }
    if (ticks.size() < 2) ticks.push_back(ticks.back() + 1);
  }
  return ticks;
}

bool Finite(double v) { return std::isfinite(v); }

}  // namespace

std::string EscapeXml(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string FormatNumber(double value) {
  if (!std::isfinite(value)) return "-";
  if (value == 0) return "0";
  const double a = std::fabs(value);
  if (a >= 1e12) return absl::StrFormat("%.3g", value);
  if (a >= 1e9) return absl::StrFormat("%.3gG", value / 1e9);
  if (a >= 1e6) return absl::StrFormat("%.3gM", value / 1e6);
  if (a >= 1e4) return absl::StrFormat("%.3gk", value / 1e3);
  if (a >= 1e3) return absl::StrFormat("%.0f", value);
  return absl::StrFormat("%.3g", value);
}

std::string FormatBytes(double bytes) {
  if (!std::isfinite(bytes)) return "-";
  const double a = std::fabs(bytes);
  if (a < 1024) return absl::StrFormat("%.0f B", bytes);
  if (a < 1024.0 * 1024) return absl::StrFormat("%.3g KiB", bytes / 1024);
  if (a < 1024.0 * 1024 * 1024) {
    return absl::StrFormat("%.3g MiB", bytes / (1024.0 * 1024));
  }
  return absl::StrFormat("%.3g GiB", bytes / (1024.0 * 1024 * 1024));
}

std::string FormatSeconds(double seconds) {
  if (!std::isfinite(seconds)) return "-";
  if (seconds == 0) return "0 s";
  if (seconds < 1e-3) return absl::StrFormat("%.3g us", seconds * 1e6);
  if (seconds < 1) return absl::StrFormat("%.3g ms", seconds * 1e3);
  if (seconds < 60) return absl::StrFormat("%.3g s", seconds);
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 3600) return absl::StrFormat("%dm %02ds", s / 60, s % 60);
  return absl::StrFormat("%dh %02dm", s / 3600, (s % 3600) / 60);
}

std::string ChartColor(int i) {
  // Okabe-Ito, reordered so the first colours contrast most on white.
  static const char* const kColors[] = {"#0072b2", "#e69f00", "#009e73",
                                        "#d55e00", "#cc79a7", "#56b4e9",
                                        "#7f7f7f", "#b8a800"};
  constexpr int n = sizeof(kColors) / sizeof(kColors[0]);
  return kColors[((i % n) + n) % n];
}

std::vector<double> NiceTicks(double lo, double hi, int count) {
  if (!Finite(lo) || !Finite(hi)) return {0, 1};
  if (!(hi > lo)) hi = lo + 1;
  count = std::max(count, 2);
  const double step = NiceNum((hi - lo) / (count - 1));
  const double start = std::floor(lo / step + 1e-9) * step;
  const double end = std::ceil(hi / step - 1e-9) * step;
  std::vector<double> ticks;
  for (int i = 0;; ++i) {
    double v = start + i * step;
    v = std::round(v / step) * step;
    if (std::fabs(v) < step * 1e-9) v = 0;
    ticks.push_back(v);
    if (v >= end - step * 1e-9 || i > 1000) break;
  }
  if (ticks.size() < 2) ticks.push_back(ticks.back() + step);
  return ticks;
}

std::string LineChartSvg(const LineChartSpec& spec) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0;
  double y0 = x0, y1 = -x0;
  int total = 0;
  for (const LineSeries& s : spec.series) {
    for (const auto& [x, y] : s.points) {
      if (!Finite(x) || !Finite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, y), y1 = std::max(y1, y);
      ++total;
    }
  }
  if (total == 0) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (spec.y_from_zero && y0 >= 0) y0 = 0;
  if (spec.y_min) y0 = std::min(y0, *spec.y_min);
  if (spec.y_max) y1 = std::max(y1, *spec.y_max);
  if (!(x1 > x0)) x0 -= 1, x1 += 1;
  const std::vector<double> yt = YTicks(y0, y1, spec.y_integer);
  const double ylo = yt.front(), yhi = yt.back();

  const double left = 30 + YTickWidth(yt) + (spec.y_label.empty() ? 0 : 8);
  const double right = spec.width - 18;
  const double top = 36;
  Legend legend;
  if (spec.series.size() > 1) {
    for (size_t i = 0; i < spec.series.size(); ++i) {
      const LineSeries& s = spec.series[i];
      legend.items.push_back(
          {s.name, ChartColor(s.color >= 0 ? s.color : static_cast<int>(i)),
           s.dashed, false});
    }
  }
  legend.Layout(left, right);
  const double axis_h = 22 + (spec.x_label.empty() ? 0 : 18);
  const double ph = spec.height - top - axis_h - 14;
  const double height =
      spec.height + (legend.rows > 0 ? legend.rows * kLegendRow + 4 : 0);
  const double pw = right - left;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + ph - (y - ylo) / (yhi - ylo) * ph; };

  std::string out = SvgOpen(spec.width, height, spec.title);
  absl::StrAppend(&out, YAxis(yt, left, right, top, ph, spec.y_label));
  // x ticks (integers only when x_integer), inside [x0, x1].
  std::vector<double> xt = NiceTicks(x0, x1, 7);
  if (spec.x_integer && xt.size() > 1 && xt[1] - xt[0] < 1) {
    xt.clear();
    for (double v = std::ceil(x0); v <= x1; v += 1) xt.push_back(v);
  }
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1;
  const double xmax_abs = std::max(std::fabs(x0), std::fabs(x1));
  for (const double t : xt) {
    if (t < x0 - 1e-9 || t > x1 + 1e-9) continue;
    const double x = px(t);
    absl::StrAppend(&out, "<line x1=\"", Px(x), "\" y1=\"", Px(top + ph),
                    "\" x2=\"", Px(x), "\" y2=\"", Px(top + ph + 4),
                    "\" stroke=\"", kAxis, "\"/><text x=\"", Px(x), "\" y=\"",
                    Px(top + ph + 17), "\" font-size=\"", kTickFont,
                    "\" fill=\"", kMuted, "\" text-anchor=\"middle\">",
                    EscapeXml(FormatTick(t, xstep, xmax_abs)), "</text>");
  }
  if (!spec.x_label.empty()) {
    absl::StrAppend(&out, "<text x=\"", Px(left + pw / 2), "\" y=\"",
                    Px(top + ph + 36), "\" font-size=\"", kLabelFont,
                    "\" fill=\"", kMuted, "\" text-anchor=\"middle\">",
                    EscapeXml(spec.x_label), "</text>");
  }
  if (total == 0) {
    absl::StrAppend(&out, "<text x=\"", Px(left + pw / 2), "\" y=\"",
                    Px(top + ph / 2), "\" font-size=\"", kLabelFont,
                    "\" fill=\"", kMuted,
                    "\" text-anchor=\"middle\">no data</text>");
  }
  for (size_t i = 0; i < spec.series.size(); ++i) {
    const LineSeries& s = spec.series[i];
    const std::string color =
        ChartColor(s.color >= 0 ? s.color : static_cast<int>(i));
    std::vector<std::string> pts;
    std::string marks;
    const bool markers = s.markers || s.points.size() <= 60;
    for (const auto& [x, y] : s.points) {
      if (!Finite(x) || !Finite(y)) continue;
      const std::string xy = absl::StrCat(Px(px(x)), ",", Px(py(y)));
      pts.push_back(xy);
      if (markers) {
        absl::StrAppend(&marks, "<circle cx=\"", Px(px(x)), "\" cy=\"",
                        Px(py(y)), "\" r=\"", s.markers ? "3.5" : "2.5",
                        "\" fill=\"", color, "\"><title>",
                        EscapeXml(absl::StrCat(s.name, " @ ", FormatNumber(x),
                                               ": ", FormatNumber(y))),
                        "</title></circle>");
      }
    }
    if (pts.empty()) continue;
    absl::StrAppend(&out, "<polyline data-series=\"", EscapeXml(s.name),
                    "\" fill=\"none\" stroke=\"", color,
                    "\" stroke-width=\"2\" stroke-linejoin=\"round\"",
                    s.dashed ? " stroke-dasharray=\"6 4\"" : "", " points=\"",
                    absl::StrJoin(pts, " "), "\"/>", marks);
  }
  absl::StrAppend(&out, legend.Svg(top + ph + axis_h + 12), "</svg>");
  return out;
}

namespace {

// Where a bar chart's parts go: the plot area, the bars' width, the
// category labels (slanted when they do not fit their group) and the
// legend below.
struct BarLayout {
  size_t n = 0;  // categories
  size_t m = 0;  // series
  std::vector<double> yt;
  double ylo = 0, yhi = 0;
  double left = 0, right = 0, pw = 0, group_w = 0;
  bool slant = false;
  double label_h = 0;
  Legend legend;
  double top = 36, axis_h = 0, ph = 0, height = 0;
  double bar_w = 0;
  bool labels = false;  // values above the bars

  double Py(double y) const { return top + ph - (y - ylo) / (yhi - ylo) * ph; }
};

// The y range: the values and the dots, with 0 in it.
void BarYTicks(const BarChartSpec& spec, BarLayout& l, bool& any_dots) {
  double y0 = 0, y1 = 0;
  for (const BarSeries& s : spec.series) {
    for (const double v : s.values) {
      if (Finite(v)) y0 = std::min(y0, v), y1 = std::max(y1, v);
    }
    for (const std::vector<double>& ds : s.dots) {
      for (const double v : ds) {
        if (!Finite(v)) continue;
        y0 = std::min(y0, v), y1 = std::max(y1, v);
        any_dots = true;
      }
    }
  }
  l.yt = YTicks(y0, y1 * (spec.value_labels ? 1.08 : 1), false);
  l.ylo = l.yt.front();
  l.yhi = l.yt.back();
}

BarLayout LayOutBars(const BarChartSpec& spec) {
  BarLayout l;
  l.n = spec.categories.size();
  l.m = spec.series.size();
  bool any_dots = false;
  BarYTicks(spec, l, any_dots);
  l.left = 30 + YTickWidth(l.yt) + (spec.y_label.empty() ? 0 : 8);
  l.right = spec.width - 18;
  l.pw = l.right - l.left;
  l.group_w = l.n > 0 ? l.pw / static_cast<double>(l.n) : l.pw;
  double label_w = 0;
  for (const std::string& c : spec.categories) {
    label_w = std::max(label_w, TextWidth(c, kTickFont));
  }
  l.slant = label_w > l.group_w - 6;
  // A label slanted by 30 degrees drops by half its width.
  l.label_h = l.slant ? label_w * 0.5 + 14 : 18;
  if (l.m > 1) {
    for (size_t i = 0; i < l.m; ++i) {
      l.legend.items.push_back(
          {spec.series[i].name, ChartColor(i), false, false, /*box=*/true});
    }
  }
  if (any_dots) {
    l.legend.items.push_back({"each run", kInk, false, /*dot=*/true});
  }
  l.legend.Layout(l.left, l.right);
  l.axis_h = 6 + l.label_h + (spec.x_label.empty() ? 0 : 18);
  l.ph = spec.height - l.top - 40 - 14;
  l.height = spec.height + (l.axis_h - 40) +
             (l.legend.rows > 0 ? l.legend.rows * kLegendRow + 4 : 0);
  const double inner = l.group_w * 0.78;
  l.bar_w = l.m > 0 ? std::min(64.0, inner / static_cast<double>(l.m)) : inner;
  // Values above the bars only when every one of them fits its bar.
  l.labels = spec.value_labels;
  for (const BarSeries& s : spec.series) {
    for (const double v : s.values) {
      if (Finite(v) && TextWidth(FormatNumber(v), kTickFont) > l.bar_w - 2) {
        l.labels = false;
      }
    }
  }
  return l;
}

// Series i's bar of category c (at x `bx`, centre `cx`), with its value
// above it (and above its dots) when the layout has labels.
std::string BarSvg(const BarChartSpec& spec, const BarLayout& l, size_t c,
                   size_t i, double bx, double cx) {
  const BarSeries& s = spec.series[i];
  if (c >= s.values.size() || !Finite(s.values[c])) return "";
  const double v = s.values[c];
  const double ya = l.Py(std::max(v, 0.0)), yb = l.Py(std::min(v, 0.0));
  std::string out = absl::StrCat(
      "<rect data-series=\"", EscapeXml(s.name), "\" x=\"", Px(bx + 1),
      "\" y=\"", Px(ya), "\" width=\"", Px(std::max(1.0, l.bar_w - 2)),
      "\" height=\"", Px(std::max(0.5, yb - ya)), "\" fill=\"", ChartColor(i),
      "\" fill-opacity=\"0.85\"><title>",
      EscapeXml(absl::StrCat(spec.categories[c], l.m > 1 ? " / " : "",
                             l.m > 1 ? s.name : "", ": ", FormatNumber(v))),
      "</title></rect>");
  const std::string label = FormatNumber(v);
  if (l.labels) {
    // Above the bar and above its dots.
    double top_y = ya;
    if (c < s.dots.size()) {
      for (const double d : s.dots[c]) {
        if (Finite(d)) top_y = std::min(top_y, l.Py(d) - 4);
      }
    }
    absl::StrAppend(&out, "<text x=\"", Px(cx), "\" y=\"", Px(top_y - 5),
                    "\" font-size=\"", kTickFont, "\" fill=\"", kInk,
                    "\" text-anchor=\"middle\">", EscapeXml(label), "</text>");
  }
  return out;
}

// Series i's repeats of category c: dots spread across half the bar.
std::string DotsSvg(const BarChartSpec& spec, const BarLayout& l, size_t c,
                    size_t i, double cx) {
  const BarSeries& s = spec.series[i];
  if (c >= s.dots.size()) return "";
  std::string out;
  const std::vector<double>& ds = s.dots[c];
  for (size_t k = 0; k < ds.size(); ++k) {
    if (!Finite(ds[k])) continue;
    const double spread = ds.size() > 1 ? l.bar_w * 0.5 : 0;
    const double dx = ds.size() > 1
                          ? -spread / 2 + spread * static_cast<double>(k) /
                                              static_cast<double>(ds.size() - 1)
                          : 0;
    absl::StrAppend(&out, "<circle class=\"repeat\" cx=\"", Px(cx + dx),
                    "\" cy=\"", Px(l.Py(ds[k])),
                    "\" r=\"3.5\" fill=\"#ffffff\" stroke=\"", kInk,
                    "\" stroke-width=\"1.5\"><title>",
                    EscapeXml(absl::StrCat(spec.categories[c], " run ", k + 1,
                                           ": ", FormatNumber(ds[k]))),
                    "</title></circle>");
  }
  return out;
}

// Category c's label under its group (centred at `gx`).
std::string CategoryLabelSvg(const BarChartSpec& spec, const BarLayout& l,
                             size_t c, double gx) {
  const double ly = l.top + l.ph + 16;
  if (l.slant) {
    return absl::StrCat(
        "<text x=\"", Px(gx), "\" y=\"", Px(ly), "\" font-size=\"", kTickFont,
        "\" fill=\"", kInk, "\" text-anchor=\"end\" transform=\"rotate(-30 ",
        Px(gx), " ", Px(ly), ")\">", EscapeXml(spec.categories[c]), "</text>");
  }
  return absl::StrCat("<text x=\"", Px(gx), "\" y=\"", Px(ly),
                      "\" font-size=\"", kTickFont, "\" fill=\"", kInk,
                      "\" text-anchor=\"middle\">",
                      EscapeXml(spec.categories[c]), "</text>");
}

}  // namespace

std::string BarChartSvg(const BarChartSpec& spec) {
  const BarLayout l = LayOutBars(spec);
  std::string out = SvgOpen(spec.width, l.height, spec.title);
  absl::StrAppend(&out,
                  YAxis(l.yt, l.left, l.right, l.top, l.ph, spec.y_label));
  for (size_t c = 0; c < l.n; ++c) {
    const double gx = l.left + l.group_w * (static_cast<double>(c) + 0.5);
    const double first = gx - l.bar_w * static_cast<double>(l.m) / 2;
    for (size_t i = 0; i < l.m; ++i) {
      const double bx = first + l.bar_w * static_cast<double>(i);
      const double cx = bx + l.bar_w / 2;
      absl::StrAppend(&out, BarSvg(spec, l, c, i, bx, cx),
                      DotsSvg(spec, l, c, i, cx));
    }
    absl::StrAppend(&out, CategoryLabelSvg(spec, l, c, gx));
  }
  if (!spec.x_label.empty()) {
    absl::StrAppend(&out, "<text x=\"", Px(l.left + l.pw / 2), "\" y=\"",
                    Px(l.top + l.ph + 6 + l.label_h + 14), "\" font-size=\"",
                    kLabelFont, "\" fill=\"", kMuted,
                    "\" text-anchor=\"middle\">", EscapeXml(spec.x_label),
                    "</text>");
  }
  if (l.n == 0) {
    absl::StrAppend(&out, "<text x=\"", Px(l.left + l.pw / 2), "\" y=\"",
                    Px(l.top + l.ph / 2), "\" font-size=\"", kLabelFont,
                    "\" fill=\"", kMuted,
                    "\" text-anchor=\"middle\">no data</text>");
  }
  absl::StrAppend(&out, l.legend.Svg(l.top + l.ph + l.axis_h + 12), "</svg>");
  return out;
}

}  // namespace fusionrl::cli
