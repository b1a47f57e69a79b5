// GrpcWorkClient: WorkClient over the controller's WorkService and
// WeightService (proto/fusionrl/v1/work.proto, weight.proto). The only
// place in the worker where the card loop's plain structs meet wire types.
//
// Every call carries a deadline (the call's wait or timeout plus
// `rpc_timeout`) and the shared token when one is set; errors keep the
// server's code and name the call: "GetStepPlan(step 3): ...".
#ifndef FUSIONRL_WORKER_GRPC_WORK_CLIENT_H_
#define FUSIONRL_WORKER_GRPC_WORK_CLIENT_H_

#include <grpcpp/channel.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "fusionrl/v1/weight.grpc.pb.h"
#include "fusionrl/v1/work.grpc.pb.h"
#include "worker/work_client.h"

namespace fusionrl {

class GrpcWorkClient final : public WorkClient {
 public:
  // `reconnect_timeout`: how long a call that finds the controller
  // unreachable (UNAVAILABLE) keeps retrying, with backoff, before it
  // fails: a restarted controller (`--state-dir`) is back within it.
  GrpcWorkClient(const std::shared_ptr<grpc::Channel>& channel,
                 std::string auth_token, absl::Duration rpc_timeout,
                 absl::Duration reconnect_timeout = absl::ZeroDuration());

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
  // Runs `call` (one RPC on a fresh context) again while it returns
  // UNAVAILABLE, for up to reconnect_timeout_.
  template <typename Call>
  grpc::Status WithReconnect(const char* what, Call call) const;

  std::unique_ptr<v1::WorkService::Stub> work_;
  std::unique_ptr<v1::WeightService::Stub> weight_;
  const std::string auth_token_;
  const absl::Duration rpc_timeout_;
  const absl::Duration reconnect_timeout_;
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_GRPC_WORK_CLIENT_H_
