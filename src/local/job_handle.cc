// Job (include/fusionrl/job.h): a handle on an RL job that follows it from
// a thread of its own, the observer thread. Job::Start brings its own
// controller and workers into this process (the embedded `fusionrl run`:
// registration and heartbeats over an in-process channel, the cards' step
// protocol through an InProcessWorkClient, plain structs); Job::Submit
// follows a job on a controller elsewhere. Either way the handle speaks
// JobService: WatchJob (a status at every change of the job), GetJobHistory
// for the step records observers see, CancelJob to stop.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "controller/controller.h"
#include "core/clock.h"
#include "core/job_summary.h"
#include "core/status_macros.h"
#include "fusionrl/config.h"
#include "fusionrl/job.h"
#include "fusionrl/task.h"
#include "fusionrl/v1/job.grpc.pb.h"
#include "local/in_process_work_client.h"
#include "nlohmann/json.hpp"
#include "rpc/auth.h"
#include "rpc/enum_proto.h"
#include "rpc/status_convert.h"
#include "spdlog/spdlog.h"
#include "worker/worker.h"

namespace fusionrl {
namespace {

constexpr absl::Duration kCallTimeout = absl::Seconds(30);
// How long the handle keeps asking a controller that does not answer
// before it gives the job up (a restarted controller answers within it).
constexpr absl::Duration kUnreachableTimeout = absl::Seconds(90);

bool Terminal(v1::JobPhase phase) {
  return phase == v1::JOB_PHASE_SUCCEEDED || phase == v1::JOB_PHASE_FAILED ||
         phase == v1::JOB_PHASE_CANCELLED;
}

StepMetrics ParseStep(const v1::StepRecord& record) {
  StepMetrics m;
  m.step = record.step();
  m.json = record.metrics_json();
  nlohmann::json j = nlohmann::json::parse(record.metrics_json(), nullptr,
                                           /*allow_exceptions=*/false);
  if (!j.is_object()) return m;
  for (const auto& [key, value] : j.items()) {
    if (value.is_number()) m.fields[key] = value.get<double>();
  }
  auto get = [&m](const char* key) {
    auto it = m.fields.find(key);
    return it == m.fields.end() ? 0.0 : it->second;
  };
  m.policy_version = static_cast<int64_t>(get("policy_version"));
  m.reward_mean = get("reward_mean");
  m.train_accuracy = get("train_accuracy");
  m.tokens_per_second = get("tokens_per_second");
  m.max_staleness = static_cast<int64_t>(get("max_staleness"));
  m.rollout_seconds = get("rollout_seconds");
  m.train_seconds = get("train_seconds");
  m.step_seconds = get("step_seconds");
  m.rollout_tokens = static_cast<int64_t>(get("rollout_tokens"));
  m.loss = get("loss");
  m.kl = get("kl");
  return m;
}

// The controller and workers of Job::Start, in this process.
struct Embedded {
  std::unique_ptr<Controller> controller;
  std::unique_ptr<InProcessWorkClient> work;
  std::atomic<bool> stop_workers{false};
  // Jobs the workers are still running: the controller may report the job
  // ended while a card of another node is still writing its part of the
  // final checkpoint (its rollout prefetch); stopping the workers then would
  // cut that off.
  std::atomic<int> running_jobs{0};
  // How long Stop waits for them: the job's collective timeout, the time
  // any of its cards may be late (a final checkpoint of a large model on a
  // loaded machine takes more than a few seconds).
  absl::Duration grace = absl::Seconds(10);
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::thread> threads;
  std::vector<absl::Status> worker_status;

  void Stop() {
    // A job that ended lets every card finish within moments; a grace
    // period bounds the wait when one cannot (a failed peer, a hang).
    const Clock& clock = RealClock();
    const absl::Time deadline = clock.MonotonicNow() + grace;
    while (running_jobs.load() > 0 && clock.MonotonicNow() < deadline) {
      SleepOnClock(clock, absl::Milliseconds(5));
    }
    stop_workers = true;
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
    if (controller != nullptr) controller->Shutdown();
  }
  ~Embedded() { Stop(); }
};

class JobImpl final : public Job {
 public:
  JobImpl(std::unique_ptr<Embedded> embedded,
          std::unique_ptr<v1::JobService::Stub> stub, std::string job_id,
          std::string output_dir, const RunOptions& options)
      : embedded_(std::move(embedded)),
        stub_(std::move(stub)),
        id_(std::move(job_id)),
        output_dir_(std::move(output_dir)),
        options_(options) {
    progress_.job_id = id_;
    follower_ = std::thread([this] { Follow(); });
  }

