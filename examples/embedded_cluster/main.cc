// A pipeline that runs its own FusionRL cluster: a controller (with the
// dashboard and Prometheus /metrics) and two workers, one per super node,
// in this process; submits a StaleSync job to it and keeps doing its own
// work while the job trains, checking on it through the Job handle.
//
//   embedded_cluster OUTPUT_DIR [STEPS]
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "fusionrl/cluster.h"
#include "fusionrl/config.h"
#include "fusionrl/job.h"
#include "fusionrl/version.h"

namespace {

constexpr char kJob[] = R"yaml(
name: embedded-cluster-example
num_threads: 1
model: {d_model: 32, n_layers: 2, n_heads: 4, d_ff: 64, max_seq_len: 32}
task: {name: reverse, min_digits: 1, max_digits: 3, eval_size: 20}
rollout: {prompts_per_step: 8, group_size: 4, max_new_tokens: 5}
optim: {lr: 1.0e-3, warmup_steps: 2}
placement: {super_nodes: 2, cards_per_super_node: 1}
stalesync: {max_clock_skew: 1}
run: {total_steps: 6, eval_every: 3, checkpoint_every: 3}
)yaml";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: embedded_cluster OUTPUT_DIR [STEPS]\n";
    return 2;
  }
  std::cout << "FusionRL " << FUSIONRL_VERSION << "\n";
  fusionrl::ControllerServerOptions copts;  // 127.0.0.1, any free port
  copts.http_address = "127.0.0.1:0";
  auto controller = fusionrl::ControllerServer::Start(copts);
  if (!controller.ok()) {
    std::cerr << controller.status().message() << "\n";
    return 1;
  }
  const std::string address = (*controller)->address();
  std::cout << "controller on " << address << ", dashboard on http://"
            << (*controller)->http_address() << "/\n";

  std::vector<std::unique_ptr<fusionrl::WorkerAgent>> workers;
  for (const char* super_node : {"sn-0", "sn-1"}) {
    fusionrl::WorkerAgentOptions w;
    w.controller_address = address;
    w.super_node = super_node;
    w.threads = 1;
    auto worker = fusionrl::WorkerAgent::Start(w);
    if (!worker.ok()) {
      std::cerr << worker.status().message() << "\n";
      return 1;
    }
    workers.push_back(*std::move(worker));
  }

  std::vector<std::string> overrides = {std::string("output_dir=") + argv[1]};
  if (argc > 2) overrides.push_back(std::string("run.total_steps=") + argv[2]);
  auto config =
      fusionrl::ParseJobConfig(kJob, "embedded_cluster/main.cc", overrides);
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 2;
  }
  // The job waits in PENDING until both workers have registered.
  auto job = fusionrl::Job::Submit(address, *config);
  if (!job.ok()) {
    std::cerr << job.status().message() << "\n";
    return 1;
  }
  std::cout << "submitted " << (*job)->id() << "\n";

  // The pipeline's own work goes on; it looks at the job now and then.
  int64_t shown = -1;
  for (;;) {
    auto done = (*job)->Wait(absl::Milliseconds(500));
    if (done.ok() ||
        done.status().code() != absl::StatusCode::kDeadlineExceeded) {
      break;
    }
    fusionrl::JobProgress p = (*job)->Progress();
    if (p.step != shown) {
      shown = p.step;
      std::cout << "  " << fusionrl::JobPhaseName(p.phase) << ": step "
                << p.step << "/" << p.total_steps << ", reward "
                << p.reward_mean << ", " << p.tokens_per_second << " tok/s\n";
    }
  }
  absl::StatusOr<fusionrl::JobSummary> summary = (*job)->Wait();
  if (!summary.ok()) {
    std::cerr << "job failed: " << summary.status().message() << "\n";
    return 1;
  }
  // One write: the workers' log lines go to the same stdout meanwhile.
  std::ostringstream done;
  done << "done: " << summary->steps << " steps, largest clock skew "
       << summary->max_clock_skew_seen << ", eval accuracy "
       << summary->initial_eval_accuracy << " -> "
       << summary->final_eval_accuracy << "\n";
  std::cout << done.str() << std::flush;
  for (auto& w : workers) {
    if (absl::Status s = w->Stop(); !s.ok()) {
      std::cerr << "worker: " << s.message() << "\n";
    }
  }
  (*controller)->Shutdown();
  return summary->steps == config->run.total_steps ? 0 : 1;
}
