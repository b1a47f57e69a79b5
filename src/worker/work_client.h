// WorkClient: what a card asks of the controller, without wire types.
//
// The card loop (CardRunner, PlanRendezvous, the node job) talks to the
// controller only through this interface. Three implementations:
//   * GrpcWorkClient (grpc_work_client.h): the WorkService and WeightService
//     over a channel, used by `fusionrl worker`;
//   * InProcessWorkClient (in_process_work_client.h): the controller's
//     JobManager and WeightStore called directly, used by `fusionrl run`;
//   * FakeWorkClient (fake_work_client.h): a scripted one-node controller
//     for unit tests of the card loop, with fault switches (errors, delays,
//     aborted attempts) in the spirit of c10d's FakeProcessGroup.
// Protobuf messages stay inside the adapters: everything here is a plain
// struct.
//
// The plain types of the step protocol are in core/step_protocol.h.
//
// Thread safety: implementations must be safe to call from every card
// thread of a node at once.
#ifndef FUSIONRL_WORKER_WORK_CLIENT_H_
#define FUSIONRL_WORKER_WORK_CLIENT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/step_protocol.h"

namespace fusionrl {

class WorkClient {
 public:
  virtual ~WorkClient() = default;

  // The next job for `node_id`, waiting up to `wait` (empty job_id: none).
  virtual absl::StatusOr<Assignment> GetAssignment(const std::string& node_id,
                                                   absl::Duration wait) = 0;
  // The plan of `step` for card `local_rank` of `node_id`; may wait up to
  // `wait` for the controller to plan it (kWait after that).
  virtual absl::StatusOr<StepPlan> GetStepPlan(const std::string& job_id,
                                               const std::string& node_id,
                                               int local_rank, int64_t step,
                                               absl::Duration wait) = 0;
  // The sum of `call.payload` over the attempt's nodes, in node order.
  // ABORTED: the attempt was abandoned (a node was lost).
  virtual absl::StatusOr<std::string> Reduce(ReduceCall call,
                                             absl::Duration timeout) = 0;
  // Reports the end of an attempt; true when the step committed.
  virtual absl::StatusOr<bool> FinishStep(const StepReport& report,
                                          absl::Duration timeout) = 0;
  // StaleSync: hands over this node's update and returns the other nodes'
  // updates that are due, oldest first per node.
  virtual absl::StatusOr<std::vector<ReceivedUpdate>> ExchangeUpdates(
      UpdateCall call, absl::Duration timeout) = 0;
  // Weight sync between super nodes after a sync_weights step: the lead
  // publishes its state as version `step` under `key`; the others fetch it
  // (NOT_FOUND while it is not there yet).
  virtual absl::Status PublishWeights(const std::string& key, int64_t step,
                                      const std::string& super_node,
                                      const std::string& blob,
                                      absl::Duration timeout) = 0;
  virtual absl::StatusOr<std::string> FetchWeights(const std::string& key,
                                                   int64_t step,
                                                   absl::Duration timeout) = 0;
  // The c10d data plane's rendezvous: one store operation on the job's
  // generation `call.generation` (ABORTED once it is over).
  virtual absl::StatusOr<StoreReply> Store(const StoreCall& call,
                                           absl::Duration timeout) = 0;
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_WORK_CLIENT_H_