  ~JobImpl() override {
    bool done;
    {
      absl::MutexLock lock(&mu_);
      done = done_;
      closing_ = true;
      wake_.SignalAll();
    }
    if (!done) Cancel().IgnoreError();
    if (follower_.joinable()) follower_.join();
  }

  std::string id() const override { return id_; }

  JobProgress Progress() const override {
    absl::MutexLock lock(&mu_);
    return progress_;
  }

  absl::Status Cancel() override {
    v1::CancelJobRequest request;
    request.set_job_id(id_);
    request.set_reason("stopped by the program");
    v1::JobStatus ignored;
    grpc::ClientContext ctx;
    Prepare(ctx);
    grpc::Status st = stub_->CancelJob(&ctx, request, &ignored);
    // FAILED_PRECONDITION: the job already ended (CancelJob's one use of
    // it), e.g. right after an earlier Cancel(): nothing left to stop, and
    // Cancel() is idempotent.
    if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      return absl::OkStatus();
    }
    if (!st.ok()) {
      absl::Status s = rpc::FromGrpcStatus(st);
      return absl::Status(s.code(),
                          absl::StrCat("cancel ", id_, ": ", s.message()));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<JobSummary> Wait(absl::Duration timeout) override {
    const absl::Time deadline = timeout == absl::InfiniteDuration()
                                    ? absl::InfiniteFuture()
                                    : clock_.Now() + timeout;
    absl::MutexLock lock(&mu_);
    while (!done_) {
      if (WaitOnClock(wake_, mu_, clock_, deadline) && !done_) {
        return absl::DeadlineExceededError(
            absl::StrCat(id_, " still ", JobPhaseName(progress_.phase),
                         " after ", absl::FormatDuration(timeout), " (step ",
                         progress_.step, "/", progress_.total_steps, ")"));
      }
    }
    return result_;
  }

 private:
  void Prepare(grpc::ClientContext& ctx) const {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     absl::ToChronoMilliseconds(kCallTimeout));
    rpc::AttachToken(ctx, options_.auth_token);
  }

  // Sleeps one poll interval, or less when the handle is being destroyed.
  void Pause() {
    absl::MutexLock lock(&mu_);
    if (!closing_) wake_.WaitWithTimeout(&mu_, options_.poll_interval);
  }

