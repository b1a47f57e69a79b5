// InProcessWorkClient: WorkClient calling the controller's JobManager and
// WeightStore directly, for workers that run in the controller's process
// (`fusionrl run`). No serialisation, no channel: the plain structs of
// core/step_protocol.h go to JobManager's typed entry points as they are,
// and the lead's typed metrics are formatted to JSON once, by the
// controller, when it writes metrics.jsonl.
//
// Errors keep the manager's codes and are named like GrpcWorkClient's
// ("GetStepPlan(step 3): ..."), so a job fails with the same message
// whichever client its cards use. The weight calls go to the store the
// WeightService serves (Controller::weights()); unlike the service, they
// have no message-size limit.
//
// Ownership: borrows `jobs` and `weights`; both must outlive the client.
// Thread safety: thread-safe (the manager and the store are).
#ifndef FUSIONRL_LOCAL_IN_PROCESS_WORK_CLIENT_H_
#define FUSIONRL_LOCAL_IN_PROCESS_WORK_CLIENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "worker/work_client.h"

namespace fusionrl {

class JobManager;
class WeightStore;

class InProcessWorkClient final : public WorkClient {
 public:
  InProcessWorkClient(JobManager& jobs, WeightStore& weights);

  absl::StatusOr<Assignment> GetAssignment(const std::string& node_id,
                                           absl::Duration wait) override;
  absl::StatusOr<StepPlan> GetStepPlan(const std::string& job_id,
                                       const std::string& node_id,
                                       int local_rank, int64_t step,
                                       absl::Duration wait) override;
  absl::StatusOr<std::string> Reduce(ReduceCall call,
                                     absl::Duration timeout) override;
  absl::StatusOr<bool> FinishStep(const StepReport& report,
                                  absl::Duration timeout) override;
  absl::StatusOr<std::vector<ReceivedUpdate>> ExchangeUpdates(
      UpdateCall call, absl::Duration timeout) override;
  absl::Status PublishWeights(const std::string& key, int64_t step,
                              const std::string& super_node,
                              const std::string& blob,
                              absl::Duration timeout) override;
  absl::StatusOr<std::string> FetchWeights(const std::string& key, int64_t step,
                                           absl::Duration timeout) override;
  absl::StatusOr<StoreReply> Store(const StoreCall& call,
                                   absl::Duration timeout) override;

 private:
  JobManager& jobs_;
  WeightStore& weights_;
};

}  // namespace fusionrl

#endif  // FUSIONRL_LOCAL_IN_PROCESS_WORK_CLIENT_H_
