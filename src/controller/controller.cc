#include "controller/controller.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/server_interceptor.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/controller_state.h"
#include "controller/job_manager_proto.h"
#include "controller/outputs/http_server.h"
#include "controller/services.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "core/weight_store.h"
#include "fusionrl/version.h"
#include "rpc/node_service.h"
#include "rpc/weight_service.h"
#include "spdlog/spdlog.h"

namespace fusionrl {

struct Controller::Services {
  std::unique_ptr<rpc::NodeServiceImpl> node;
  std::unique_ptr<WeightStore> weight_store;
  std::unique_ptr<rpc::WeightServiceImpl> weight;
  std::unique_ptr<JobServiceImpl> job;
  std::unique_ptr<WorkServiceImpl> work;
};

Controller::Controller(const ControllerOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? *options.clock : RealClock()),
      started_(clock_.Now()) {}

namespace {

absl::Status CheckOptions(const ControllerOptions& options) {
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat timeout (", absl::FormatDuration(options.heartbeat_timeout),
        ") must be longer than the heartbeat interval (",
        absl::FormatDuration(options.heartbeat_interval), ") and both > 0"));
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both a certificate file and a key file");
  }
  return absl::OkStatus();
}

// Insecure, or TLS from the options' key and certificate files.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const ControllerOptions& options) {
  if (options.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  auto key = ReadTextFile(options.tls_key_file, "TLS key");
  if (!key.ok()) return key.status();
  auto cert = ReadTextFile(options.tls_cert_file, "TLS certificate");
  if (!cert.ok()) return cert.status();
  pair.private_key = *key;
  pair.cert_chain = *cert;
  ssl.pem_key_cert_pairs.push_back(pair);
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Controller>> Controller::Start(
    const ControllerOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  std::unique_ptr<Controller> c(new Controller(options));
  if (absl::Status s = c->OpenManagers(); !s.ok()) return s;
  c->MakeServices();
  if (absl::Status s = c->StartGrpcServer(); !s.ok()) return s;
  if (absl::Status s = c->StartHttpServer(); !s.ok()) return s;
  Controller* self = c.get();
  c->sweeper_ = std::thread([self] { self->SweepLoop(); });
  return c;
}

absl::Status Controller::OpenManagers() {
  registry_ =
      std::make_unique<NodeRegistry>(clock_, options_.heartbeat_timeout);
  jobs_ = std::make_unique<JobManager>(*registry_, clock_);
  if (!options_.state_dir.empty()) {
    absl::StatusOr<std::unique_ptr<ControllerState>> state =
        ControllerState::Open(options_.state_dir, *registry_, *jobs_);
    if (!state.ok()) return state.status();
    state_ = *std::move(state);
  }
  return absl::OkStatus();
}

void Controller::MakeServices() {
  Controller* self = this;
  services_ = std::make_unique<Services>();
  Services& s = *services_;
  s.node = std::make_unique<rpc::NodeServiceImpl>(*registry_,
                                                  options_.heartbeat_interval);
  rpc::NodeServiceImpl::Hooks hooks;
  hooks.auth_token = options_.auth_token;
  hooks.on_register = [self](const std::string& node_id) {
    if (self->state_ != nullptr) self->state_->NodeChanged(node_id);
    self->jobs_->Schedule();
  };
  hooks.on_heartbeat = [self](const v1::HeartbeatRequest& request) {
    std::vector<CardReport> cards;
    cards.reserve(request.cards_size());
    for (const v1::CardState& c : request.cards()) {
      cards.push_back(rpc::CardReportFromProto(c));
    }
    self->jobs_->RecordCardStates(request.node_id(), std::move(cards));
    return self->workers_shutdown_.load();
  };
  hooks.on_deregister = [self](const std::string& node_id) {
    if (self->state_ != nullptr) self->state_->NodeChanged(node_id);
    self->jobs_->NodesLost({node_id}, "deregistered");
  };
  s.node->set_hooks(std::move(hooks));
  s.weight_store =
      std::make_unique<WeightStore>(clock_, /*keep_versions_per_job=*/4);
  rpc::WeightServiceOptions weight_options;
  weight_options.auth_token = options_.auth_token;
  s.weight =
      std::make_unique<rpc::WeightServiceImpl>(*s.weight_store, weight_options);
  // A job's weight bytes through the WeightService are controller bytes too
  // (0 for jobs on the c10d data plane, which sync by broadcast).
  jobs_->SetWeightBytesSource(
      [store = s.weight_store.get()](const std::string& job_id) {
        return store->job_bytes(job_id);
      });
  s.job = std::make_unique<JobServiceImpl>(
      *jobs_, options_.auth_token, [self] { return self->ClusterStatus(); });
  s.work = std::make_unique<WorkServiceImpl>(*jobs_, options_.auth_token);
}

absl::Status Controller::StartGrpcServer() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!options_.listen_address.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        ServerCredentials(options_);
    if (!credentials.ok()) return credentials.status();
    builder.AddListeningPort(options_.listen_address, *credentials, &port_);
  }
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  builder.RegisterService(services_->node.get());
  builder.RegisterService(services_->weight.get());
  builder.RegisterService(services_->job.get());
  builder.RegisterService(services_->work.get());
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(RpcStats::MakeInterceptorFactory(rpc_stats_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || (!options_.listen_address.empty() && port_ == 0)) {
    return absl::UnavailableError(
        absl::StrCat("controller: cannot listen on '", options_.listen_address,
                     "' (address in use, or not a valid host:port)"));
  }
  return absl::OkStatus();
}

