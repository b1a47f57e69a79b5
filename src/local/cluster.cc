// ControllerServer and WorkerAgent (include/fusionrl/cluster.h): the public
// faces of Controller (controller/controller.h) and Worker
// (worker/worker.h), as `fusionrl controller` and `fusionrl worker` run
// them.
#include "fusionrl/cluster.h"

#include <grpcpp/create_channel.h>

#include <atomic>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "controller/controller.h"
#include "worker/worker.h"

namespace fusionrl {
namespace {

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

class ControllerServerImpl final : public ControllerServer {
 public:
  ControllerServerImpl(std::unique_ptr<Controller> controller,
                       const ControllerServerOptions& options)
      : controller_(std::move(controller)), options_(options) {}
  ~ControllerServerImpl() override { Shutdown(absl::Seconds(30)); }

  std::string address() const override {
    return absl::StrCat(HostOf(options_.listen_address), ":",
                        controller_->port());
  }
  std::string http_address() const override {
    if (options_.http_address.empty()) return "";
    return absl::StrCat(HostOf(options_.http_address), ":",
                        controller_->http_port());
  }
  void Shutdown(absl::Duration grace) override {
    if (shut_down_.exchange(true)) return;
    controller_->Drain(grace);
    controller_->Shutdown();
  }

 private:
  std::unique_ptr<Controller> controller_;
  const ControllerServerOptions options_;
  std::atomic<bool> shut_down_{false};
};

class WorkerAgentImpl final : public WorkerAgent {
 public:
  WorkerAgentImpl(std::shared_ptr<grpc::Channel> channel,
                  const WorkerOptions& options)
      : worker_(std::move(channel), options) {
    thread_ = std::thread([this] {
      absl::Status s = worker_.Run(&stop_);
      absl::MutexLock lock(&mu_);
      status_ = s;
      done_ = true;
    });
  }
  ~WorkerAgentImpl() override { Stop().IgnoreError(); }

  absl::Status Stop() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return status_;
  }
  bool Done() const override {
    absl::MutexLock lock(&mu_);
    return done_;
  }

 private:
  Worker worker_;
  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(
    const ControllerServerOptions& options) {
  if (options.listen_address.empty()) {
    return absl::InvalidArgumentError(
        "listen_address: empty (HOST:PORT, port 0 for any)");
  }
  ControllerOptions c;
  c.listen_address = options.listen_address;
  c.http_address = options.http_address;
  c.auth_token = options.auth_token;
  c.state_dir = options.state_dir;
  c.heartbeat_interval = options.heartbeat_interval;
  c.heartbeat_timeout = options.heartbeat_timeout;
  absl::StatusOr<std::unique_ptr<Controller>> controller = Controller::Start(c);
  if (!controller.ok()) return controller.status();
  return std::unique_ptr<ControllerServer>(
      new ControllerServerImpl(*std::move(controller), options));
}

absl::StatusOr<std::unique_ptr<WorkerAgent>> WorkerAgent::Start(
    const WorkerAgentOptions& options) {
  if (options.controller_address.empty()) {
    return absl::InvalidArgumentError(
        "controller_address: empty (HOST:PORT of the controller)");
  }
  if (!std::regex_match(options.super_node,
                        std::regex("[A-Za-z0-9._-]{1,64}"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("super_node: '", options.super_node,
                     "' must be 1-64 of [A-Za-z0-9._-]"));
  }
  if (options.cards < 1 || options.cards > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("cards: ", options.cards, " is not in 1..1024"));
  }
  if (options.device != "cpu" && options.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", options.device, "' is neither cpu nor cuda"));
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads: ", options.threads, " < 0"));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  WorkerOptions w;
  w.super_node = options.super_node;
  w.cards = options.cards;
  w.device = options.device;
  w.threads = options.threads;
  w.auth_token = options.auth_token;
  return std::unique_ptr<WorkerAgent>(new WorkerAgentImpl(
      grpc::CreateCustomChannel(options.controller_address,
                                grpc::InsecureChannelCredentials(), args),
      w));
}

}  // namespace fusionrl
