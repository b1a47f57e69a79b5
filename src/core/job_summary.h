// summary.json: the one-file result of a job (see fusionrl/job.h). The
// public header's JobPhaseName is defined with it (job_summary.cc).
#ifndef FUSIONRL_CORE_JOB_SUMMARY_H_
#define FUSIONRL_CORE_JOB_SUMMARY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fusionrl/job.h"

namespace fusionrl {

// Writes `summary` as JSON to summary.summary_path (atomically).
absl::Status WriteSummary(const JobSummary& summary);

// The inverse, from summary.json's text (summary_path is not stored and is
// left empty). Internal when the text is not a JSON object.
absl::StatusOr<JobSummary> ParseSummary(const std::string& text);

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_JOB_SUMMARY_H_
