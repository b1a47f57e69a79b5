// RpcStats: what the controller's gRPC server has answered, per method and
// status code, with a latency histogram per method (for /metrics).
//
// MakeInterceptorFactory() returns the server interceptor that feeds it
// (grpc::experimental, gRPC 1.51): it stamps each call when the server
// creates its interceptor (the call arrived) and records the call when its
// status is sent, so a long poll counts the time it waited. Calls that
// never send a status (cancelled by the client mid-stream) are not counted.
// Thread-safe; the server's threads record concurrently.
#ifndef FUSIONRL_CONTROLLER_OUTPUTS_RPC_STATS_H_
#define FUSIONRL_CONTROLLER_OUTPUTS_RPC_STATS_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc::experimental {
class ServerInterceptorFactoryInterface;
}  // namespace grpc::experimental

namespace fusionrl {

class RpcStats {
 public:
  // Upper bounds of the latency buckets, in seconds (Prometheus `le`); the
  // last bucket (+Inf) is implied.
  static constexpr std::array<double, 12> kLatencyBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30};

  struct Method {
    std::map<std::string, int64_t> calls_by_code;  // "OK", "UNAVAILABLE", ...
    std::array<int64_t, kLatencyBuckets.size() + 1>
        buckets{};  // not cumulative
    int64_t count = 0;
    double latency_sum_seconds = 0;
  };
  // Method name ("/fusionrl.v1.WorkService/Reduce") -> its figures.
  using Snapshot = std::map<std::string, Method>;

  void Record(const std::string& method, int grpc_code, absl::Duration latency)
      ABSL_LOCKS_EXCLUDED(mu_);
  Snapshot Get() const ABSL_LOCKS_EXCLUDED(mu_);

  // The interceptor factory for ServerBuilder::experimental()
  // .SetInterceptorCreators; it records into `stats` (borrowed, must outlive
  // the server).
  static std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  MakeInterceptorFactory(RpcStats& stats);

 private:
  mutable absl::Mutex mu_;
  Snapshot methods_ ABSL_GUARDED_BY(mu_);
};

// "OK", "CANCELLED", ... for a grpc::StatusCode value ("UNKNOWN_CODE" for
// one outside 0..16).
const char* GrpcCodeName(int code);

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_OUTPUTS_RPC_STATS_H_
