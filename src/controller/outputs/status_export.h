// What the controller's HTTP endpoints serve
// (controller/outputs/http_server.h), made from the same ClusterStatus the
// GetClusterStatus RPC returns:
//   PrometheusText: /metrics, Prometheus text exposition format 0.0.4;
//   StatusJson:     /api/status, the dashboard's data (shape in
//                   docs/dashboard/api-status-example.json).
// Pure functions of their inputs; the families are listed in
// docs/observability.md.
#ifndef FUSIONRL_CONTROLLER_OUTPUTS_STATUS_EXPORT_H_
#define FUSIONRL_CONTROLLER_OUTPUTS_STATUS_EXPORT_H_

#include <map>
#include <string>
#include <vector>

#include "controller/outputs/rpc_stats.h"
#include "fusionrl/v1/job.pb.h"

namespace fusionrl {

// A job's curves, one entry per step record with metrics (the dashboard's
// `history`).
struct JobCurves {
  int64_t last_seq = 0;  // the newest StepRecord folded in
  std::vector<int64_t> step;
  std::vector<double> reward_mean, train_accuracy, tokens_per_second,
      max_staleness;
  std::vector<int64_t> eval_step;
  std::vector<double> eval_accuracy;
  // Folds in records (oldest first, seq > last_seq). A record for a step at
  // or below the last one (a StaleSync roll-back replays steps) first
  // drops the points from that step on. At most `limit` points are kept.
  void Add(const v1::JobHistory& history, size_t limit = 4096);
};

std::string PrometheusText(const v1::ClusterStatus& status,
                           const RpcStats::Snapshot& rpc);

// `curves` by job id (jobs without an entry get empty curves).
std::string StatusJson(const v1::ClusterStatus& status,
                       const std::map<std::string, JobCurves>& curves,
                       const std::string& controller_address);

// "idle", "colocated", "fused", "rollout", "train".
const char* CardRoleLabel(int role);
// "pending", "waiting_for_capacity", "running", "succeeded", "failed",
// "cancelled".
const char* JobPhaseLabel(int phase);

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_OUTPUTS_STATUS_EXPORT_H_
