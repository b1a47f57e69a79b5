// GroupLedger: the controller's accounting of one job's prompt groups, so
// that every group is trained on exactly once even when nodes are lost.
//
// Groups are numbered 0..total-1 (the task's TrainProblem indices). A group
// is pending, then assigned to one node, then trained. When a node is lost
// its assigned groups go back to the front of the pending queue (re-queued)
// and any later report from that node for them is refused, so a group can
// never be counted twice; trained groups stay trained unless the steps that
// trained them are rolled back (Reclaim).
//
// Invariant, after every call: pending + assigned + trained == total.
//
// Thread safety: not thread-safe. It belongs to the controller's state
// machine, which runs on one thread.
#ifndef FUSIONRL_CONTROLLER_GROUP_LEDGER_H_
#define FUSIONRL_CONTROLLER_GROUP_LEDGER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fusionrl {

class GroupLedger {
 public:
  explicit GroupLedger(uint64_t total_groups);

  // Assigns up to `max_groups` pending groups to `node_id`: re-queued groups
  // first (oldest first), then new ones in index order. May return fewer
  // (or none) when little is pending.
  std::vector<uint64_t> Assign(const std::string& node_id, int max_groups);

  // Records that `node_id` trained on `groups`. FailedPrecondition (naming
  // the first offending group) if any of them is not currently assigned to
  // that node, e.g. because the node was declared lost and the group was
  // re-queued; then nothing is recorded.
  absl::Status MarkTrained(const std::string& node_id,
                           const std::vector<uint64_t>& groups);

  // Returns every group assigned to `node_id` to the pending queue; returns
  // how many. Call when the node is lost or leaves.
  int64_t Requeue(const std::string& node_id);

  // Returns `groups` (each assigned to some node or trained) to the front
  // of the pending queue, in the given order, ahead of groups re-queued
  // before: the steps they belonged to are run again (a StaleSync job
  // rolled back to its last weight sync). FailedPrecondition, naming the
  // first offending group, if one is pending, unknown or listed twice; then
  // nothing changes.
  absl::Status Reclaim(const std::vector<uint64_t>& groups);

  uint64_t total() const { return total_; }
  uint64_t pending() const { return requeued_.size() + (total_ - next_new_); }
  uint64_t assigned() const { return owner_.size(); }
  uint64_t trained() const { return trained_; }
  uint64_t requeued_total() const { return requeued_total_; }
  bool done() const { return trained_ == total_; }

  std::string DebugString() const;

  // The whole ledger as plain data, and back (a restarted controller's
  // journal, controller/controller_state.h).
  struct Saved {
    uint64_t total = 0;
    uint64_t next_new = 0;
    uint64_t requeued_total = 0;
    std::vector<uint64_t> requeued;                          // in order
    std::vector<std::pair<uint64_t, uint64_t>> trained;      // [begin, end)
    std::vector<std::pair<uint64_t, std::string>> assigned;  // group, node
  };
  Saved Save() const;
  // InvalidArgument, naming the problem, unless every group below
  // `next_new` is exactly one of trained, assigned or re-queued and none
  // at or above it is any.
  static absl::StatusOr<std::unique_ptr<GroupLedger>> Load(const Saved& saved);

 private:
  uint64_t total_;
  uint64_t next_new_ = 0;          // first group never handed out
  std::deque<uint64_t> requeued_;  // handed out before, now pending again
  absl::flat_hash_map<uint64_t, std::string> owner_;  // assigned -> node
  absl::flat_hash_set<uint64_t> trained_ids_;
  uint64_t trained_ = 0;
  uint64_t requeued_total_ = 0;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_GROUP_LEDGER_H_
