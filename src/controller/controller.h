// Controller: the process that owns jobs and the cluster. One gRPC server
// with JobService (users), NodeService and WorkService (workers),
// WeightService (versioned weights), grpc.health.v1 and server reflection.
//
// The same object serves a cluster (`fusionrl controller --listen
// HOST:PORT`) and the embedded default (`fusionrl run`, which talks to it
// through InProcessChannel()), so the one-machine path is the cluster path.
//
// A sweeper thread declares silent workers lost (NodeRegistry::SweepLost)
// and hands them to the JobManager, which re-queues their prompt groups, and
// places waiting jobs.
#ifndef FUSIONRL_CONTROLLER_CONTROLLER_H_
#define FUSIONRL_CONTROLLER_CONTROLLER_H_

#include <grpcpp/channel.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/job_manager.h"
#include "controller/outputs/rpc_stats.h"
#include "core/clock.h"
#include "fusionrl/v1/job.pb.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace fusionrl {

class ControllerState;
class HttpServer;

class WeightStore;

struct ControllerOptions {
  // "host:port" to listen on (port 0 picks a free one, see port()); "" serves
  // only InProcessChannel().
  std::string listen_address;
  // Shared token every RPC must carry (rpc/auth.h); "" = none.
  std::string auth_token;
  // TLS: PEM files of the server certificate chain and private key (both or
  // neither). Without them the port speaks plain text.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Workers heartbeat every interval; a worker silent for the timeout is
  // lost.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // Largest message either way (a Reduce round carries a node's summed
  // gradients).
  int max_message_bytes = 1 << 30;
  // Keep what the controller must not forget (nodes, jobs, their ledgers
  // and committed steps) in this directory and restore it at start
  // (controller/controller_state.h); "" = in memory only.
  std::string state_dir;
  // The watchdog: a running job with no step committed for this long gets
  // an event naming what each of its cards is doing, and its step is
  // replanned (or the job fails, with `stall_fails`). Zero: off (the
  // default here; `fusionrl controller` turns it on, 30 min).
  absl::Duration stall_timeout = absl::ZeroDuration();
  bool stall_fails = false;
  // "host:port" of the dashboard, /api/status and /metrics
  // (controller/outputs/http_server.h; port 0 picks a free one, see
  // http_port());
  // "" = no HTTP server. The same auth_token protects it.
  std::string http_address;
  // The time source of the controller's registry, jobs, weight store and
  // status (borrowed; it must outlive the controller). Null: RealClock().
  const Clock* clock = nullptr;
};

class Controller {
 public:
  // Builds and starts the server. InvalidArgument for bad options;
  // Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Controller>> Start(
      const ControllerOptions& options);
  // Shutdown().
  ~Controller();

  // The bound port (0 when serving in-process only).
  int port() const { return port_; }
  // The HTTP port (0 without http_address).
  int http_port() const;
  // What GetClusterStatus answers: every node, every job, the version and
  // uptime.
  v1::ClusterStatus ClusterStatus() const;
  // A channel to this server that never leaves the process.
  std::shared_ptr<grpc::Channel> InProcessChannel();
  JobManager& jobs() { return *jobs_; }
  NodeRegistry& registry() { return *registry_; }
  // The versioned weights the WeightService serves (in-process callers
  // publish and fetch here directly).
  WeightStore& weights();

  // Graceful stop: every running job ends after its current step with a
  // checkpoint (CANCELLED, resumable); waits up to `grace` for that, then
  // tells workers to exit through their heartbeat replies and gives them a
  // few heartbeats to go.
  void Drain(absl::Duration grace);
  // Stops the server and the sweeper (idempotent).
  void Shutdown();

 private:
  explicit Controller(const ControllerOptions& options);
  // The steps of Start(), in order: the node registry, job manager and
  // persisted state; the gRPC services; the gRPC server; the HTTP server
  // (when options_.http_address is set; on failure it stops the gRPC
  // server).
  absl::Status OpenManagers();
  void MakeServices();
  absl::Status StartGrpcServer();
  absl::Status StartHttpServer();
  void SweepLoop();
  // Waits one sweep period on the jobs' clock; false once Shutdown() began.
  bool WaitSweepTick(absl::Duration period) ABSL_LOCKS_EXCLUDED(sweeper_mu_);

  ControllerOptions options_;
  const Clock& clock_;  // options_.clock or RealClock()
  std::unique_ptr<NodeRegistry> registry_;
  std::unique_ptr<JobManager> jobs_;
  // After jobs_: it goes first and unhooks itself from the manager.
  std::unique_ptr<ControllerState> state_;
  // Before the server: its interceptors record here until the server is
  // gone (members are destroyed in reverse order).
  RpcStats rpc_stats_;
  struct Services;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  // After jobs_ and registry_, which its handlers read; stopped first.
  std::unique_ptr<HttpServer> http_;
  absl::Time started_;
  std::atomic<bool> workers_shutdown_{false};
  absl::Mutex sweeper_mu_;
  absl::CondVar sweeper_cv_;
  bool stop_sweeper_ ABSL_GUARDED_BY(sweeper_mu_) = false;
  std::thread sweeper_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_CONTROLLER_H_
