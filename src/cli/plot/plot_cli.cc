#include "cli/plot/plot_cli.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cli/common/exit_codes.h"
#include "cli/plot/plot_report.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace fusionrl::cli {
namespace {

enum class PathKind { kMissing, kDirectory, kFile, kOther };

PathKind KindOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return PathKind::kMissing;
  if (S_ISDIR(st.st_mode)) return PathKind::kDirectory;
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  return PathKind::kOther;
}

absl::Status ErrnoStatus(int err, const std::string& message) {
  const std::string text = absl::StrCat(message, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(text);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(text);
  return absl::UnavailableError(text);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return ErrnoStatus(errno, absl::StrCat("cannot read '", path, "'"));
  std::ostringstream text;
  text << f.rdbuf();
  if (f.bad()) {
    return ErrnoStatus(errno, absl::StrCat("cannot read '", path, "'"));
  }
  return text.str();
}

// The reason of a parse error, without nlohmann's "[json.exception...]
// parse error at line L, column C: " prefix.
std::string Why(const nlohmann::json::parse_error& e) {
  const std::string what = e.what();
  const size_t column = what.find("column ");
  if (column != std::string::npos) {
    const size_t colon = what.find(": ", column);
    if (colon != std::string::npos) return what.substr(colon + 2);
  }
  const size_t bracket = what.find("] ");
  return bracket == std::string::npos ? what : what.substr(bracket + 2);
}

// "PATH:LINE:COLUMN" of byte offset `byte` (1-based, as nlohmann counts).
std::string Where(const std::string& path, const std::string& text,
                  size_t byte) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i + 1 < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return absl::StrCat(path, ":", line, ":", column);
}

template <typename Json>
absl::StatusOr<Json> ParseJsonFile(const std::string& text,
                                   const std::string& path) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(path, text, e.byte), ": not JSON: ", Why(e)));
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not JSON: ", e.what()));
  }
}

std::string WithoutTrailingSlash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string Basename(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::StatusOr<std::string> RenderRun(const std::string& dir) {
  RunReportInput in;
  in.source = dir;
  const std::string metrics_path = dir + "/metrics.jsonl";
  if (KindOf(metrics_path) != PathKind::kFile) {
    return absl::NotFoundError(absl::StrCat(
        "plot: '", dir,
        "' has no metrics.jsonl (expected a run's output_dir or a benchmark's "
        "JSON file)"));
  }
  FUSIONRL_ASSIGN_OR_RETURN(const std::string metrics, ReadFile(metrics_path));
  FUSIONRL_ASSIGN_OR_RETURN(
      in.rows, ParseMetricsJsonl(metrics, metrics_path, &in.notes));
  const std::string summary_path = dir + "/summary.json";
  if (KindOf(summary_path) == PathKind::kFile) {
    FUSIONRL_ASSIGN_OR_RETURN(const std::string text, ReadFile(summary_path));
    FUSIONRL_ASSIGN_OR_RETURN(
        in.summary, ParseJsonFile<nlohmann::json>(text, summary_path));
    if (!in.summary.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(summary_path, ": not a JSON object"));
    }
  }
  const std::string config_path = dir + "/config.yaml";
  if (KindOf(config_path) == PathKind::kFile) {
    absl::StatusOr<std::string> text = ReadFile(config_path);
    if (text.ok()) {
      in.config = ParseConfigScalars(*text);
    } else {
      in.notes.push_back(std::string(text.status().message()));
    }
  } else {
    in.notes.push_back("No config.yaml in the run directory.");
  }
  auto name = in.config.find("name");
  in.name = name != in.config.end() && !name->second.empty() ? name->second
                                                             : Basename(dir);
  return RenderRunReport(in);
}

absl::StatusOr<std::string> RenderBenchFile(const std::string& path) {
  FUSIONRL_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  BenchReportInput in;
  in.source = path;
  FUSIONRL_ASSIGN_OR_RETURN(in.result,
                            ParseJsonFile<nlohmann::ordered_json>(text, path));
  absl::StatusOr<BenchKind> kind = DetectBenchKind(in.result);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", kind.status().message()));
  }
  if (*kind == BenchKind::kBench) {
    // Per-step curves: each mode's first run, as bench wrote its output_dir
    // (relative to where bench ran, else to the JSON's folder).
    for (const auto& [mode, m] : in.result["modes"].items()) {
      if (!m.is_object() || !m.contains("runs") || !m["runs"].is_array() ||
          m["runs"].empty() || !m["runs"][0].is_object()) {
        continue;
      }
      const auto dir = m["runs"][0].find("output_dir");
      if (dir == m["runs"][0].end() || !dir->is_string()) continue;
      const std::string out_dir = dir->get<std::string>();
      std::string metrics = out_dir + "/metrics.jsonl";
      if (KindOf(metrics) != PathKind::kFile && !out_dir.empty() &&
          out_dir[0] != '/') {
        metrics = absl::StrCat(Dirname(path), "/", out_dir, "/metrics.jsonl");
      }
      if (KindOf(metrics) != PathKind::kFile) continue;
      absl::StatusOr<std::string> rows_text = ReadFile(metrics);
      absl::StatusOr<std::vector<MetricRow>> rows =
          rows_text.ok()
              ? ParseMetricsJsonl(*rows_text, metrics, &in.notes)
              : absl::StatusOr<std::vector<MetricRow>>(rows_text.status());
      if (!rows.ok()) {
        in.notes.push_back(absl::StrCat("per-step curves of ", mode, ": ",
                                        rows.status().message()));
        continue;
      }
      in.run_rows[out_dir] = *std::move(rows);
    }
  }
  return RenderBenchReport(in);
}

