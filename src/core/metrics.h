// Metrics output: one JSON object per line (JSONL), plus the small formatting
// helpers of progress lines.
//
// MetricsLog appends and flushes each record, so a crashed or killed run
// keeps every line it wrote. Not thread-safe: one writer per file.
#ifndef FUSIONRL_CORE_METRICS_H_
#define FUSIONRL_CORE_METRICS_H_

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusionrl {

// A flat metrics record: ordered (name, value) pairs. Non-finite values are
// written as null (JSON has no NaN).
using MetricRecord = std::vector<std::pair<std::string, double>>;

class MetricsLog {
 public:
  // Opens `path` for appending (truncating first if `truncate`).
  static absl::StatusOr<std::unique_ptr<MetricsLog>> Open(
      const std::string& path, bool truncate);
  ~MetricsLog();

  absl::Status Append(const MetricRecord& record);
  // Appends one already serialised JSON object (no newline inside).
  absl::Status AppendLine(const std::string& json);
  const std::string& path() const { return path_; }

 private:
  MetricsLog(std::string path, std::FILE* file);
  std::string path_;
  std::FILE* file_;
};

// The record as one JSON line (no trailing newline); integral values are
// written without a fraction.
std::string MetricRecordToJson(const MetricRecord& record);

// "45s", "3m05s", "2h04m".
std::string FormatDuration(double seconds);

// The median of `values` (mean of the middle two for an even count); 0 when
// empty.
double Median(std::vector<double> values);

// "950", "12.3k", "4.56M".
std::string FormatCount(double value);

// Writes `text` to `path` atomically: a temp file in the same directory, then
// rename. Readers see the old file or the new one, never a torn one.
absl::Status WriteFileAtomic(const std::string& path, const std::string& text);

// The whole file; NotFound "<what>: cannot read '<path>'" when it cannot be
// opened.
absl::StatusOr<std::string> ReadTextFile(const std::string& path,
                                         const std::string& what);

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_METRICS_H_
