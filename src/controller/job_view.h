// What JobManager says about jobs and nodes, as plain structs: the status
// of a job, its events and step records, the cards' last heartbeats, the
// whole cluster. The manager keeps and returns only these; the wire forms
// (JobService, the dashboard's JSON, Prometheus) are made from them at the
// edge, in job_view_proto.h, as Ray's GCS managers keep their tables in
// their own types and speak protobuf only at the service.
#ifndef FUSIONRL_CONTROLLER_JOB_VIEW_H_
#define FUSIONRL_CONTROLLER_JOB_VIEW_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/time/time.h"
#include "core/card_role.h"
#include "core/node_registry.h"
#include "fusionrl/job.h"

namespace fusionrl {

// How events and messages name a phase: "SUCCEEDED", "WAITING_FOR_CAPACITY".
inline std::string JobPhaseText(JobPhase phase) {
  return absl::AsciiStrToUpper(JobPhaseName(phase));
}

// True for kSucceeded, kFailed and kCancelled.
constexpr bool JobPhaseIsTerminal(JobPhase phase) {
  return phase == JobPhase::kSucceeded || phase == JobPhase::kFailed ||
         phase == JobPhase::kCancelled;
}

// A card as its worker's last heartbeat reported it.
struct CardReport {
  int index = 0;
  CardRole role = CardRole::kIdle;
  double busy_fraction = 0;  // of the last heartbeat interval
  std::map<std::string, int64_t> memory_bytes;  // book -> bytes on the card
  std::string activity;                         // "" = idle
  double activity_seconds = 0;                  // in `activity` so far

  bool operator==(const CardReport& o) const {
    return index == o.index && role == o.role &&
           busy_fraction == o.busy_fraction && memory_bytes == o.memory_bytes &&
           activity == o.activity && activity_seconds == o.activity_seconds;
  }
};

// Something that happened to a job ("node-2 lost (...)").
struct JobEvent {
  absl::Time time;
  std::string text;

  bool operator==(const JobEvent& o) const {
    return time == o.time && text == o.text;
  }
};

// One record of a job's history (v1.StepRecord): a committed step's metrics,
// an evaluation or a checkpoint.
struct HistoryRecord {
  int64_t seq = 0;   // increases by one per record of the job
  int64_t step = 0;  // 0: before step 1
  absl::Time time;
  std::string metrics_json;    // the metrics.jsonl record; "" for eval-only
  double eval_accuracy = -1;   // -1: none measured at this step
  std::string checkpoint_dir;  // "" = none written at this step
};

// The records of a job after a given seq; `first_seq` is where the kept
// ones begin (the manager keeps the newest JobManager::kHistoryLimit).
struct JobHistory {
  std::vector<HistoryRecord> records;
  int64_t first_seq = 0;
};

// A node, as a job's status or the cluster view shows it.
struct NodeStatus {
  std::string node_id;
  std::string host;
  std::string super_node;
  std::string state;  // "alive", "lost", "left"; a job's node also "gone"
  absl::Duration heartbeat_age;
  // A job's nodes: the job's cards on it. The cluster view: every card of
  // the node (kIdle without work).
  std::vector<CardReport> cards;
  int64_t clock = 0;    // StaleSync across super nodes: its last step
  std::string job_id;   // the cluster view: the unfinished job it works for
  std::string version;  // the cluster view: the worker's FusionRL version
  std::vector<CardSpec> card_specs;  // the cluster view: what registered
};

// A job as JobService shows it (fields as v1.JobStatus documents them).
struct JobStatus {
  std::string job_id;
  std::string name;
  JobPhase phase = JobPhase::kPending;
  std::string message;  // why it waits or failed
  int64_t step = 0;
  int64_t total_steps = 0;
  int64_t policy_version = 0;
  double reward_mean = 0;
  double train_accuracy = 0;
  double initial_eval_accuracy = 0;
  double eval_accuracy = 0;
  int64_t rollout_tokens = 0;
  double tokens_per_second = 0;
  int64_t groups_submitted = 0;
  int64_t groups_trained = 0;
  int64_t groups_requeued = 0;
  absl::Time submitted_at;
  absl::Time updated_at;
  // The nodes the job was placed on (lost ones included) with the job's
  // cards on each; the wire's flat card list is made from these.
  std::vector<NodeStatus> nodes;
  std::vector<JobEvent> events;  // oldest first
  std::string summary_json;      // once the job has ended
  int error_code = 0;            // kFailed: absl/gRPC canonical code
  int max_clock_skew = 0;
  int64_t max_clock_skew_seen = 0;
  std::string last_metrics_json;
  int64_t controller_tensor_bytes = 0;
  std::string placement;  // placement.mode's name
};

// Every node the registry knows and every job, newest first.
struct ClusterView {
  std::vector<NodeStatus> nodes;
  std::vector<JobStatus> jobs;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_JOB_VIEW_H_
