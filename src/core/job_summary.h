// summary.json: the one-file result of a job (see fusionrl/job.h).
#ifndef FUSIONRL_CORE_JOB_SUMMARY_H_
#define FUSIONRL_CORE_JOB_SUMMARY_H_

#include "absl/status/status.h"
#include "fusionrl/job.h"

namespace fusionrl {

// Writes `summary` as JSON to summary.summary_path (atomically).
absl::Status WriteSummary(const JobSummary& summary);

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_JOB_SUMMARY_H_
