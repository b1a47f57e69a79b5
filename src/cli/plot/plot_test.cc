// `fusionrl plot` without files: the SVG charts, number formats, the
// metrics.jsonl and config.yaml readers, and both reports rendered from
// inputs built in code.
#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "cli/plot/plot_cli.h"
#include "cli/plot/plot_report.h"
#include "cli/plot/svg_chart.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fusionrl::cli {
namespace {

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + what.size())) {
    ++n;
  }
  return n;
}

// The number of points of the polyline of series `name`, or -1.
int PolylinePoints(const std::string& svg, const std::string& name) {
  const std::regex re("<polyline data-series=\"" + name +
                      "\"[^>]*points=\"([^\"]*)\"");
  std::smatch m;
  if (!std::regex_search(svg, m, re)) return -1;
  const std::string pts = m[1];
  return static_cast<int>(std::count(pts.begin(), pts.end(), ' ')) + 1;
}

TEST(NiceTicksTest, CoversTheRangeWithRoundSteps) {
  const std::vector<double> t = NiceTicks(0, 0.975, 5);
  ASSERT_GE(t.size(), 2u);
  EXPECT_LE(t.front(), 0);
  EXPECT_GE(t.back(), 0.975);
  EXPECT_DOUBLE_EQ(t[1] - t[0], 0.2);
  const std::vector<double> big = NiceTicks(1730, 2358, 5);
  EXPECT_LE(big.front(), 1730);
  EXPECT_GE(big.back(), 2358);
  EXPECT_DOUBLE_EQ(big[1] - big[0], 200);
}

TEST(NiceTicksTest, SurvivesAnEmptyOrBrokenRange) {
  EXPECT_GE(NiceTicks(3, 3, 5).size(), 2u);
  EXPECT_GE(NiceTicks(std::nan(""), 1, 5).size(), 2u);
}

TEST(FormatTest, NumbersForPeople) {
  EXPECT_EQ(FormatNumber(0), "0");
  EXPECT_EQ(FormatNumber(0.97500001), "0.975");
  EXPECT_EQ(FormatNumber(2338.28), "2338");
  EXPECT_EQ(FormatNumber(23382.8), "23.4k");
  EXPECT_EQ(FormatNumber(4.2e9), "4.2G");
  EXPECT_EQ(FormatNumber(std::numeric_limits<double>::infinity()), "-");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(5 << 20), "5 MiB");
  EXPECT_EQ(FormatSeconds(0.0123), "12.3 ms");
  EXPECT_EQ(FormatSeconds(187), "3m 07s");
  EXPECT_EQ(EscapeXml("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
}

TEST(LineChartTest, OnePolylinePerSeriesWithEveryPoint) {
  LineChartSpec c;
  c.title = "Reward <per step>";
  c.x_label = "step";
  c.series.push_back({"reward_mean", {{1, 0.1}, {2, 0.2}, {3, 0.4}}});
  c.series.push_back({"a&b", {{1, 1}, {3, 2}}});
  const std::string svg = LineChartSvg(c);
  EXPECT_TRUE(
      absl::StartsWith(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_TRUE(absl::EndsWith(svg, "</svg>"));
  EXPECT_EQ(Count(svg, "<polyline"), 2);
  EXPECT_EQ(PolylinePoints(svg, "reward_mean"), 3);
  EXPECT_EQ(PolylinePoints(svg, "a&amp;b"), 2);
  EXPECT_TRUE(absl::StrContains(svg, "Reward &lt;per step&gt;"));
  EXPECT_FALSE(absl::StrContains(svg, "<per step>"));
  // Two series: a legend entry each.
  EXPECT_EQ(Count(svg, ">reward_mean</text>"), 1);
}

TEST(LineChartTest, SaysNoDataAndSkipsNonFinitePoints) {
  LineChartSpec empty;
  empty.title = "t";
  EXPECT_TRUE(absl::StrContains(LineChartSvg(empty), ">no data<"));
  LineChartSpec c;
  c.series.push_back(
      {"s", {{1, 1}, {2, std::numeric_limits<double>::quiet_NaN()}, {3, 2}}});
  EXPECT_EQ(PolylinePoints(LineChartSvg(c), "s"), 2);
}

TEST(BarChartTest, OneRectPerValueAndADotPerRepeat) {
  BarChartSpec c;
  c.title = "Tokens / s by mode";
  c.categories = {"colocated-sync", "fused"};
  c.series.push_back({"median", {2338, 2547}, {{2301, 2375}, {2520, 2575}}});
  const std::string svg = BarChartSvg(c);
  EXPECT_EQ(Count(svg, "<rect data-series=\"median\""), 2);
  EXPECT_EQ(Count(svg, "class=\"repeat\""), 4);
  EXPECT_TRUE(absl::StrContains(svg, ">2338</text>"));
  EXPECT_TRUE(absl::StrContains(svg, ">each run</text>"));
}

TEST(ParseMetricsJsonlTest, ReadsRecordsAndSkipsBlankLines) {
  std::vector<std::string> notes;
  absl::StatusOr<std::vector<MetricRow>> rows = ParseMetricsJsonl(
      "{\"step\":1,\"reward_mean\":0.5,\"ok\":true,\"name\":\"x\"}\n\n"
      "{\"step\":2,\"reward_mean\":0.75}\n",
      "m.jsonl", &notes);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].at("reward_mean"), 0.5);
  EXPECT_EQ((*rows)[0].at("ok"), 1.0);
  EXPECT_EQ((*rows)[0].count("name"), 0u);
  EXPECT_TRUE(notes.empty());
}

TEST(ParseMetricsJsonlTest, NamesFileAndLineOfAMalformedRecord) {
  std::vector<std::string> notes;
  absl::StatusOr<std::vector<MetricRow>> rows =
      ParseMetricsJsonl("{\"step\":1}\n{\"step\":2,}\n{\"step\":3}\n",
                        "run/metrics.jsonl", &notes);
  ASSERT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(rows.status().message(),
                               "run/metrics.jsonl:2: not JSON: "))
      << rows.status();
  rows = ParseMetricsJsonl("[1,2]\n", "m", &notes);
  EXPECT_TRUE(absl::StrContains(rows.status().message(), "m:1: not a JSON"));
  rows = ParseMetricsJsonl("{\"loss\":1}\n", "m", &notes);
  EXPECT_TRUE(
      absl::StrContains(rows.status().message(), "no numeric \"step\""));
}

