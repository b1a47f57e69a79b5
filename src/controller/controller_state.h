// ControllerState: the controller's memory on disk (`fusionrl controller
// --state-dir DIR`), so that a controller killed and started again with the
// same directory continues its jobs (docs/cluster.md#controller-restart).
//
// What it keeps: every node the registry knows (id, spec, lost or alive)
// and every job's whole state as JobManager::SaveJobLocked takes it (the
// resolved config, phase, parts, the prompt-group ledger, the attempt in
// flight, the last committed step and the run totals). Each change is one
// StateRecord (proto/fusionrl/v1/state.proto) appended to the journal
// (controller/state_journal.h) and synced before the call that made it returns;
// the journal is compacted into a snapshot once it passes 8 MiB and at
// every start.
//
// Restoring: Open() reads the snapshot, replays the newer records, hands
// the nodes to the registry (alive ones get one heartbeat timeout to be
// heard from) and the jobs to the manager (JobManager::Restore), writes a
// fresh snapshot, and from then on journals what changes.
//
// Thread safety: thread-safe (one mutex; lock order: this, then the
// registry's and the manager's).
#ifndef FUSIONRL_CONTROLLER_CONTROLLER_STATE_H_
#define FUSIONRL_CONTROLLER_CONTROLLER_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "controller/job_manager.h"
#include "controller/state_journal.h"
#include "core/node_registry.h"
#include "fusionrl/v1/state.pb.h"

namespace fusionrl {

class ControllerState {
 public:
  // The journal is compacted into a snapshot past this size.
  static constexpr int64_t kCompactBytes = int64_t{8} << 20;

  // Opens `dir` (created if needed), restores `registry` and `jobs` (both
  // fresh) from what it holds and becomes the manager's state sink. A
  // damaged journal tail is logged and dropped; a damaged snapshot or a
  // state that does not restore is an error naming the directory.
  static absl::StatusOr<std::unique_ptr<ControllerState>> Open(
      const std::string& dir, NodeRegistry& registry, JobManager& jobs);

  // Stops being the manager's sink (what changes later is not kept).
  ~ControllerState();
  ControllerState(const ControllerState&) = delete;
  ControllerState& operator=(const ControllerState&) = delete;

  // Journals node `node_id`'s entry as the registry holds it now (gone if
  // the registry forgot it). Call after Register, Deregister and SweepLost,
  // before answering.
  void NodeChanged(const std::string& node_id) ABSL_LOCKS_EXCLUDED(mu_);

  // What Open() restored, for the log.
  int restored_nodes() const { return restored_nodes_; }
  int restored_jobs() const { return restored_jobs_; }

 private:
  ControllerState(std::unique_ptr<StateJournal> journal, NodeRegistry& registry,
                  JobManager& jobs)
      : journal_(std::move(journal)), registry_(registry), jobs_(jobs) {}

  absl::Status WriteJobs(std::vector<v1::JobState> changed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `may_compact`: only the jobs' writer compacts (it holds the manager's
  // journal order, so no older job state can follow the snapshot).
  absl::Status WriteLocked(std::vector<v1::StateRecord> records,
                           bool may_compact) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::NodeState NodeStateOf(const std::string& node_id) const;

  absl::Mutex mu_;
  std::unique_ptr<StateJournal> journal_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  NodeRegistry& registry_;
  JobManager& jobs_;
  int restored_nodes_ = 0;
  int restored_jobs_ = 0;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_CONTROLLER_STATE_H_
