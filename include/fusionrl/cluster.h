// A FusionRL cluster inside a program: the controller (`fusionrl
// controller`) and workers (`fusionrl worker`) as objects, for pipelines
// that run their own processes. Jobs go to a ControllerServer through
// Job::Submit (fusionrl/job.h), from this process or another.
//
//   auto controller = fusionrl::ControllerServer::Start({});  // 127.0.0.1:0
//   fusionrl::WorkerAgentOptions w;
//   w.controller_address = (*controller)->address();
//   auto worker = fusionrl::WorkerAgent::Start(w);
//   auto job = fusionrl::Job::Submit((*controller)->address(), config);
//
// Workers started here run their cards on threads of this process, so the
// tasks and rewards this process registered are the ones they use.
#ifndef FUSIONRL_CLUSTER_H_
#define FUSIONRL_CLUSTER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fusionrl {

struct ControllerServerOptions {
  // gRPC "host:port"; port 0 picks a free one (see address()).
  std::string listen_address = "127.0.0.1:0";
  // Dashboard, /api/status and /metrics "host:port" ("" = none; port 0
  // picks a free one, see http_address()).
  std::string http_address;
  // Shared token every call (and HTTP request) must carry; "" = none.
  std::string auth_token;
  // Keep jobs and nodes in this directory across a restart ("" = memory).
  std::string state_dir;
  // A worker silent this long is lost and its work re-queued.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(10);
};

// The controller: schedules jobs on the workers that register with it.
class ControllerServer {
 public:
  // Starts serving. InvalidArgument for bad options; Unavailable when an
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<ControllerServer>> Start(
      const ControllerServerOptions& options);

  ControllerServer() = default;
  ControllerServer(const ControllerServer&) = delete;
  ControllerServer& operator=(const ControllerServer&) = delete;
  // Shutdown().
  virtual ~ControllerServer() = default;

  // "host:port" with the bound port, for WorkerAgentOptions and
  // Job::Submit.
  virtual std::string address() const = 0;
  // "host:port" of the HTTP endpoints ("" without them).
  virtual std::string http_address() const = 0;

  // Stops every running job after its current step with a checkpoint
  // (waiting up to `grace`), tells the workers to exit, then stops serving.
  // Idempotent.
  virtual void Shutdown(absl::Duration grace = absl::Seconds(30)) = 0;
};

struct WorkerAgentOptions {
  std::string controller_address;   // "host:port" (required)
  std::string auth_token;           // the controller's token ("" = none)
  std::string super_node = "sn-0";  // [A-Za-z0-9._-]{1,64}
  int cards = 1;                    // logical CPU cards or GPUs offered
  std::string device = "cpu";       // cpu | cuda
  // LibTorch intra-op threads the cards share (0 = the job's num_threads).
  int threads = 0;
};

// A worker: registers its cards and runs what the controller assigns, on
// threads of its own, until Stop().
class WorkerAgent {
 public:
  // Checks the options (InvalidArgument) and starts the worker's thread;
  // registration happens there (it retries for up to 60 s while the
  // controller is not up).
  static absl::StatusOr<std::unique_ptr<WorkerAgent>> Start(
      const WorkerAgentOptions& options);

  WorkerAgent() = default;
  WorkerAgent(const WorkerAgent&) = delete;
  WorkerAgent& operator=(const WorkerAgent&) = delete;
  // Stop().
  virtual ~WorkerAgent() = default;

  // Stops after the current step (a job still running here loses this
  // node: the controller replans or fails it) and deregisters. Returns how
  // the worker ended (OK, or why it could not serve, e.g. the controller
  // was never reached). Idempotent.
  virtual absl::Status Stop() = 0;

  // Whether the worker's thread has ended (it gave up, or the controller
  // told it to exit), without blocking.
  virtual bool Done() const = 0;
};

}  // namespace fusionrl

#endif  // FUSIONRL_CLUSTER_H_