absl::Status Controller::StartHttpServer() {
  if (options_.http_address.empty()) return absl::OkStatus();
  Controller* self = this;
  HttpSources sources;
  sources.cluster = [self] { return self->ClusterStatus(); };
  sources.history = [self](
                        const std::string& job_id,
                        int64_t after_seq) -> absl::StatusOr<v1::JobHistory> {
    absl::StatusOr<JobHistory> history =
        self->jobs_->History(job_id, after_seq);
    if (!history.ok()) return history.status();
    return rpc::JobHistoryToProto(*history);
  };
  sources.rpc = [self] { return self->rpc_stats_.Get(); };
  sources.grpc_address =
      options_.listen_address.empty()
          ? std::string("in-process")
          : absl::StrCat(options_.listen_address.substr(
                             0, options_.listen_address.rfind(':')),
                         ":", port_);
  absl::StatusOr<std::unique_ptr<HttpServer>> http = HttpServer::Start(
      options_.http_address, options_.auth_token, std::move(sources));
  if (!http.ok()) {
    server_->Shutdown();
    return http.status();
  }
  http_ = *std::move(http);
  return absl::OkStatus();
}

Controller::~Controller() { Shutdown(); }

WeightStore& Controller::weights() { return *services_->weight_store; }

int Controller::http_port() const {
  return http_ == nullptr ? 0 : http_->port();
}

v1::ClusterStatus Controller::ClusterStatus() const {
  v1::ClusterStatus status = rpc::ClusterToProto(jobs_->Cluster());
  status.set_version(FUSIONRL_VERSION);
  const absl::Time now = clock_.Now();
  status.set_time_us(absl::ToUnixMicros(now));
  status.set_uptime_seconds(absl::ToDoubleSeconds(now - started_));
  return status;
}

std::shared_ptr<grpc::Channel> Controller::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  return server_->InProcessChannel(args);
}

bool Controller::WaitSweepTick(absl::Duration period) {
  const Clock& clock = jobs_->clock();
  absl::MutexLock lock(&sweeper_mu_);
  const absl::Time next = clock.Now() + period;
  while (!stop_sweeper_ &&
         !WaitOnClock(sweeper_cv_, sweeper_mu_, clock, next)) {
  }
  return !stop_sweeper_;
}

void Controller::SweepLoop() {
  const absl::Duration period = options_.heartbeat_interval / 2;
  while (WaitSweepTick(period)) {
    std::vector<std::string> lost = registry_->SweepLost();
    if (!lost.empty()) {
      for (const std::string& id : lost) {
        spdlog::warn("controller: {} lost (no heartbeat for {})", id,
                     absl::FormatDuration(options_.heartbeat_timeout));
        if (state_ != nullptr) state_->NodeChanged(id);
      }
      jobs_->NodesLost(
          lost, absl::StrCat("no heartbeat for ",
                             absl::FormatDuration(options_.heartbeat_timeout)));
    }
    jobs_->CheckStalls(options_.stall_timeout,
                       options_.stall_fails ? JobManager::StallAction::kFail
                                            : JobManager::StallAction::kReplan);
    jobs_->Schedule();
  }
}

void Controller::Drain(absl::Duration grace) {
  jobs_->StopAll("controller shutting down");
  const Clock& clock = jobs_->clock();
  if (!jobs_->WaitIdle(clock.Now() + grace)) {
    spdlog::warn("controller: jobs still running after {}; stopping anyway",
                 absl::FormatDuration(grace));
  }
  workers_shutdown_ = true;
  // Workers hear it on their next heartbeat and deregister.
  const absl::Time deadline = clock.Now() + 3 * options_.heartbeat_interval;
  while (registry_->alive_count() > 0 && clock.Now() < deadline) {
    SleepOnClock(clock, absl::Milliseconds(50));
  }
}

void Controller::Shutdown() {
  if (shut_down_.exchange(true)) return;
  {
    absl::MutexLock lock(&sweeper_mu_);
    stop_sweeper_ = true;
    sweeper_cv_.SignalAll();
  }
  if (sweeper_.joinable()) sweeper_.join();
  if (http_ != nullptr) http_->Stop();
  // Waiting calls end within their deadlines; give them a short one.
  if (server_)
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
}

}  // namespace fusionrl