// Writes `text` to `path` through a temporary file beside it, so that a
// reader never sees half a report.
absl::Status WriteReport(const std::string& path, const std::string& text) {
  if (KindOf(path) == PathKind::kDirectory) {
    return absl::UnavailableError(
        absl::StrCat("--out: cannot write '", path, "': it is a directory"));
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) {
      return absl::UnavailableError(absl::StrCat("--out: cannot write '", path,
                                                 "': ", std::strerror(errno)));
    }
    f << text;
    f.close();
    if (!f) {
      const int err = errno;
      std::remove(tmp.c_str());
      return absl::UnavailableError(absl::StrCat("--out: cannot write '", path,
                                                 "': ", std::strerror(err)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("--out: cannot write '", path, "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<MetricRow>> ParseMetricsJsonl(
    const std::string& text, const std::string& path,
    std::vector<std::string>* notes) {
  std::vector<MetricRow> rows;
  size_t begin = 0;
  for (int line_no = 1; begin < text.size(); ++line_no) {
    size_t end = text.find('\n', begin);
    const bool last_unterminated = end == std::string::npos;
    if (last_unterminated) end = text.size();
    const absl::string_view line = absl::StripAsciiWhitespace(
        absl::string_view(text).substr(begin, end - begin));
    begin = end + 1;
    if (line.empty()) continue;
    const std::string where = absl::StrCat(path, ":", line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      if (last_unterminated) {
        notes->push_back(absl::StrCat(
            where,
            ": the last line is incomplete (the run is still writing it?); "
            "skipped"));
        break;
      }
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": not JSON: ", Why(e)));
    }
    if (!j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          ": not a JSON object (metrics.jsonl holds one object per "
          "step)"));
    }
    MetricRow row;
    for (const auto& [key, value] : j.items()) {
      if (value.is_number()) {
        row[key] = value.get<double>();
      } else if (value.is_boolean()) {
        row[key] = value.get<bool>() ? 1.0 : 0.0;
      }
    }
    auto step = row.find("step");
    if (step == row.end() || !std::isfinite(step->second)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the record has no numeric \"step\""));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::map<std::string, std::string> ParseConfigScalars(const std::string& text) {
  std::map<std::string, std::string> out;
  std::string section;
  std::istringstream in(text);
  std::string raw;
  while (std::getline(in, raw)) {
    if (!raw.empty() && raw.back() == '\r') raw.pop_back();
    const size_t indent = raw.find_first_not_of(' ');
    if (indent == std::string::npos || raw[indent] == '#' ||
        raw[indent] == '-') {
      continue;
    }
    const size_t colon = raw.find(':', indent);
    if (colon == std::string::npos) continue;
    const std::string key = raw.substr(indent, colon - indent);
    std::string value(
        absl::StripAsciiWhitespace(absl::string_view(raw).substr(colon + 1)));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    if (indent == 0) {
      section = value.empty() ? key : "";
      if (!value.empty()) out[key] = value;
    } else if (indent == 2 && !section.empty() && !value.empty()) {
      out[absl::StrCat(section, ".", key)] = value;
    }
  }
  return out;
}

CLI::App* AddPlotCommand(CLI::App& app, PlotArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "plot",
      "an HTML report (inline SVG charts, no network) of a run directory or "
      "of a benchmark's JSON");
  cmd->add_option("input", args.input,
                  "a run's output_dir (metrics.jsonl, summary.json), or the "
                  "JSON of fusionrl bench / bench-memory / bench-weights / "
                  "bench-logits")
      ->required();
  cmd->add_option("--out,-o", args.out,
                  "write the HTML here (default: <run dir>/report.html, or "
                  "the JSON's path with .html)");
  return cmd;
}

int RunPlot(const PlotArgs& args) {
  std::string input = WithoutTrailingSlash(args.input);
  PathKind kind = KindOf(input);
  if (kind == PathKind::kMissing) {
    return Fail(absl::NotFoundError(
        absl::StrCat("plot: '", args.input, "': no such file or directory")));
  }
  // A run's metrics.jsonl stands for its directory.
  if (kind == PathKind::kFile && Basename(input) == "metrics.jsonl") {
    input = Dirname(input);
    kind = PathKind::kDirectory;
  }
  absl::StatusOr<std::string> html;
  std::string out = args.out;
  if (kind == PathKind::kDirectory) {
    html = RenderRun(input);
    if (out.empty()) out = input + "/report.html";
  } else if (kind == PathKind::kFile) {
    html = RenderBenchFile(input);
    if (out.empty()) {
      out = absl::StrCat(absl::EndsWith(input, ".json")
                             ? input.substr(0, input.size() - 5)
                             : input,
                         ".html");
    }
  } else {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "plot: '", args.input, "' is neither a directory nor a file")));
  }
  if (!html.ok()) return Fail(html.status());
  if (absl::Status s = WriteReport(out, *html); !s.ok()) return Fail(s);
  std::cout << out << "\n";
  return kExitOk;
}

}  // namespace fusionrl::cli
