#include "core/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace fusionrl {

MetricsLog::MetricsLog(std::string path, std::FILE* file)
    : path_(std::move(path)), file_(file) {}

MetricsLog::~MetricsLog() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::StatusOr<std::unique_ptr<MetricsLog>> MetricsLog::Open(
    const std::string& path, bool truncate) {
  std::FILE* f = std::fopen(path.c_str(), truncate ? "w" : "a");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot open metrics file '", path, "': ", std::strerror(errno)));
  }
  return std::unique_ptr<MetricsLog>(new MetricsLog(path, f));
}

absl::Status MetricsLog::Append(const MetricRecord& record) {
  return AppendLine(MetricRecordToJson(record));
}

absl::Status MetricsLog::AppendLine(const std::string& json) {
  const std::string line = json + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() ||
      std::fflush(file_) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot write metrics file '", path_, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string MetricRecordToJson(const MetricRecord& record) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [name, value] : record) {
    if (!std::isfinite(value)) {
      j[name] = nullptr;
    } else if (value == std::floor(value) && std::fabs(value) < 9e15) {
      j[name] = static_cast<int64_t>(value);
    } else {
      j[name] = value;
    }
  }
  return j.dump();
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

std::string FormatCount(double v) {
  if (!std::isfinite(v)) return "?";
  const double a = std::fabs(v);
  if (a < 1e3) return absl::StrFormat("%.0f", v);
  if (a < 1e6) return absl::StrFormat("%.1fk", v / 1e3);
  if (a < 1e9) return absl::StrFormat("%.2fM", v / 1e6);
  return absl::StrFormat("%.2fG", v / 1e9);
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::UnavailableError(
          absl::StrCat("cannot write '", tmp, "': ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat(
        "cannot rename '", tmp, "' to '", path, "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path,
                                         const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(what, ": cannot read '", path, "'"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace fusionrl
