// The state JobManager keeps per job and per step attempt. Internal to the
// controller: only the JobManager files include it.
//
// Thread safety: none of its own. Every field of every struct here is
// guarded by JobManager::mu_ (they are reachable only through
// JobManager::jobs_, which is ABSL_GUARDED_BY(mu_)); an Attempt pointer stays
// valid while the lock is held or while the attempt is its job's `current`,
// so code that waits re-finds it after every wait.
#ifndef FUSIONRL_CONTROLLER_JOB_STATE_H_
#define FUSIONRL_CONTROLLER_JOB_STATE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "controller/group_ledger.h"
#include "controller/job_manager.h"
#include "core/stalesync.h"
#include "core/step_protocol.h"
#include "fusionrl/config.h"
#include "fusionrl/job.h"

namespace fusionrl {

// One collective round of an attempt: each participant's payload, summed in
// participant order (SumPayloads) once all are in.
struct ReduceRound {
  std::vector<std::optional<std::string>> parts;  // per member
  int received = 0;
  int fetched = 0;
  ReduceDtype dtype = ReduceDtype::kFloat32;
  bool done = false;
  std::string sum;
};

// A FinishStep as its attempt keeps it.
struct JobManager::ReportedStep {
  StepReport report;
  // A report that came over the wire carries the lead's record as JSON
  // (FinishStepRequest.metrics_json) and no typed metrics; an in-process
  // one has typed metrics and this empty. Formatted once, at commit.
  std::string metrics_json;
};

struct JobManager::Attempt {
  int64_t step = 0;
  int attempt = 0;
  bool aborted = false;
  bool committed = false;
  // The c10d data plane's rendezvous generation its nodes' group belongs to.
  int64_t generation = 0;
  // Participants (indices into Job::parts), in rank order.
  std::vector<int> members;
  std::vector<int> first_rank;                // per member
  std::vector<std::vector<uint64_t>> groups;  // per member, ledger indices
  int world = 0;
  std::vector<bool> finished;  // per member
  std::map<int64_t, ReduceRound> rounds;
  // From the lead's FinishStep.
  ReportedStep lead_report;
  bool have_lead_report = false;
  // Skewed jobs: every member's FinishStep (tokens are per super node).
  std::vector<ReportedStep> reports;

  // Position of part `part` in `members`, or -1.
  int Member(int part) const {
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] == part) return static_cast<int>(i);
    }
    return -1;
  }
};

struct JobManager::Job {
  std::string id;
  JobConfig config;
  // `config` as YAML, once (config.yaml, the state journal's records).
  std::string config_yaml;
  // The published phase and message (what Status shows). A job that ended
  // is `over` at once; its terminal phase (end_phase) is published once its
  // outputs are written (job_outputs.h).
  JobPhase phase = JobPhase::kPending;
  std::string message;
  bool over = false;
  JobPhase end_phase = JobPhase::kPending;  // meaningful once `over`
  std::string end_message;
  absl::Time submitted, started, updated;
  uint64_t update = 0;
  std::vector<JobEvent> events;

  struct Part {
    std::string node_id;
    std::string super_node;
    std::vector<int> cards;  // card indices on that node
    bool lost = false;
    bool assigned = false;  // GetAssignment delivered
    int64_t clock = 0;      // skewed protocol: the last step it finished
    int rollout_cards = 0;  // disaggregated: the first cards only sample
    int train_cards() const {
      return static_cast<int>(cards.size()) - rollout_cards;
    }
  };
  std::vector<Part> parts;

  // Index of `node_id` in `parts`, or -1.
  int PartIndex(const std::string& node_id) const {
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].node_id == node_id) return static_cast<int>(i);
    }
    return -1;
  }

  // Steps first_step..total_steps; ledger index i is data index
  // base_cursor + i; step s owns ledger indices [(s-first)*P, (s-first+1)*P).
  int64_t first_step = 1;
  uint64_t base_cursor = 0;
  std::string resume_dir;
  std::unique_ptr<GroupLedger> ledger;
  std::unique_ptr<Attempt> current;
  int64_t last_committed = 0;
  int last_committed_attempt = 0;  // its attempt (a retried FinishStep)
  // The c10d data plane (run.data_plane = c10d): the current rendezvous
  // generation (0: none yet), and the attempts of the current step a node
  // aborted because a collective of the data plane failed.
  int64_t rendezvous_generation = 0;
  int data_plane_aborts = 0;
  // Tensor bytes of this job through the controller (Reduce and
  // ExchangeUpdates payloads, in and out).
  int64_t tensor_bytes = 0;

  // Ending: the lead writes the last checkpoint, then the job is over.
  bool stop_requested = false;
  std::string stop_reason;
  const std::atomic<bool>* stop_flag = nullptr;
  bool ending = false;
  std::string end_checkpoint;  // "final" | "step_<n>"

  // Outputs: true once its Open is queued (it then gets a Close).
  bool has_outputs = false;

  // Totals.
  JobSummary summary;
  double last_eval = 0;
  double reward_mean = 0, train_accuracy = 0;
  int64_t policy_version = 0;
  double loop_seconds = 0;
  std::string checkpoint_dir;
  std::string summary_json;       // summary.json's text once written
  std::string last_metrics_json;  // the last committed step's record
  // Step records for observers and curves (the newest kHistoryLimit; in
  // memory only: a restarted controller starts a new history).
  std::deque<HistoryRecord> history;
  int64_t history_seq = 0;  // seq of the newest record
  int error_code = 0;       // FAILED: absl/gRPC canonical code

  // The step protocol: null for the synchronous one (every node runs the
  // same step), or the skewed protocol's state (StaleSync across super
  // nodes), chosen once when the job starts (StartLocked) or is restored.
  std::unique_ptr<SkewedProtocol> skew;
  // The `update` whose state the journal holds (JournalChanges).
  uint64_t journaled_update = 0;
  // The watchdog's clock: the last commit, start or action on a stall.
  absl::Time progress_at = absl::InfinitePast();
};

