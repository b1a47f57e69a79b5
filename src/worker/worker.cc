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

// Per-node state shared by the worker's threads.
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
};

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
  // 1. Register (the controller may still be starting).
  v1::RegisterNodeRequest reg;
  reg.set_host(s.options.host);
  reg.set_super_node(s.options.super_node);
  reg.set_version(FUSIONRL_VERSION);
  for (int i = 0; i < s.options.cards; ++i) {
    v1::Card* card = reg.add_cards();
    card->set_index(i);
    card->set_device(s.options.device == "cuda" ? absl::StrCat("cuda:", i)
                                                : s.options.device);
  }
  const absl::Time connect_deadline =
      s.options.clock->Now() + s.options.connect_timeout;
  v1::RegisterNodeResponse registered;
  for (;;) {
    grpc::ClientContext ctx;
    s.Prepare(ctx, std::min(s.options.rpc_timeout, absl::Seconds(5)));
    grpc::Status st = s.node_stub->RegisterNode(&ctx, reg, &registered);
    if (st.ok()) break;
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE &&
        st.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::Status(rpc::FromGrpcStatus(st).code(),
                          absl::StrCat("RegisterNode: ", st.error_message()));
    }
    if (s.options.clock->Now() >= connect_deadline || s.Stopping()) {
      return absl::UnavailableError(
          absl::StrCat("RegisterNode: controller unreachable for ",
                       absl::FormatDuration(s.options.connect_timeout), ": ",
                       st.error_message()));
    }
    SleepOnClock(*s.options.clock, absl::Milliseconds(500));
  }
  s.node_id = registered.node_id();
  s.heartbeat_interval =
      absl::Milliseconds(std::max(50, registered.heartbeat_interval_ms()));
  spdlog::info("worker: registered as {} (super node {}, {} card(s))",
               s.node_id, s.options.super_node, s.options.cards);

  // 2. Heartbeats on their own thread.
  absl::Notification done;
  std::thread heartbeat([&s, &done] {
    std::vector<int64_t> last_busy(s.cards.size(), 0);
    absl::Time last = s.options.clock->Now();
    while (!done.WaitForNotificationWithTimeout(s.heartbeat_interval)) {
      const absl::Time now = s.options.clock->Now();
      const double window = absl::ToDoubleSeconds(now - last);
      last = now;
      v1::HeartbeatRequest request;
      request.set_node_id(s.node_id);
      for (size_t i = 0; i < s.cards.size(); ++i) {
        const int64_t busy = s.cards[i]->busy_us.load();
        v1::CardState* card = request.add_cards();
        card->set_index(static_cast<int>(i));
        card->set_role(s.cards[i]->active
                           ? rpc::CardRoleToProto(s.cards[i]->role.load())
                           : v1::CARD_ROLE_IDLE);
        if (std::shared_ptr<CardMemoryManager> m = s.cards[i]->Memory()) {
          for (const auto& [name, bytes] : m->Snapshot()) {
            (*card->mutable_memory_bytes())[name] = bytes;
          }
        }
        card->set_busy_fraction(
            window > 0 ? std::min(1.0, (busy - last_busy[i]) / 1e6 / window)
                       : 0);
        if (s.cards[i]->active) {
          auto [what, for_how_long] = s.cards[i]->Activity();
          card->set_activity(std::move(what));
          card->set_activity_seconds(absl::ToDoubleSeconds(for_how_long));
        }
        last_busy[i] = busy;
      }
      grpc::ClientContext ctx;
      s.Prepare(ctx, std::max(s.heartbeat_interval * 2, absl::Seconds(2)));
      // While the controller is unreachable the heartbeat waits for the
      // channel to connect (up to its deadline) instead of failing at once:
      // a waiting call polls the connection attempt, so a restarted
      // controller is reached as soon as it listens. Failing fast left the
      // attempt to gRPC's 5 s backup poller, and a restarted controller
      // heard from a node 5-13 s after it listened (measured), past the
      // 10 s heartbeat timeout of the cluster tests under load.
      ctx.set_wait_for_ready(true);
      v1::HeartbeatResponse response;
      grpc::Status st = s.node_stub->Heartbeat(&ctx, request, &response);
      if (st.ok()) {
        if (response.shutdown() && !s.shutdown.exchange(true)) {
          spdlog::info("worker {}: the controller asked us to shut down",
                       s.node_id);
        }
      } else if (st.error_code() == grpc::StatusCode::NOT_FOUND ||
                 st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        spdlog::error("worker {}: {}", s.node_id, st.error_message());
        s.lost = true;
      } else {
        spdlog::warn("worker {}: heartbeat failed: {}", s.node_id,
                     st.error_message());
      }
    }
  });

  // 3. Jobs.
  NodeContext node;
  node.client = s.work;
  node.node_id = s.node_id;
  node.super_node = s.options.super_node;
  node.device = s.options.device;
  node.threads = s.options.threads;
  node.debug_step_delay = s.options.debug_step_delay;
  node.debug_checkpoint_delay = s.options.debug_checkpoint_delay;
  node.cards = &s.cards;
  node.stopping = [&s] { return s.Stopping(); };
  absl::Status result;
  while (!s.Stopping()) {
    absl::StatusOr<Assignment> assignment =
        s.work->GetAssignment(s.node_id, s.options.poll_interval);
    if (!assignment.ok()) {
      const absl::StatusCode code = assignment.status().code();
      if (code == absl::StatusCode::kNotFound ||
          code == absl::StatusCode::kFailedPrecondition ||
          code == absl::StatusCode::kUnauthenticated) {
        result = assignment.status();
        break;
      }
      spdlog::warn("worker {}: {}", s.node_id,
                   std::string(assignment.status().message()));
      SleepOnClock(*s.options.clock, absl::Milliseconds(500));
      continue;
    }
    if (assignment->job_id.empty()) continue;
    if (s.options.running_jobs != nullptr) ++*s.options.running_jobs;
    absl::Status job = RunNodeJob(node, *assignment);
    if (s.options.running_jobs != nullptr) --*s.options.running_jobs;
    if (!job.ok() && !absl::IsCancelled(job)) {
      spdlog::error("worker {}: {}", s.node_id, std::string(job.message()));
    }
  }
  done.Notify();
  heartbeat.join();
  if (!s.lost) {
    v1::DeregisterNodeRequest request;
    request.set_node_id(s.node_id);
    grpc::ClientContext ctx;
    s.Prepare(ctx, absl::Seconds(5));
    v1::DeregisterNodeResponse response;
    s.node_stub->DeregisterNode(&ctx, request, &response);
  } else if (result.ok()) {
    result = absl::UnavailableError(
        absl::StrCat(s.node_id, " was declared lost by the controller"));
  }
  return result;
}

}  // namespace fusionrl