  // The observer thread. It watches the job (WatchJob: the controller sends
  // a status whenever the job changes, so a committed step reaches the
  // observer at once) in streams of one poll interval, checking the stop
  // request between them.
  void Follow() {
    absl::StatusOr<JobSummary> result =
        absl::InternalError("the job did not finish");
    absl::Time last_answer = clock_.MonotonicNow();
    bool ended = false;
    while (!ended) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options_.poll_interval));
      rpc::AttachToken(ctx, options_.auth_token);
      v1::WatchJobRequest request;
      request.set_job_id(id_);
      std::unique_ptr<grpc::ClientReader<v1::JobStatus>> reader =
          stub_->WatchJob(&ctx, request);
      v1::JobStatus status;
      while (!ended && reader->Read(&status)) {
        last_answer = clock_.MonotonicNow();
        ended = Update(status, &result);
      }
      if (ended) {
        ctx.TryCancel();
        reader->Finish().IgnoreError();
        break;
      }
      grpc::Status st = reader->Finish();
      if (st.ok() || st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        StopIfRequested();
        continue;
      }
      absl::Status s = rpc::FromGrpcStatus(st);
      if (st.error_code() != grpc::StatusCode::UNAVAILABLE ||
          clock_.MonotonicNow() - last_answer > kUnreachableTimeout) {
        result = absl::Status(
            s.code(), absl::StrCat("following ", id_, ": ", s.message()));
        break;
      }
      Pause();  // the controller is away (restarting?): ask again
    }
    if (embedded_ != nullptr) embedded_->Stop();
    absl::MutexLock lock(&mu_);
    result_ = std::move(result);
    done_ = true;
    wake_.SignalAll();
  }

  // Takes in one status: progress, the observer's records, stop requests.
  // True once the job has ended (`*result` then says how).
  bool Update(const v1::JobStatus& status, absl::StatusOr<JobSummary>* result) {
    {
      absl::MutexLock lock(&mu_);
      progress_.phase = rpc::JobPhaseFromProto(status.phase());
      progress_.message = status.message();
      progress_.step = status.step();
      progress_.total_steps = status.total_steps();
      progress_.policy_version = status.policy_version();
      progress_.reward_mean = status.reward_mean();
      progress_.eval_accuracy = status.eval_accuracy();
      progress_.tokens_per_second = status.tokens_per_second();
      progress_.groups_trained = status.groups_trained();
    }
    running_ = status.phase() == v1::JOB_PHASE_RUNNING;
    // History after the status: once the status is terminal, every record
    // is in.
    if (options_.observer != nullptr && !Observe() && !stop_sent_) {
      stop_sent_ = true;
      if (absl::Status s = Cancel(); !s.ok()) {
        spdlog::warn("observer asked {} to stop: {}", id_,
                     std::string(s.message()));
      }
    }
    StopIfRequested();
    if (!Terminal(status.phase())) return false;
    if (status.phase() == v1::JOB_PHASE_FAILED) {
      *result =
          absl::Status(status.error_code() != 0
                           ? static_cast<absl::StatusCode>(status.error_code())
                           : absl::StatusCode::kUnknown,
                       status.message());
    } else {
      *result = ParseSummary(status.summary_json());
      if (result->ok()) (*result)->summary_path = output_dir_ + "/summary.json";
    }
    return true;
  }

  // Passes RunOptions::stop_requested on once the job runs (a job not placed
  // yet would end without a checkpoint). For Start, the in-process stop
  // flag has already stopped it exactly at a step.
  void StopIfRequested() {
    if (!stop_sent_ && running_ && options_.stop_requested != nullptr &&
        options_.stop_requested->load()) {
      stop_sent_ = Cancel().ok();
    }
  }

  // Hands new step records to the observer; false when it asked to stop.
  bool Observe() {
    v1::GetJobHistoryRequest request;
    request.set_job_id(id_);
    request.set_after_seq(seen_seq_);
    v1::JobHistory history;
    grpc::ClientContext ctx;
    Prepare(ctx);
    grpc::Status st = stub_->GetJobHistory(&ctx, request, &history);
    if (!st.ok()) return true;  // asked again next poll
    if (history.first_seq() > seen_seq_ + 1) {
      spdlog::warn(
          "{}: the observer missed {} step records (the controller "
          "keeps the newest 4096)",
          id_, history.first_seq() - seen_seq_ - 1);
    }
    bool go_on = true;
    StepObserver& observer = *options_.observer;
    for (const v1::StepRecord& r : history.records()) {
      seen_seq_ = std::max(seen_seq_, r.seq());
      if (!r.metrics_json().empty() &&
          observer.OnStep(ParseStep(r)) == ObserverAction::kStop) {
        go_on = false;
      }
      if (r.eval_accuracy() >= 0 &&
          observer.OnEval({r.step(), r.eval_accuracy()}) ==
              ObserverAction::kStop) {
        go_on = false;
      }
      if (!r.checkpoint_dir().empty()) {
        observer.OnCheckpoint({r.step(), r.checkpoint_dir()});
      }
    }
    return go_on;
  }

  std::unique_ptr<Embedded> embedded_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  const std::string id_;
  const std::string output_dir_;
  const RunOptions options_;
  const Clock& clock_ = RealClock();  // deadlines and the unreachable time
  // The observer thread's.
  int64_t seen_seq_ = 0;
  bool running_ = false;
  bool stop_sent_ = false;

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  JobProgress progress_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<JobSummary> result_ ABSL_GUARDED_BY(mu_) =
      absl::InternalError("not finished");
  std::thread follower_;
};

absl::StatusOr<std::string> SubmitTo(v1::JobService::Stub& stub,
                                     const JobConfig& config,
                                     const RunOptions& options) {
  v1::SubmitJobRequest submit;
  submit.set_config_yaml(JobConfigToYaml(config));
  submit.set_source_name(config.source_path.empty() ? config.name
                                                    : config.source_path);
  submit.set_resume(options.resume);
  v1::SubmitJobResponse submitted;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(kCallTimeout));
  rpc::AttachToken(ctx, options.auth_token);
  grpc::Status st = stub.SubmitJob(&ctx, submit, &submitted);
  if (!st.ok()) return rpc::FromGrpcStatus(st);
  return submitted.job_id();
}