// The skewed (StaleSync) step protocol's state of one job
// (stalesync.max_clock_skew k > 0 and several nodes): each node runs ahead
// of the slowest by at most k steps (the gate), steps are planned as nodes
// reach them (`ahead`: planned steps after the job's `current`, which stays
// the oldest uncommitted one), and gradient updates travel through the
// exchange (ExchangeUpdates). A roll-back to the last weight sync starts a
// new epoch; a skewed attempt's number is epoch + 1.
//
// Thread safety: none of its own; guarded by JobManager::mu_ like the Job
// that holds it (every method REQUIRES it).
struct JobManager::SkewedProtocol {
  using Key = std::pair<int64_t, int64_t>;  // (step, round)
  struct Update {
    Key key;
    std::string payload;
    uint32_t crc32c = 0;
  };

  // The protocol of a job whose nodes `node_ids` (its parts, in order) all
  // start at clock (last finished step) `clock`, which is also the first
  // weight sync. InvalidArgument from ClockSkewGate::Create.
  static absl::StatusOr<std::unique_ptr<SkewedProtocol>> Create(
      int64_t max_clock_skew, const std::vector<std::string>& node_ids,
      int64_t clock);
  explicit SkewedProtocol(ClockSkewGate g) : gate(std::move(g)) {}

  // The attempt number of the current epoch's steps.
  int attempt() const { return epoch + 1; }

  // A committed step `a`: what a roll-back to the last weight sync would
  // undo. At a weight sync (`sync`), the totals then (`tokens`,
  // `last_eval`) are what a roll-back restores.
  void RecordCommit(const Attempt& a, bool sync, int64_t tokens,
                    double last_eval);
  // Starts the next epoch at weight sync `r`, `undone` committed steps run
  // again: the steps ahead are dropped, the live clocks go back to r and
  // the exchange starts over from r.
  void RollBack(int64_t r, int64_t undone);
  // Removes and returns the attempt planned ahead for `step`, or null.
  std::unique_ptr<Attempt> TakeAhead(int64_t step);
  // Ends the protocol with its job: drops the steps ahead and the updates.
  void End();
  // Empties every part's outbox and sets every mark to (clock, -1).
  void ResetExchange(int64_t clock);

  // --- the update exchange (update_exchange.cc) ---
  // The size of an update in the exchange that is not `size` bytes (the
  // nodes run different models), or 0.
  size_t OtherUpdateSize(size_t size) const;
  // Part `me` hands in its update of `key`.
  void HandIn(int me, Key key, std::string payload, uint32_t crc32c);
  // The live parts other than `me` that have not handed in `due` yet,
  // described for an error ("node (at step s round r)").
  std::vector<std::string> Missing(int me, Key due,
                                   const std::vector<Job::Part>& parts) const;
  // What part `me` has not received, up to `key` (adding the bytes to
  // `bytes`); drops updates every other live part has received.
  std::vector<ReceivedUpdate> Deliver(int me, Key key,
                                      const std::vector<Job::Part>& parts,
                                      int64_t& bytes);

  ClockSkewGate gate;
  std::map<int64_t, std::unique_ptr<Attempt>> ahead;
  std::vector<std::deque<Update>> outbox;       // per part, increasing keys
  std::vector<Key> handed_in;                   // per part: its last key
  std::vector<std::vector<Key>> delivered;      // [receiver][sender]: last key
  std::map<std::string, uint32_t> weights_crc;  // super node -> last sync
  // Roll-backs (RollBackSkewedLocked): the epoch counts them,
  // `rollback_step` is the sync step the current epoch started after (-1:
  // none yet); `last_sync` is the last committed weight sync, with the
  // prompt groups of the steps committed since and the totals at it;
  // `steps_rolled_back` counts committed steps run again.
  int epoch = 0;
  int64_t rollback_step = -1;
  int64_t last_sync = 0;
  std::vector<uint64_t> groups_since_sync;
  int64_t tokens_at_sync = 0;
  double last_eval_at_sync = 0;
  int64_t steps_rolled_back = 0;
};

// Flushes the manager's output queue when it goes out of scope. Declare it
// BEFORE the MutexLock of a call, so that it runs after the lock is
// released:
//   FlushOnExit flush(*this);
//   absl::MutexLock lock(&mu_);
class JobManager::FlushOnExit {
 public:
  explicit FlushOnExit(JobManager& m) : m_(m) {}
  FlushOnExit(const FlushOnExit&) = delete;
  FlushOnExit& operator=(const FlushOnExit&) = delete;
  ~FlushOnExit() { m_.FlushOutputs(); }

 private:
  JobManager& m_;
};

// The longest a long poll (GetAssignment, GetStepPlan) may wait.
inline constexpr absl::Duration kMaxPollWait = absl::Seconds(60);

// InvalidArgument unless 0 <= wait <= kMaxPollWait.
absl::Status CheckPollWait(absl::Duration wait);

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_JOB_STATE_H_
