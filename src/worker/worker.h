// Worker: the agent that owns one machine's cards (`fusionrl worker`).
//
// It registers its cards with the controller, heartbeats on its own thread
// (reporting each card's role and busy fraction), and runs the jobs the
// controller assigns (node_job.h: one CardRunner thread per card,
// data-parallel inside the node through c10d Gloo, across nodes through the
// controller's WorkService; proto/fusionrl/v1/work.proto has the message
// flow of one step). A step
// that the controller aborts (a peer node was lost) is rolled back to the
// state the cards had at its start and run again as the controller replans
// it.
//
// The same class runs inside `fusionrl run` (one Worker per super node, on
// an in-process channel).
#ifndef FUSIONRL_WORKER_WORKER_H_
#define FUSIONRL_WORKER_WORKER_H_

#include <grpcpp/channel.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "worker/work_client.h"

namespace fusionrl {

struct WorkerOptions {
  std::string super_node = "sn-0";  // [A-Za-z0-9._-]{1,64}
  std::string host;                 // "" = this machine's host name
  int cards = 1;                    // logical cards (CPU) or GPUs offered
  std::string device = "cpu";       // card device type: cpu | cuda
  std::string auth_token;           // "" = none
  // LibTorch intra-op threads this worker's cards share; 0 = the job's
  // num_threads. Set it when several workers share one machine (the
  // embedded run gives each of its S workers num_threads / S), so the
  // machine is not oversubscribed.
  int threads = 0;
  // Deadline of ordinary calls (register, heartbeat, ...).
  absl::Duration rpc_timeout = absl::Seconds(30);
  // How long to keep retrying the first registration while the controller
  // is not up yet.
  absl::Duration connect_timeout = absl::Seconds(60);
  // How long a call that finds the controller gone keeps retrying before
  // the worker gives up on its job: a controller restarted with
  // --state-dir within it continues the job with this worker.
  absl::Duration reconnect_timeout = absl::Seconds(60);
  // How long one assignment poll waits; short in-process so a stop is
  // noticed quickly.
  absl::Duration poll_interval = absl::Seconds(2);
  // Fault injection for tests: sleep this long after every trained step
  // (a slow super node).
  absl::Duration debug_step_delay = absl::ZeroDuration();
  // Fault injection for tests: pause this long inside every checkpoint
  // write, when its files are written and before it is moved into place
  // (a SIGKILL then lands mid-write).
  absl::Duration debug_checkpoint_delay = absl::ZeroDuration();
  // Time source of the worker's deadlines (borrowed; tests pass a fake).
  const Clock* clock = &RealClock();
  // What the cards ask of the controller (borrowed; must outlive the
  // worker). Null: the WorkService and WeightService over `channel`.
  // `fusionrl run` passes an InProcessWorkClient (no serialisation).
  WorkClient* work_client = nullptr;
  // Jobs this worker is running now (borrowed; may be null): incremented
  // before a job starts on the node, decremented when all its cards are
  // done, including their end-of-job writes. An embedding process that
  // stops its workers once the controller says the job ended waits for
  // this to reach 0 first (Job::Start does).
  std::atomic<int>* running_jobs = nullptr;
};

class Worker {
 public:
  Worker(std::shared_ptr<grpc::Channel> channel, WorkerOptions options);
  ~Worker();

  // Registers, heartbeats and runs assigned jobs until `stop` becomes true
  // (checked between steps), the controller orders a shutdown, or the
  // worker is declared lost. Deregisters on the way out. A job that fails
  // on this node is reported to the controller (the job fails), and the
  // worker goes on serving.
  absl::Status Run(const std::atomic<bool>* stop);

  // Implementation detail (worker.cc), public so its helpers can name it.
  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_WORKER_H_