TEST(ParseMetricsJsonlTest, SkipsALastLineStillBeingWritten) {
  std::vector<std::string> notes;
  absl::StatusOr<std::vector<MetricRow>> rows =
      ParseMetricsJsonl("{\"step\":1}\n{\"step\":2,\"rew", "m", &notes);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->size(), 1u);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(notes[0], "m:2: the last line is incomplete"));
}

TEST(ParseConfigScalarsTest, ReadsTopLevelAndSectionScalars) {
  const auto c = ParseConfigScalars(
      "name: job\ninit_checkpoint: \"\"\nmodel:\n  d_model: 128\n  "
      "rope_scaling:\n    type: none\nplacement:\n  mode: fused\n"
      "stalesync:\n  max_policy_lag: 2\n");
  EXPECT_EQ(c.at("name"), "job");
  EXPECT_EQ(c.at("model.d_model"), "128");
  EXPECT_EQ(c.at("placement.mode"), "fused");
  EXPECT_EQ(c.at("stalesync.max_policy_lag"), "2");
  EXPECT_EQ(c.count("init_checkpoint"), 0u);
  EXPECT_EQ(c.count("model.rope_scaling.type"), 0u);
  EXPECT_EQ(c.count("rope_scaling.type"), 0u);
}

MetricRow Step(double step, double extra = 0) {
  return {{"step", step},
          {"reward_mean", 0.1 * step},
          {"train_accuracy", 0.05 * step},
          {"tokens_per_second", 1000 + step},
          {"loss", 1 / step},
          {"max_staleness", step > 1 ? 1 : 0},
          {"staleness_0", step > 1 ? 0 : 16},
          {"staleness_1", step > 1 ? 16 : 0},
          {"train_seconds", 0.6 + extra},
          {"rollout_seconds", 0.3},
          {"weight_sync_seconds", 0},
          {"step_seconds", 1}};
}

TEST(RenderRunReportTest, DrawsEveryChartOfARun) {
  RunReportInput in;
  in.name = "demo";
  in.source = "runs/demo";
  in.rows = {Step(1), Step(2), Step(3)};
  in.rows[2]["eval_accuracy"] = 0.5;
  in.summary = {{"initial_eval_accuracy", 0.25},
                {"final_eval_accuracy", 0.5},
                {"tokens_per_second", 1002.5},
                {"wall_seconds", 3.2}};
  in.config = {{"run.total_steps", "3"}, {"placement.mode", "fused"}};
  const std::string html = RenderRunReport(in);
  // Reward, accuracy, throughput, loss, staleness bars, max staleness, split.
  EXPECT_EQ(Count(html, "<svg"), 7);
  EXPECT_EQ(PolylinePoints(html, "reward_mean"), 3);
  EXPECT_EQ(PolylinePoints(html, "eval_accuracy"), 2);  // initial + step 3
  EXPECT_EQ(PolylinePoints(html, "train_seconds"), 3);
  EXPECT_EQ(PolylinePoints(html, "weight_sync_seconds"), -1);
  EXPECT_EQ(Count(html, "<rect data-series=\"samples\""), 2);
  EXPECT_TRUE(absl::StrContains(html, "0.25 → 0.5"));
  EXPECT_TRUE(absl::StrContains(html, "no memory fields in this run"));
  EXPECT_TRUE(absl::StrContains(html, "placement fused"));
  EXPECT_FALSE(absl::StrContains(html, "<script"));
}

