#include "controller/outputs/rpc_stats.h"

#include <grpcpp/support/server_interceptor.h>

#include <algorithm>

namespace fusionrl {
namespace {

using grpc::experimental::InterceptionHookPoints;

class StatsInterceptor final : public grpc::experimental::Interceptor {
 public:
  StatsInterceptor(RpcStats& stats, const char* method)
      : stats_(stats),
        method_(method == nullptr ? "" : method),
        start_(absl::Now()) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      stats_.Record(method_, methods->GetSendStatus().error_code(),
                    absl::Now() - start_);
    }
    methods->Proceed();
  }

 private:
  RpcStats& stats_;
  std::string method_;
  absl::Time start_;
};

class StatsFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit StatsFactory(RpcStats& stats) : stats_(stats) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new StatsInterceptor(stats_, info->method());
  }

 private:
  RpcStats& stats_;
};

}  // namespace

void RpcStats::Record(const std::string& method, int grpc_code,
                      absl::Duration latency) {
  const double seconds = absl::ToDoubleSeconds(latency);
  const size_t bucket = std::lower_bound(kLatencyBuckets.begin(),
                                         kLatencyBuckets.end(), seconds) -
                        kLatencyBuckets.begin();
  absl::MutexLock lock(&mu_);
  Method& m = methods_[method];
  ++m.calls_by_code[GrpcCodeName(grpc_code)];
  ++m.buckets[bucket];
  ++m.count;
  m.latency_sum_seconds += seconds;
}

RpcStats::Snapshot RpcStats::Get() const {
  absl::MutexLock lock(&mu_);
  return methods_;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RpcStats::MakeInterceptorFactory(RpcStats& stats) {
  return std::make_unique<StatsFactory>(stats);
}

const char* GrpcCodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(std::size(kNames))) {
    return kNames[code];
  }
  return "UNKNOWN_CODE";
}

}  // namespace fusionrl
