#include "worker/worker.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "fusionrl/v1/node.grpc.pb.h"
#include "fusionrl/version.h"
#include "rpc/auth.h"
#include "rpc/enum_proto.h"
#include "rpc/status_convert.h"
#include "spdlog/spdlog.h"
#include "worker/card_counters.h"
#include "worker/grpc_work_client.h"
#include "worker/node_job.h"

namespace fusionrl {
namespace {

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

// Per-node state shared by the worker's threads, and the steps of Run over
// it: Register, then heartbeats on their own thread (HeartbeatLoop) while
// ServeJobs runs the assigned jobs, then Deregister.
struct Worker::State {
  std::shared_ptr<grpc::Channel> channel;
  WorkerOptions options;
  std::unique_ptr<v1::NodeService::Stub> node_stub;
  std::unique_ptr<GrpcWorkClient> grpc_work;  // when none was given
  WorkClient* work = nullptr;
  std::string node_id;
  absl::Duration heartbeat_interval = absl::Seconds(1);

  // Set by the heartbeat thread: the controller ordered a shutdown, or
  // declared this node lost.
  std::atomic<bool> shutdown{false};
  std::atomic<bool> lost{false};
  const std::atomic<bool>* stop = nullptr;

  std::vector<std::unique_ptr<CardCounters>> cards;

  bool Stopping() const {
    return shutdown.load() || lost.load() ||
           (stop != nullptr && stop->load(std::memory_order_relaxed));
  }

  void Prepare(grpc::ClientContext& ctx, absl::Duration timeout) const {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     absl::ToChronoMilliseconds(timeout));
    rpc::AttachToken(ctx, options.auth_token);
  }

  // Registers the node's cards, retrying while the controller is not up yet
  // (up to options.connect_timeout); sets node_id and heartbeat_interval.
  absl::Status Register();
  // Heartbeats every heartbeat_interval until `done` is notified; sets
  // shutdown or lost from the controller's answers.
  void HeartbeatLoop(absl::Notification& done);
  // One heartbeat's request: each card's role, memory, activity and busy
  // fraction over the last `window_seconds` (last_busy[i]: card i's busy
  // time at the previous heartbeat, updated here).
  v1::HeartbeatRequest HeartbeatOf(double window_seconds,
                                   std::vector<int64_t>& last_busy) const;
  void SendHeartbeat(const v1::HeartbeatRequest& request);
  // Runs assigned jobs until Stopping(); returns the assignment poll's error
  // that ends serving (the node is unknown or not allowed), else OK.
  absl::Status ServeJobs();
  NodeContext NodeOfJobs();
  void Deregister();
};

absl::Status Worker::State::Register() {
  v1::RegisterNodeRequest reg;
  reg.set_host(options.host);
  reg.set_super_node(options.super_node);
  reg.set_version(FUSIONRL_VERSION);
  for (int i = 0; i < options.cards; ++i) {
    v1::Card* card = reg.add_cards();
    card->set_index(i);
    card->set_device(options.device == "cuda" ? absl::StrCat("cuda:", i)
                                              : options.device);
  }
  const absl::Time connect_deadline =
      options.clock->Now() + options.connect_timeout;
  v1::RegisterNodeResponse registered;
  for (;;) {
    grpc::ClientContext ctx;
    Prepare(ctx, std::min(options.rpc_timeout, absl::Seconds(5)));
    grpc::Status st = node_stub->RegisterNode(&ctx, reg, &registered);
    if (st.ok()) break;
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE &&
        st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::Status(rpc::FromGrpcStatus(st).code(),
                          absl::StrCat("RegisterNode: ", st.error_message()));
    }
    if (options.clock->Now() >= connect_deadline || Stopping()) {
      return absl::UnavailableError(
          absl::StrCat("RegisterNode: controller unreachable for ",
                       absl::FormatDuration(options.connect_timeout), ": ",
                       st.error_message()));
    }
    SleepOnClock(*options.clock, absl::Milliseconds(500));
  }
  node_id = registered.node_id();
  heartbeat_interval =
      absl::Milliseconds(std::max(50, registered.heartbeat_interval_ms()));
  spdlog::info("worker: registered as {} (super node {}, {} card(s))", node_id,
               options.super_node, options.cards);
  return absl::OkStatus();
}

void Worker::State::HeartbeatLoop(absl::Notification& done) {
  std::vector<int64_t> last_busy(cards.size(), 0);
  absl::Time last = options.clock->Now();
  while (!done.WaitForNotificationWithTimeout(heartbeat_interval)) {
    const absl::Time now = options.clock->Now();
    const double window = absl::ToDoubleSeconds(now - last);
    last = now;
    SendHeartbeat(HeartbeatOf(window, last_busy));
  }
}