TEST(RenderRunReportTest, KeepsTheLastRecordOfARepeatedStep) {
  RunReportInput in;
  in.name = "resumed";
  in.rows = {Step(1), Step(2), Step(2, 0.1), Step(3)};
  const std::string html = RenderRunReport(in);
  EXPECT_EQ(PolylinePoints(html, "reward_mean"), 3);
  EXPECT_TRUE(absl::StrContains(html, "1 record(s) repeat an earlier step"));
  EXPECT_TRUE(absl::StrContains(html, "no summary.json yet"));
}

TEST(RenderRunReportTest, DrawsMemoryFieldsWhenRecorded) {
  RunReportInput in;
  in.name = "mem";
  MetricRow r = Step(1);
  r["memory_weights_bytes"] = 4 << 20;
  r["memory_optimizer_bytes"] = 8 << 20;
  in.rows = {r};
  const std::string html = RenderRunReport(in);
  EXPECT_EQ(Count(html, "<svg"), 8);
  EXPECT_EQ(PolylinePoints(html, "memory_weights_bytes"), 1);
  EXPECT_FALSE(absl::StrContains(html, "no memory fields"));
}

TEST(RenderRunReportTest, AnEmptyRunSaysSo) {
  RunReportInput in;
  in.name = "new";
  const std::string html = RenderRunReport(in);
  EXPECT_EQ(Count(html, "<svg"), 0);
  EXPECT_TRUE(absl::StrContains(html, "no records yet"));
}

nlohmann::ordered_json BenchResult() {
  return nlohmann::ordered_json::parse(R"({
    "config": "configs/bench.yaml", "steps": 3, "repeats": 2,
    "modes": {
      "fused": {"placement": "fused", "max_policy_lag": 0,
        "median_tokens_per_second": 2500, "ratio_to_colocated_sync": 1.1,
        "median_trainer_busy_fraction": 0.9,
        "median_rollout_busy_fraction": 0.3, "max_staleness": 0,
        "runs": [{"tokens_per_second": 2400, "output_dir": "r/fused-1"},
                 {"tokens_per_second": 2600, "output_dir": "r/fused-2"}]},
      "colocated-sync": {"placement": "colocated-sync",
        "median_tokens_per_second": 2270, "ratio_to_colocated_sync": 1,
        "runs": [{"tokens_per_second": 2270, "output_dir": "r/cs-1"}]}}})");
}

TEST(DetectBenchKindTest, TellsTheBenchmarksApart) {
  EXPECT_EQ(*DetectBenchKind(BenchResult()), BenchKind::kBench);
  EXPECT_EQ(*DetectBenchKind({{"variants", {{"dense", nullptr}}}}),
            BenchKind::kBenchMemory);
  EXPECT_EQ(*DetectBenchKind({{"benchmark", "bench-weights"}}),
            BenchKind::kBenchWeights);
  EXPECT_EQ(*DetectBenchKind({{"settings", {{"0", nullptr}}}}),
            BenchKind::kBenchLogits);
  EXPECT_EQ(DetectBenchKind({{"hello", 1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DetectBenchKind(nlohmann::ordered_json::array()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RenderBenchReportTest, ShowsModesInFileOrderWithRepeatsAndCurves) {
  BenchReportInput in;
  in.source = "bench.json";
  in.result = BenchResult();
  in.run_rows["r/fused-1"] = {Step(1), Step(2), Step(3)};
  absl::StatusOr<std::string> html = RenderBenchReport(in);
  ASSERT_TRUE(html.ok()) << html.status();
  // 4 bar charts + 4 per-step charts.
  EXPECT_EQ(Count(*html, "<svg"), 8);
  EXPECT_EQ(PolylinePoints(*html, "fused"), 3);
  EXPECT_EQ(PolylinePoints(*html, "colocated-sync"), -1);
  // Repeats on tokens/s: 2 + 1.
  EXPECT_GE(Count(*html, "class=\"repeat\""), 3);
  EXPECT_LT(html->find("<td>fused</td>"),
            html->find("<td>colocated-sync</td>"));
  EXPECT_TRUE(absl::StrContains(*html, "2400, 2600"));
}

TEST(RenderBenchReportTest, NeverThrowsOnMistypedMembers) {
  BenchReportInput in;
  in.result = nlohmann::ordered_json::parse(
      R"({"modes": {"x": {"runs": 3, "median_tokens_per_second": "fast"},
                    "y": 7}})");
  EXPECT_TRUE(RenderBenchReport(in).ok());
  in.result = nlohmann::ordered_json::parse(
      R"({"sizes": [{"mib": 1, "memcpy": {"seconds": "x"}}, 4]})");
  EXPECT_TRUE(RenderBenchReport(in).ok());
  in.result = nlohmann::ordered_json::parse(R"({"variants": {"dense": 1}})");
  EXPECT_TRUE(RenderBenchReport(in).ok());
  in.result = nlohmann::ordered_json::parse(R"({"settings": {"0": []}})");
  EXPECT_TRUE(RenderBenchReport(in).ok());
}

}  // namespace
}  // namespace fusionrl::cli
