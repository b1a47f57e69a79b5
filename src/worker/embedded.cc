// The embedded default: `fusionrl run` (RunRlJob) starts a controller and
// one worker per super node in this process and drives the job through the
// same JobManager a cluster uses: jobs, registration and heartbeats over an
// in-process channel, the cards' step protocol through an
// InProcessWorkClient (plain structs, no serialisation).
#include <grpcpp/client_context.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/controller.h"
#include "core/job_summary.h"
#include "core/status_macros.h"
#include "fusionrl/config.h"
#include "fusionrl/job.h"
#include "fusionrl/task.h"
#include "fusionrl/v1/job.grpc.pb.h"
#include "rpc/status_convert.h"
#include "spdlog/spdlog.h"
#include "worker/in_process_work_client.h"
#include "worker/worker.h"

namespace fusionrl {

absl::StatusOr<JobSummary> RunRlJob(const JobConfig& config,
                                    const RunOptions& options) {
  FUSIONRL_RETURN_IF_ERROR(ValidateJobConfig(config));
  {
    // Bad input fails here, before anything is started or written: the task
    // and reward must exist in this process's registries.
    FUSIONRL_ASSIGN_OR_RETURN(std::unique_ptr<Task> task,
                              TaskRegistry::Global().Create(config.task));
    const std::string reward = config.task.reward.empty()
                                   ? task->default_reward()
                                   : config.task.reward;
    FUSIONRL_RETURN_IF_ERROR(RewardRegistry::Global().Create(reward).status());
  }
  ControllerOptions copts;  // in-process only
  copts.heartbeat_interval = absl::Seconds(1);
  copts.heartbeat_timeout = absl::Seconds(30);
  FUSIONRL_ASSIGN_OR_RETURN(std::unique_ptr<Controller> controller,
                            Controller::Start(copts));
  std::shared_ptr<grpc::Channel> channel = controller->InProcessChannel();
  // The cards' step protocol goes straight to the manager (no
  // serialisation); registration and heartbeats use the channel, as a
  // cluster's workers do.
  InProcessWorkClient work(controller->jobs(), controller->weights());
  auto jobs = v1::JobService::NewStub(channel);

  std::atomic<bool> stop_workers{false};
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::thread> threads;
  std::vector<absl::Status> worker_status(config.placement.super_nodes);
  for (int i = 0; i < config.placement.super_nodes; ++i) {
    WorkerOptions wopts;
    wopts.super_node = absl::StrCat("local-", i);
    wopts.host = "in-process";
    wopts.cards = config.placement.cards_per_super_node;
    wopts.device = config.device.rfind("cuda", 0) == 0 ? "cuda" : "cpu";
    wopts.poll_interval = absl::Milliseconds(200);
    wopts.work_client = &work;
    // The in-process workers share the job's threads.
    wopts.threads =
        std::max(1, config.num_threads / config.placement.super_nodes);
    workers.push_back(std::make_unique<Worker>(channel, wopts));
    Worker* w = workers.back().get();
    threads.emplace_back([w, &stop_workers, &worker_status, i] {
      worker_status[i] = w->Run(&stop_workers);
    });
  }

  // Submit once the workers are in, so the job is placed at once.
  const absl::Time registered_by = absl::Now() + absl::Seconds(30);
  while (controller->registry().alive_count() < config.placement.super_nodes &&
         absl::Now() < registered_by) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  v1::SubmitJobRequest submit;
  submit.set_config_yaml(JobConfigToYaml(config));
  submit.set_source_name(config.source_path.empty() ? config.name
                                                    : config.source_path);
  submit.set_resume(options.resume);
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    grpc::Status st = jobs->SubmitJob(&ctx, submit, &submitted);
    if (!st.ok()) {
      stop_workers = true;
      for (auto& t : threads) t.join();
      return rpc::FromGrpcStatus(st);
    }
  }

  if (options.stop_requested != nullptr) {
    FUSIONRL_RETURN_IF_ERROR(controller->jobs().SetStopFlag(
        submitted.job_id(), options.stop_requested));
  }
  // Follow the job; a stop request also goes out as a graceful cancel (for
  // a job still waiting to start).
  absl::StatusOr<JobSummary> result =
      absl::InternalError("the job did not finish");
  bool cancel_sent = false;
  bool running = false;
  for (;;) {
    // A stop is passed on once the job runs: like a single process, the
    // job then ends after its current step with a checkpoint.
    if (!cancel_sent && running && options.stop_requested != nullptr &&
        options.stop_requested->load()) {
      v1::CancelJobRequest cancel;
      cancel.set_job_id(submitted.job_id());
      cancel.set_reason("interrupted");
      v1::JobStatus ignored;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
      jobs->CancelJob(&ctx, cancel, &ignored);
      cancel_sent = true;
    }
    v1::GetJobStatusRequest request;
    request.set_job_id(submitted.job_id());
    v1::JobStatus status;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    grpc::Status st = jobs->GetJobStatus(&ctx, request, &status);
    if (!st.ok()) {
      result = rpc::FromGrpcStatus(st);
      break;
    }
    running = status.phase() == v1::JOB_PHASE_RUNNING;
    if (status.phase() == v1::JOB_PHASE_SUCCEEDED ||
        status.phase() == v1::JOB_PHASE_CANCELLED) {
      result = ParseSummary(status.summary_json());
      if (result.ok()) {
        result->summary_path = config.output_dir + "/summary.json";
      }
      break;
    }
    if (status.phase() == v1::JOB_PHASE_FAILED) {
      result =
          absl::Status(status.error_code() != 0
                           ? static_cast<absl::StatusCode>(status.error_code())
                           : absl::StatusCode::kUnknown,
                       status.message());
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  stop_workers = true;
  for (auto& t : threads) t.join();
  controller->Shutdown();
  return result;
}

}  // namespace fusionrl
