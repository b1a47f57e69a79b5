// The controller's HTTP endpoints (`fusionrl controller --http HOST:PORT`):
//   /            the dashboard (controller/outputs/dashboard.html,
//   self-contained) /api/status  the cluster, its jobs and their curves as JSON
//   /metrics     Prometheus text format (controller/outputs/status_export.h)
//   /healthz     "ok"
// Served by cpp-httplib (Debian's libcpp-httplib-dev) on a small thread
// pool of its own, read-only: nothing here changes a job.
//
// With a shared token set, every path but /healthz needs it, as
// "Authorization: Bearer <token>" or, for a browser, "?token=<token>" in the
// URL (the dashboard forwards it to its fetches); otherwise 401. The token
// travels in clear text: on an untrusted network put the port behind TLS.
#ifndef FUSIONRL_CONTROLLER_OUTPUTS_HTTP_SERVER_H_
#define FUSIONRL_CONTROLLER_OUTPUTS_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "controller/outputs/rpc_stats.h"
#include "fusionrl/v1/job.pb.h"

namespace fusionrl {

struct HttpSources {
  std::function<v1::ClusterStatus()> cluster;
  std::function<absl::StatusOr<v1::JobHistory>(const std::string& job_id,
                                               int64_t after_seq)>
      history;
  std::function<RpcStats::Snapshot()> rpc;
  std::string grpc_address;  // shown on the dashboard
};

class HttpServer {
 public:
  // Binds `address` ("host:port"; port 0 picks a free one) and serves on
  // its own threads. InvalidArgument for a malformed address, Unavailable
  // when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& address, const std::string& auth_token,
      HttpSources sources);
  // Stop().
  ~HttpServer();

  int port() const;
  // Stops listening and joins the server thread (idempotent).
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The dashboard page (generated from controller/outputs/dashboard.html).
extern const char kDashboardHtml[];

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_OUTPUTS_HTTP_SERVER_H_