absl::Status CheckOptions(const RunOptions& options) {
  if (options.poll_interval <= absl::ZeroDuration() ||
      options.poll_interval > absl::Seconds(60)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunOptions.poll_interval: must be in (0, 60 s], got ",
                     absl::FormatDuration(options.poll_interval)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Job>> Job::Start(const JobConfig& given,
                                                const RunOptions& options) {
  FUSIONRL_RETURN_IF_ERROR(CheckOptions(options));
  // The struct is the job: resolved here once and handed to the manager as
  // it is (no YAML between them; the controller writes config.yaml).
  JobConfig config = given;
  FUSIONRL_RETURN_IF_ERROR(ResolveJobConfig(config));
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
  auto embedded = std::make_unique<Embedded>();
  embedded->grace = absl::Seconds(config.run.collective_timeout_seconds);
  ControllerOptions copts;  // in-process only
  copts.heartbeat_interval = absl::Seconds(1);
  copts.heartbeat_timeout = absl::Seconds(30);
  copts.http_address = options.http_address;
  FUSIONRL_ASSIGN_OR_RETURN(embedded->controller, Controller::Start(copts));
  Controller& controller = *embedded->controller;
  std::shared_ptr<grpc::Channel> channel = controller.InProcessChannel();
  // The cards' step protocol goes straight to the manager (no
  // serialisation); registration and heartbeats use the channel, as a
  // cluster's workers do.
  embedded->work = std::make_unique<InProcessWorkClient>(controller.jobs(),
                                                         controller.weights());
  const int super_nodes = config.placement.super_nodes;
  embedded->worker_status.resize(super_nodes);
  for (int i = 0; i < super_nodes; ++i) {
    WorkerOptions wopts;
    wopts.super_node = absl::StrCat("local-", i);
    wopts.host = "in-process";
    wopts.cards = config.placement.cards_per_super_node;
    wopts.device = config.device.rfind("cuda", 0) == 0 ? "cuda" : "cpu";
    wopts.poll_interval = absl::Milliseconds(200);
    wopts.work_client = embedded->work.get();
    wopts.running_jobs = &embedded->running_jobs;
    // The in-process workers share the job's threads.
    wopts.threads = std::max(1, config.num_threads / super_nodes);
    embedded->workers.push_back(std::make_unique<Worker>(channel, wopts));
    Worker* w = embedded->workers.back().get();
    Embedded* e = embedded.get();
    embedded->threads.emplace_back(
        [w, e, i] { e->worker_status[i] = w->Run(&e->stop_workers); });
  }
  // Submit once the workers are in, so the job is placed at once.
  const Clock& clock = RealClock();
  const absl::Time registered_by = clock.MonotonicNow() + absl::Seconds(30);
  while (controller.registry().alive_count() < super_nodes &&
         clock.MonotonicNow() < registered_by) {
    SleepOnClock(clock, absl::Milliseconds(5));
  }
  auto stub = v1::JobService::NewStub(channel);
  RunOptions local = options;
  local.auth_token.clear();  // the in-process controller has none
  JobSubmission submission;
  submission.config = config;
  submission.resume = options.resume;
  submission.stop_flag = options.stop_requested;
  FUSIONRL_ASSIGN_OR_RETURN(std::string job_id,
                            controller.jobs().Submit(std::move(submission)));
  return std::unique_ptr<Job>(new JobImpl(std::move(embedded), std::move(stub),
                                          std::move(job_id), config.output_dir,
                                          local));
}

absl::StatusOr<std::unique_ptr<Job>> Job::Submit(
    const std::string& controller_address, const JobConfig& config,
    const RunOptions& options) {
  FUSIONRL_RETURN_IF_ERROR(CheckOptions(options));
  if (controller_address.empty()) {
    return absl::InvalidArgumentError("controller address: empty (HOST:PORT)");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      controller_address, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::seconds(10))) {
    return absl::UnavailableError(absl::StrCat(
        "controller ", controller_address, ": not reachable within 10 s"));
  }
  auto stub = v1::JobService::NewStub(channel);
  absl::StatusOr<std::string> job_id = SubmitTo(*stub, config, options);
  if (!job_id.ok()) {
    return absl::Status(job_id.status().code(),
                        absl::StrCat("submit to ", controller_address, ": ",
                                     job_id.status().message()));
  }
  return std::unique_ptr<Job>(new JobImpl(nullptr, std::move(stub),
                                          *std::move(job_id), config.output_dir,
                                          options));
}

absl::StatusOr<JobSummary> RunRlJob(const JobConfig& config,
                                    const RunOptions& options) {
  FUSIONRL_ASSIGN_OR_RETURN(std::unique_ptr<Job> job,
                            Job::Start(config, options));
  return job->Wait();
}

}  // namespace fusionrl
