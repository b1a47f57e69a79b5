// NodeJob: one assigned job on one worker node. Parses the job's config,
// checks the assignment against the node's cards, forms the node's c10d
// group over its training cards, and runs one card thread (RunCard) per
// training card in lock-step through a PlanRendezvous. Disaggregated
// rollout cards are served by a rollout thread of each training card they
// feed.
#ifndef FUSIONRL_WORKER_NODE_JOB_H_
#define FUSIONRL_WORKER_NODE_JOB_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "worker/card_counters.h"
#include "worker/work_client.h"

namespace fusionrl {

// What the node lends its jobs (all borrowed).
struct NodeContext {
  WorkClient* client = nullptr;
  std::string node_id;
  std::string super_node;
  std::string device = "cpu";  // cpu | cuda: card i of a cuda node is cuda:i
  int threads = 0;             // 0 = the job's num_threads
  absl::Duration debug_step_delay = absl::ZeroDuration();
  absl::Duration debug_checkpoint_delay = absl::ZeroDuration();
  std::vector<std::unique_ptr<CardCounters>>* cards = nullptr;
  std::function<bool()> stopping;  // the worker is shutting down
  const Clock* clock = &RealClock();
};

// Runs `assignment` to its end on this node. A failure is reported to the
// controller (the job fails) and returned; Cancelled when the worker stops.
absl::Status RunNodeJob(const NodeContext& node, const Assignment& assignment);

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_NODE_JOB_H_