v1::HeartbeatRequest Worker::State::HeartbeatOf(
    double window_seconds, std::vector<int64_t>& last_busy) const {
  v1::HeartbeatRequest request;
  request.set_node_id(node_id);
  for (size_t i = 0; i < cards.size(); ++i) {
    const int64_t busy = cards[i]->busy_us.load();
    v1::CardState* card = request.add_cards();
    card->set_index(static_cast<int>(i));
    card->set_role(cards[i]->active
                       ? rpc::CardRoleToProto(cards[i]->role.load())
                       : v1::CARD_ROLE_IDLE);
    if (std::shared_ptr<CardMemoryManager> m = cards[i]->Memory()) {
      for (const auto& [name, bytes] : m->Snapshot()) {
        (*card->mutable_memory_bytes())[name] = bytes;
      }
    }
    card->set_busy_fraction(
        window_seconds > 0
            ? std::min(1.0, (busy - last_busy[i]) / 1e6 / window_seconds)
            : 0);
    if (cards[i]->active) {
      auto [what, for_how_long] = cards[i]->Activity();
      card->set_activity(std::move(what));
      card->set_activity_seconds(absl::ToDoubleSeconds(for_how_long));
    }
    last_busy[i] = busy;
  }
  return request;
}

void Worker::State::SendHeartbeat(const v1::HeartbeatRequest& request) {
  grpc::ClientContext ctx;
  Prepare(ctx, std::max(heartbeat_interval * 2, absl::Seconds(2)));
  // While the controller is unreachable the heartbeat waits for the
  // channel to connect (up to its deadline) instead of failing at once:
  // a waiting call polls the connection attempt, so a restarted
  // controller is reached as soon as it listens. Failing fast left the
  // attempt to gRPC's 5 s backup poller, and a restarted controller
  // heard from a node 5-13 s after it listened (measured), past the
  // 10 s heartbeat timeout of the cluster tests under load.
  ctx.set_wait_for_ready(true);
  v1::HeartbeatResponse response;
  grpc::Status st = node_stub->Heartbeat(&ctx, request, &response);
  if (st.ok()) {
    if (response.shutdown() && !shutdown.exchange(true)) {
      spdlog::info("worker {}: the controller asked us to shut down", node_id);
    }
  } else if (st.error_code() == grpc::StatusCode::NOT_FOUND ||
             st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    spdlog::error("worker {}: {}", node_id, st.error_message());
    lost = true;
  } else {
    spdlog::warn("worker {}: heartbeat failed: {}", node_id,
                 st.error_message());
  }
}

NodeContext Worker::State::NodeOfJobs() {
  NodeContext node;
  node.client = work;
  node.node_id = node_id;
  node.super_node = options.super_node;
  node.device = options.device;
  node.threads = options.threads;
  node.debug_step_delay = options.debug_step_delay;
  node.debug_checkpoint_delay = options.debug_checkpoint_delay;
  node.cards = &cards;
  node.stopping = [this] { return Stopping(); };
  return node;
}

absl::Status Worker::State::ServeJobs() {
  const NodeContext node = NodeOfJobs();
  while (!Stopping()) {
    absl::StatusOr<Assignment> assignment =
        work->GetAssignment(node_id, options.poll_interval);
    if (!assignment.ok()) {
      const absl::StatusCode code = assignment.status().code();
      if (code == absl::StatusCode::kNotFound ||
          code == absl::StatusCode::kFailedPrecondition ||
          code == absl::StatusCode::kUnauthenticated) {
        return assignment.status();
      }
      spdlog::warn("worker {}: {}", node_id,
                   std::string(assignment.status().message()));
      SleepOnClock(*options.clock, absl::Milliseconds(500));
      continue;
    }
    if (assignment->job_id.empty()) continue;
    if (options.running_jobs != nullptr) ++*options.running_jobs;
    absl::Status job = RunNodeJob(node, *assignment);
    if (options.running_jobs != nullptr) --*options.running_jobs;
    if (!job.ok() && !absl::IsCancelled(job)) {
      spdlog::error("worker {}: {}", node_id, std::string(job.message()));
    }
  }
  return absl::OkStatus();
}

void Worker::State::Deregister() {
  v1::DeregisterNodeRequest request;
  request.set_node_id(node_id);
  grpc::ClientContext ctx;
  Prepare(ctx, absl::Seconds(5));
  v1::DeregisterNodeResponse response;
  node_stub->DeregisterNode(&ctx, request, &response);
}

Worker::Worker(std::shared_ptr<grpc::Channel> channel, WorkerOptions options)
    : state_(std::make_unique<State>()) {
  state_->channel = std::move(channel);
  state_->options = std::move(options);
  if (state_->options.host.empty()) state_->options.host = HostName();
  state_->node_stub = v1::NodeService::NewStub(state_->channel);
  state_->work = state_->options.work_client;
  if (state_->work == nullptr) {
    state_->grpc_work = std::make_unique<GrpcWorkClient>(
        state_->channel, state_->options.auth_token,
        state_->options.rpc_timeout, state_->options.reconnect_timeout);
    state_->work = state_->grpc_work.get();
  }
  for (int i = 0; i < std::max(1, state_->options.cards); ++i) {
    state_->cards.push_back(std::make_unique<CardCounters>());
  }
}

Worker::~Worker() = default;

absl::Status Worker::Run(const std::atomic<bool>* stop) {
  State& s = *state_;
  s.stop = stop;
  if (absl::Status registered = s.Register(); !registered.ok()) {
    return registered;
  }
  absl::Notification done;
  std::thread heartbeat([&s, &done] { s.HeartbeatLoop(done); });
  absl::Status result = s.ServeJobs();
  done.Notify();
  heartbeat.join();
  if (!s.lost) {
    s.Deregister();
  } else if (result.ok()) {
    result = absl::UnavailableError(
        absl::StrCat(s.node_id, " was declared lost by the controller"));
  }
  return result;
}

}  // namespace fusionrl
