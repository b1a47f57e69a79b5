#include "worker/worker.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/crc32c.h"
#include "core/memory_manager.h"
#include "core/metrics.h"
#include "core/seed.h"
#include "core/status_macros.h"
#include "engine/checkpoint.h"
#include "engine/grad_sync.h"
#include "engine/job_common.h"
#include "engine/memory_accounting.h"
#include "engine/rollout.h"
#include "engine/sample.h"
#include "engine/trainer.h"
#include "fusionrl/config.h"
#include "fusionrl/v1/node.grpc.pb.h"
#include "fusionrl/v1/weight.grpc.pb.h"
#include "fusionrl/v1/work.grpc.pb.h"
#include "rpc/auth.h"
#include "rpc/status_convert.h"
#include "rpc/weight_chunks.h"
#include "rpc/weight_client.h"
#include "spdlog/spdlog.h"
#include "worker/hier_sync.h"

namespace fusionrl {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr uint64_t kRolloutStream = 0x726f6c6c;  // "roll"
constexpr int kPlanWaitMs = 5000;

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
  std::unique_ptr<v1::WorkService::Stub> work_stub;
  std::unique_ptr<v1::WeightService::Stub> weight_stub;
  std::string node_id;
  absl::Duration heartbeat_interval = absl::Seconds(1);

  // Set by the heartbeat thread: the controller ordered a shutdown, or
  // declared this node lost.
  std::atomic<bool> shutdown{false};
  std::atomic<bool> lost{false};
  const std::atomic<bool>* stop = nullptr;

  // Per card: in a job, and microseconds spent in rollout + train.
  struct CardCounters {
    std::atomic<bool> active{false};
    std::atomic<int> role{v1::CARD_ROLE_IDLE};  // while active
    std::atomic<int64_t> busy_us{0};
    // The card's memory books while it runs a job (heartbeats report them).
    absl::Mutex memory_mu;
    std::shared_ptr<CardMemoryManager> memory ABSL_GUARDED_BY(memory_mu);
    void SetMemory(std::shared_ptr<CardMemoryManager> m) {
      absl::MutexLock lock(&memory_mu);
      memory = std::move(m);
    }
    std::shared_ptr<CardMemoryManager> Memory() {
      absl::MutexLock lock(&memory_mu);
      return memory;
    }
  };
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

namespace {

// How the cards of a node move in lock-step: card 0 fetches every card's
// plan for the next step (retrying until all carry the same attempt) and
// hands them over here, so the cards always run the same attempt and reach
// their collectives in the same order; it also decides, for all, to stop.
struct NodeRendezvous {
  absl::Mutex mu;
  absl::CondVar published;
  int64_t generation = 0;
  std::vector<v1::StepPlan> plans;  // per local rank
  absl::Status status;              // non-OK: every card returns it
};

// Everything one card thread needs for one job.
struct CardJob {
  Worker::State* node = nullptr;
  std::string job_id;
  const JobConfig* config = nullptr;
  std::string resume_checkpoint;
  int local_rank = 0;
  int local_cards = 1;            // cards that train (the local ranks)
  int assigned_cards = 1;         // all the node's cards in the job
  int rollout_cards = 0;          // disaggregated: cards that only sample
  GradientSync* local = nullptr;  // node's c10d group; null for one card
  Worker::State::CardCounters* counters = nullptr;
  // disaggregated: the rollout card serving this one, and its device.
  Worker::State::CardCounters* rollout_counters = nullptr;
  std::string rollout_device;
  NodeRendezvous* rendezvous = nullptr;
};

// The state of a card at the start of a step, to roll back an aborted
// attempt.
struct Snapshot {
  std::vector<at::Tensor> params;
  std::string optimizer;
  int64_t version = 0;
};

absl::StatusOr<Snapshot> TakeSnapshot(PolicyModel& policy,
                                      const Trainer& trainer) {
  Snapshot s;
  for (const at::Tensor& p : policy.parameters()) {
    s.params.push_back(p.detach().clone());
  }
  FUSIONRL_ASSIGN_OR_RETURN(s.optimizer, trainer.OptimizerState());
  s.version = trainer.version();
  return s;
}

absl::Status RestoreSnapshot(const Snapshot& s, PolicyModel& policy,
                             Trainer& trainer) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params = policy.parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(s.params[i]);
  FUSIONRL_RETURN_IF_ERROR(trainer.RestoreOptimizerState(s.optimizer));
  trainer.set_version(s.version);
  return absl::OkStatus();
}

// The weights' raw bytes in parameter order (what a weight sync copies and
// its CRC-32C covers).
std::string WeightBytes(PolicyModel& policy) {
  std::string out;
  for (const at::Tensor& p : policy.parameters()) {
    const at::Tensor c = p.detach().to(at::kCPU).contiguous();
    out.append(static_cast<const char*>(c.data_ptr()),
               c.numel() * c.element_size());
  }
  return out;
}

uint32_t WeightsCrc32c(PolicyModel& policy) {
  return Crc32c(WeightBytes(policy));
}

// A weight-sync blob: 8 bytes of weight length, the weights, the optimizer
// state (Trainer::OptimizerState).
absl::StatusOr<std::string> SerializeState(PolicyModel& policy,
                                           const Trainer& trainer) {
  std::string weights = WeightBytes(policy);
  FUSIONRL_ASSIGN_OR_RETURN(std::string optimizer, trainer.OptimizerState());
  const uint64_t n = weights.size();
  std::string out(reinterpret_cast<const char*>(&n), sizeof(n));
  out += weights;
  out += optimizer;
  return out;
}

absl::Status AdoptState(const std::string& blob, PolicyModel& policy,
                        Trainer& trainer) {
  uint64_t n = 0;
  if (blob.size() < sizeof(n)) {
    return absl::DataLossError("weight sync: blob shorter than its header");
  }
  std::memcpy(&n, blob.data(), sizeof(n));
  if (n > blob.size() - sizeof(n)) {
    return absl::DataLossError(absl::StrCat("weight sync: blob of ",
                                            blob.size(), " bytes says ", n,
                                            " bytes of weights"));
  }
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params = policy.parameters();
  size_t offset = sizeof(n);
  for (at::Tensor& p : params) {
    const size_t bytes = p.numel() * p.element_size();
    if (offset + bytes > sizeof(n) + n) {
      return absl::DataLossError(
          "weight sync: the lead's weights are smaller than this model's");
    }
    at::Tensor host = at::empty(p.sizes(), p.options().device(at::kCPU));
    std::memcpy(host.data_ptr(), blob.data() + offset, bytes);
    p.copy_(host);
    offset += bytes;
  }
  if (offset != sizeof(n) + n) {
    return absl::DataLossError(
        "weight sync: the lead's weights are larger than this model's");
  }
  return trainer.RestoreOptimizerState(blob.substr(offset));
}

// One step's sampled and scored prompt groups of one card.
struct RolloutBatch {
  std::vector<uint64_t> groups;
  std::vector<Sample> samples;
  std::vector<Problem> problems;
  int64_t tokens = 0, correct = 0, finished = 0;
  double reward_sum = 0;
  double seconds = 0;
  // Fused: how long the rollout thread waited for the policy version that
  // StaleSync admission needed before sampling this batch.
  double gate_wait_seconds = 0;
};

// RL Fusion on one card (placement.mode fused): a rollout thread samples the
// coming steps' groups from a read-only snapshot of the policy while the
// card's main thread trains the live weights. After every committed step
// the trainer publishes its weights (one copy); the rollout thread takes
// them into its snapshot before its next sampling round (one more copy),
// only when they are newer. StaleSync admission: the rollout of step u
// starts only once the snapshot is at least version u - 1 - s, so every
// sample is trained with staleness <= s (checked again at training).
struct Fusion {
  absl::Mutex mu;
  absl::CondVar changed;
  std::unique_ptr<PolicyModel> snapshot;
  std::unique_ptr<RolloutEngine> engine;
  int64_t snapshot_version = -1;
  std::vector<at::Tensor> published;  // the trainer's newest weights
  int64_t published_version = 0;
  // What to sample: base_groups at base_step, each group index advancing
  // by prompts_per_step per step (the controller's plan when nothing fails).
  std::vector<uint64_t> base_groups;
  int64_t base_step = 0;
  int rank = 0;
  uint64_t generation = 0;  // bumped on every reset; stale results dropped
  int64_t next_step = 0;
  std::map<int64_t, RolloutBatch> ready;
  absl::Status error;
  bool stop = false;
  std::thread thread;
  // Intra-op threads of each role; in fused mode a role whose partner is
  // idle borrows the partner's share (the card's compute is never left
  // idle while one role has work).
  int train_threads = 1;
  int rollout_threads = 1;
  int card_threads = 1;  // the card's whole share
  bool share_idle_threads = false;
  std::atomic<bool> rollout_sampling{false};
  std::atomic<bool> trainer_waiting{false};
};

class CardRunner {
 public:
  explicit CardRunner(CardJob job) : job_(std::move(job)) {}
  ~CardRunner() { StopFusion(); }

  absl::Status Run();

 private:
  // Samples and scores `groups` for `step` with `engine` (weights of
  // `version`); thread-safe with respect to the trainer.
  // `memory`: the books of the card it samples on; `on_trainer_thread`:
  // whether this thread may move the optimizer state itself.
  absl::StatusOr<RolloutBatch> SampleGroups(RolloutEngine& engine,
                                            const std::vector<uint64_t>& groups,
                                            int64_t step, int rank,
                                            int64_t version,
                                            CardMemoryManager& memory,
                                            bool on_trainer_thread) const;
  // Before a training step: carries out an optimizer offload the rollout
  // thread was granted, and brings the state back when it fits.
  absl::Status PrepareOptimizer();
  std::shared_ptr<CardMemoryManager> memory_;          // this card
  std::shared_ptr<CardMemoryManager> rollout_memory_;  // its rollout card's
  // Fused mode: the prefetched batch of `plan` (resetting the rollout thread
  // when the plan is not what it predicted).
  absl::StatusOr<RolloutBatch> TakeFusedBatch(const v1::StepPlan& plan);
  void RolloutLoop();
  void PublishWeights();
  void StopFusion();
  std::unique_ptr<Fusion> fusion_;

  // StaleSync across super nodes, after a sync_weights step: the lead card
  // publishes its weights and optimizer state, the cards of the other super
  // nodes adopt them. Returns the bytes this card sent or received.
  absl::StatusOr<int64_t> SyncWeights(const v1::StepPlan& plan);
  // One attempt of one step. Fills `report` (lead: metrics).
  absl::Status TrainStep(const v1::StepPlan& plan,
                         v1::FinishStepRequest& report);
  absl::Status WriteEndCheckpoint(const v1::StepPlan& plan, std::string* dir);
  absl::StatusOr<v1::StepPlan> GetPlan(int64_t step, int local_rank = -1);
  // This card's plan for `step`, in lock-step with the node's other cards.
  absl::StatusOr<v1::StepPlan> NextPlan(int64_t step);
  int64_t seen_generation_ = 0;
  absl::StatusOr<bool> Finish(const v1::FinishStepRequest& report);
  void ReportFailure(const absl::Status& status, int64_t step, int attempt);

  CardJob job_;
  const JobConfig& config() const { return *job_.config; }
  JobContext ctx_;
  std::unique_ptr<PolicyModel> reference_;
  std::unique_ptr<HierarchicalSync> sync_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<RolloutEngine> rollout_;
  int64_t plan_step_ = 0;
  int plan_attempt_ = 0;
};

absl::StatusOr<v1::StepPlan> CardRunner::NextPlan(int64_t step) {
  NodeRendezvous& rv = *job_.rendezvous;
  if (job_.local_rank != 0) {
    absl::MutexLock lock(&rv.mu);
    const absl::Time deadline =
        absl::Now() + absl::Seconds(config().run.collective_timeout_seconds);
    while (rv.generation == seen_generation_ && absl::Now() < deadline) {
      rv.published.WaitWithDeadline(&rv.mu, deadline);
    }
    if (rv.generation == seen_generation_) {
      return absl::DeadlineExceededError(absl::StrCat(
          "card ", job_.local_rank, ": no plan from card 0 for step ", step));
    }
    seen_generation_ = rv.generation;
    if (!rv.status.ok()) return rv.status;
    return rv.plans[job_.local_rank];
  }
  auto publish = [&](absl::Status status, std::vector<v1::StepPlan> plans) {
    absl::MutexLock lock(&rv.mu);
    rv.status = std::move(status);
    rv.plans = std::move(plans);
    ++rv.generation;
    rv.published.SignalAll();
  };
  for (;;) {
    if (job_.node->Stopping()) {
      absl::Status stop = absl::CancelledError("the worker is stopping");
      publish(stop, {});
      return stop;
    }
    std::vector<v1::StepPlan> plans;
    absl::Status status;
    for (int r = 0; r < job_.local_cards && status.ok(); ++r) {
      absl::StatusOr<v1::StepPlan> plan = GetPlan(step, r);
      if (!plan.ok()) {
        status = plan.status();
        break;
      }
      plans.push_back(*std::move(plan));
      const v1::PlanKind kind = plans.front().kind();
      if (kind == v1::PLAN_KIND_WAIT || kind == v1::PLAN_KIND_END ||
          kind == v1::PLAN_KIND_ABANDON) {
        // Nothing per card: the other cards stop (END, ABANDON) or card 0
        // asks again (WAIT).
        plans.resize(job_.local_cards, plans.front());
        break;
      }
    }
    if (!status.ok()) {
      publish(status, {});
      return status;
    }
    const v1::StepPlan& first = plans.front();
    if (first.kind() == v1::PLAN_KIND_WAIT) continue;
    bool same = true;
    for (const v1::StepPlan& p : plans) {
      same = same && p.kind() == first.kind() && p.step() == first.step() &&
             p.attempt() == first.attempt();
    }
    if (!same) continue;  // an attempt changed between the calls
    publish(absl::OkStatus(), plans);
    return first;
  }
}

absl::StatusOr<v1::StepPlan> CardRunner::GetPlan(int64_t step, int local_rank) {
  v1::GetStepPlanRequest request;
  request.set_job_id(job_.job_id);
  request.set_node_id(job_.node->node_id);
  request.set_local_rank(local_rank < 0 ? job_.local_rank : local_rank);
  request.set_step(step);
  request.set_wait_ms(kPlanWaitMs);
  grpc::ClientContext ctx;
  job_.node->Prepare(
      ctx, absl::Milliseconds(kPlanWaitMs) + job_.node->options.rpc_timeout);
  v1::StepPlan plan;
  grpc::Status s = job_.node->work_stub->GetStepPlan(&ctx, request, &plan);
  if (!s.ok()) {
    absl::Status st = rpc::FromGrpcStatus(s);
    return absl::Status(st.code(), absl::StrCat("GetStepPlan(step ", step,
                                                "): ", st.message()));
  }
  return plan;
}

absl::StatusOr<bool> CardRunner::Finish(const v1::FinishStepRequest& report) {
  grpc::ClientContext ctx;
  job_.node->Prepare(ctx,
                     absl::Seconds(config().run.collective_timeout_seconds) +
                         job_.node->options.rpc_timeout);
  v1::FinishStepResponse response;
  grpc::Status s = job_.node->work_stub->FinishStep(&ctx, report, &response);
  if (!s.ok()) {
    absl::Status st = rpc::FromGrpcStatus(s);
    return absl::Status(
        st.code(),
        absl::StrCat("FinishStep(step ", report.step(), "): ", st.message()));
  }
  return response.committed();
}

void CardRunner::ReportFailure(const absl::Status& status, int64_t step,
                               int attempt) {
  if (job_.local_rank != 0) return;
  v1::FinishStepRequest report;
  report.set_job_id(job_.job_id);
  report.set_node_id(job_.node->node_id);
  report.set_step(step);
  report.set_attempt(attempt);
  report.set_error(std::string(status.message()));
  report.set_error_code(static_cast<int>(status.code()));
  Finish(report).IgnoreError();
}

absl::Status CardRunner::Run() {
  const JobConfig& cfg = config();
  FUSIONRL_ASSIGN_OR_RETURN(ctx_, PrepareJob(cfg, std::string()));
  const int threads = job_.node->options.threads > 0
                          ? job_.node->options.threads
                          : cfg.num_threads;
  // Each of the node's cards in the job gets an equal share of the threads.
  const int per_card = std::max(1, threads / job_.assigned_cards);
  at::set_num_threads(per_card);
  PolicyModel& policy = *ctx_.policy;
  if (cfg.algorithm.kl_coef > 0) reference_ = policy.CloneFrozen();
  Worker::State* node = job_.node;
  const std::string job_id = job_.job_id;
  sync_ = std::make_unique<HierarchicalSync>(
      job_.local, job_.local_rank,
      [this, node, job_id](int64_t round, v1::ReduceDtype dtype,
                           std::string payload) -> absl::StatusOr<std::string> {
        v1::ReduceRequest request;
        request.set_job_id(job_id);
        request.set_node_id(node->node_id);
        request.set_step(plan_step_);
        request.set_attempt(plan_attempt_);
        request.set_round(round);
        request.set_dtype(dtype);
        *request.mutable_payload() = std::move(payload);
        grpc::ClientContext ctx;
        node->Prepare(ctx,
                      absl::Seconds(config().run.collective_timeout_seconds) +
                          node->options.rpc_timeout);
        v1::ReduceResponse response;
        grpc::Status s = node->work_stub->Reduce(&ctx, request, &response);
        if (!s.ok()) return rpc::FromGrpcStatus(s);
        return std::move(*response.mutable_payload());
      },
      [this, node, job_id](
          int64_t step, int64_t round, int64_t due_step,
          std::string payload) -> absl::StatusOr<std::vector<ReceivedUpdate>> {
        v1::ExchangeUpdatesRequest request;
        request.set_job_id(job_id);
        request.set_due_step(due_step);
        v1::GradientUpdate* u = request.mutable_update();
        u->set_node_id(node->node_id);
        u->set_step(step);
        u->set_round(round);
        u->set_crc32c(Crc32c(payload));
        *u->mutable_payload() = std::move(payload);
        grpc::ClientContext ctx;
        node->Prepare(ctx,
                      absl::Seconds(config().run.collective_timeout_seconds) +
                          node->options.rpc_timeout);
        v1::ExchangeUpdatesResponse response;
        grpc::Status s =
            node->work_stub->ExchangeUpdates(&ctx, request, &response);
        if (!s.ok()) return rpc::FromGrpcStatus(s);
        std::vector<ReceivedUpdate> out;
        for (v1::GradientUpdate& got : *response.mutable_updates()) {
          if (Crc32c(got.payload()) != got.crc32c()) {
            return absl::DataLossError(
                absl::StrCat("update of ", got.node_id(), " step ", got.step(),
                             " round ", got.round(), ": CRC-32C mismatch"));
          }
          out.push_back({got.step(), std::move(*got.mutable_payload())});
        }
        return out;
      });
  FUSIONRL_ASSIGN_OR_RETURN(
      trainer_, Trainer::Create(policy, reference_.get(), cfg,
                                ctx_.tokenizer->pad_id(), sync_.get()));
  rollout_ = std::make_unique<RolloutEngine>(policy, ctx_.tokenizer->pad_id(),
                                             ctx_.stop_ids);
  if (job_.local_rank == 0) {
    spdlog::info(
        "[{}] {}: policy {} parameters on {} x {} card(s), task {} "
        "({} eval problems)",
        cfg.name, node->node_id, policy.num_parameters(), job_.local_cards,
        ctx_.device.str(), ctx_.task->name(), ctx_.task->eval_set().size());
  }
  if (!job_.resume_checkpoint.empty()) {
    FUSIONRL_ASSIGN_OR_RETURN(
        CheckpointMeta meta,
        ReadCheckpoint(job_.resume_checkpoint, policy, trainer_.get()));
    trainer_->set_version(meta.policy_version);
  }
  FUSIONRL_ASSIGN_OR_RETURN(
      memory_, CardMemoryManager::Create(job_.local_rank, cfg.memory));
  memory_->Set(
      MemoryCategory::kWeights,
      ParameterBytes(policy) + (reference_ ? ParameterBytes(*reference_) : 0));
  memory_->Set(MemoryCategory::kOptimizer, OptimizerStateBytes(*trainer_));
  job_.counters->SetMemory(memory_);
  rollout_memory_ = memory_;
  if (job_.rollout_counters != nullptr) {
    FUSIONRL_ASSIGN_OR_RETURN(
        rollout_memory_,
        CardMemoryManager::Create(job_.local_rank, cfg.memory));
    job_.rollout_counters->SetMemory(rollout_memory_);
  }
  const bool fused = cfg.placement.mode == "fused";
  if (fused || cfg.placement.mode == "disaggregated") {
    fusion_ = std::make_unique<Fusion>();
    if (fused) {
      // RL Fusion: this thread trains with half the card's threads, a
      // rollout thread samples with the rest; either borrows the other's
      // share while the other is idle.
      fusion_->train_threads = cfg.placement.fused_train_threads > 0
                                   ? cfg.placement.fused_train_threads
                                   : std::max(1, per_card / 2);
      fusion_->rollout_threads =
          cfg.placement.fused_rollout_threads > 0
              ? cfg.placement.fused_rollout_threads
              : std::max(1, per_card - fusion_->train_threads);
      fusion_->share_idle_threads = cfg.placement.fused_share_idle_threads;
      fusion_->card_threads = std::max(per_card, fusion_->train_threads);
      fusion_->snapshot = policy.CloneFrozen();
    } else {
      // Disaggregated: this card trains with its whole share; the rollout
      // thread samples on its rollout card with that card's share (split
      // between the training cards it serves).
      const int served = std::max(1, job_.local_cards / job_.rollout_cards);
      fusion_->train_threads = per_card;
      fusion_->rollout_threads = std::max(1, per_card / served);
      FUSIONRL_ASSIGN_OR_RETURN(c10::Device rollout_device,
                                ResolveDevice(job_.rollout_device));
      fusion_->snapshot = policy.CloneFrozen(rollout_device);
    }
    rollout_memory_->Set(MemoryCategory::kSnapshot,
                         ParameterBytes(*fusion_->snapshot));
    at::set_num_threads(fusion_->train_threads);
    if (fusion_->share_idle_threads) {
      Fusion* f = fusion_.get();
      trainer_->set_compute_hook([f] {
        at::set_num_threads(f->rollout_sampling.load() ? f->train_threads
                                                       : f->card_threads);
      });
    }
    fusion_->engine = std::make_unique<RolloutEngine>(
        *fusion_->snapshot, ctx_.tokenizer->pad_id(), ctx_.stop_ids);
    fusion_->snapshot_version = trainer_->version();
    PublishWeights();
    fusion_->thread = std::thread([this] { RolloutLoop(); });
  }

  int64_t next = 0;
  for (;;) {
    FUSIONRL_ASSIGN_OR_RETURN(v1::StepPlan plan, NextPlan(next));
    switch (plan.kind()) {
      case v1::PLAN_KIND_ABANDON:
        if (job_.local_rank == 0) {
          spdlog::info("{}: {}", node->node_id, plan.message());
        }
        return absl::OkStatus();
      case v1::PLAN_KIND_END: {
        // Only card 0 goes on: it writes the last checkpoint if it is the
        // job's lead, or waits for the end (it may become the lead if the
        // lead node is lost first).
        if (job_.local_rank != 0) return absl::OkStatus();
        next = plan.step();
        if (plan.rank() != 0 || plan.checkpoint_name().empty()) {
          FUSIONRL_ASSIGN_OR_RETURN(plan, GetPlan(next));
          while (plan.kind() == v1::PLAN_KIND_END &&
                 (plan.rank() != 0 || plan.checkpoint_name().empty())) {
            FUSIONRL_ASSIGN_OR_RETURN(plan, GetPlan(next));
          }
          if (plan.kind() != v1::PLAN_KIND_END) return absl::OkStatus();
        }
        std::string dir;
        absl::Status s = WriteEndCheckpoint(plan, &dir);
        v1::FinishStepRequest report;
        report.set_job_id(job_.job_id);
        report.set_node_id(node->node_id);
        report.set_step(plan.step());
        if (!s.ok()) {
          report.set_error(std::string(s.message()));
          report.set_error_code(static_cast<int>(s.code()));
        } else {
          report.set_checkpoint_dir(dir);
        }
        FUSIONRL_RETURN_IF_ERROR(Finish(report).status());
        return s;
      }
      case v1::PLAN_KIND_TRAIN:
        break;
      default:
        return absl::UnimplementedError(
            absl::StrCat("GetStepPlan: unknown plan kind ", plan.kind(),
                         " (is the controller a newer version?)"));
    }
    plan_step_ = plan.step();
    plan_attempt_ = plan.attempt();
    if (plan.exchange_updates()) {
      sync_->BeginSkewedStep(plan.step(), plan.updates_due_step(),
                             plan.nodes());
    } else {
      sync_->BeginAttempt(plan.rank(), plan.world_size(), plan.nodes());
    }
    // Only a synchronous step shared with other nodes can be aborted by a
    // node loss (a StaleSync job fails instead).
    std::optional<Snapshot> snapshot;
    if (plan.nodes() > 1 && !plan.exchange_updates()) {
      FUSIONRL_ASSIGN_OR_RETURN(snapshot, TakeSnapshot(policy, *trainer_));
    }
    v1::FinishStepRequest report;
    report.set_job_id(job_.job_id);
    report.set_node_id(node->node_id);
    report.set_step(plan.step());
    report.set_attempt(plan.attempt());
    report.set_initial_eval_accuracy(-1);
    report.set_eval_accuracy(-1);
    absl::Status step = TrainStep(plan, report);
    if (step.ok() && node->options.debug_step_delay > absl::ZeroDuration()) {
      absl::SleepFor(node->options.debug_step_delay);  // fault injection
    }
    if (plan.exchange_updates() && absl::IsAborted(step)) {
      // The job ended under us (a StaleSync job does not roll back); the
      // next plan says how.
      next = plan.step() + 1;
      continue;
    }
    bool committed = false;
    if (step.ok() && job_.local_rank == 0) {
      absl::StatusOr<bool> done = Finish(report);
      if (done.ok()) {
        committed = *done;
      } else {
        step = done.status();
      }
    }
    if (job_.local_cards > 1 && (step.ok() || absl::IsAborted(step))) {
      // Every card learns the node's outcome of the step.
      std::vector<double> flags = {committed ? 1.0 : 0.0,
                                   step.ok() ? 0.0 : 1.0};
      FUSIONRL_RETURN_IF_ERROR(sync_->LocalSum(flags));
      committed = flags[0] > 0;
      if (flags[1] > 0 && step.ok()) {
        step = absl::AbortedError("another card of this node was aborted");
      }
    }
    if (absl::IsAborted(step) || (step.ok() && !committed)) {
      if (!snapshot) {
        return absl::InternalError(
            "a single-node step was aborted; nothing to roll back to");
      }
      spdlog::warn("{} card {}: step {} attempt {} aborted ({}); rolling back",
                   node->node_id, job_.local_rank, plan.step(), plan.attempt(),
                   step.ok() ? std::string("not committed")
                             : std::string(step.message()));
      FUSIONRL_RETURN_IF_ERROR(RestoreSnapshot(*snapshot, policy, *trainer_));
      if (fusion_ != nullptr) {
        // Sample the replanned step afresh from the restored weights.
        PublishWeights();
        absl::MutexLock lock(&fusion_->mu);
        fusion_->base_groups.clear();
        fusion_->ready.clear();
        ++fusion_->generation;
      }
      next = plan.step();
      continue;
    }
    if (!step.ok()) {
      ReportFailure(step, plan.step(), plan.attempt());
      return step;
    }
    if (fusion_ != nullptr) PublishWeights();
    next = plan.step() + 1;
  }
}

absl::StatusOr<RolloutBatch> CardRunner::SampleGroups(
    RolloutEngine& engine, const std::vector<uint64_t>& groups, int64_t step,
    int rank, int64_t version, CardMemoryManager& memory,
    bool on_trainer_thread) const {
  const JobConfig& cfg = config();
  const auto& rc = cfg.rollout;
  const auto t0 = SteadyClock::now();
  RolloutBatch batch;
  batch.groups = groups;
  std::vector<std::vector<int>> prompts;
  for (uint64_t index : groups) {
    batch.problems.push_back(ctx_.task->TrainProblem(index));
    FUSIONRL_ASSIGN_OR_RETURN(auto ids,
                              EncodeProblemPrompt(ctx_, batch.problems.back()));
    for (int i = 0; i < rc.group_size; ++i) {
      Sample s;
      s.group_id = index;
      s.problem_index = index;
      s.prompt_ids = ids;
      s.behaviour_version = version;
      batch.samples.push_back(std::move(s));
      prompts.push_back(ids);
    }
  }
  SamplingParams sampling;
  sampling.temperature = rc.temperature;
  sampling.top_k = rc.top_k;
  sampling.top_p = rc.top_p;
  sampling.max_new_tokens = rc.max_new_tokens;
  uint64_t seed = MixSeed(MixSeed(cfg.seed, kRolloutStream), step);
  if (rank > 0) seed = MixSeed(seed, rank);
  // The KV cache of the round: granted by the card's memory books, which
  // may first move the optimizer state to host memory.
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  const MemoryDecision kv = memory.RequestKvCache(
      KvCacheBytesFor(cfg.model, static_cast<int64_t>(prompts.size()),
                      static_cast<int64_t>(longest) + rc.max_new_tokens));
  if (!kv.granted()) return absl::ResourceExhaustedError(kv.message);
  if (kv.outcome == MemoryDecision::Outcome::kGrantedAfterOffload) {
    if (on_trainer_thread) {
      FUSIONRL_RETURN_IF_ERROR(MoveOptimizerState(*trainer_, c10::kCPU));
      memory.OptimizerOffloaded(OptimizerStateBytes(*trainer_));
    } else if (ctx_.policy->device().is_cpu()) {
      // Host and card are the same memory: only the books move.
      memory.OptimizerOffloaded(kv.offload_bytes);
    } else {
      // The trainer moves it before its next step (PrepareOptimizer).
      FUSIONRL_RETURN_IF_ERROR(memory.WaitOptimizerOffloaded(
          absl::Now() + absl::Seconds(cfg.run.collective_timeout_seconds)));
    }
  }
  auto completions = engine.Generate(prompts, sampling, seed);
  memory.Set(MemoryCategory::kKvCache, 0);
  if (!completions.ok()) return completions.status();
  for (size_t i = 0; i < batch.samples.size(); ++i) {
    Sample& s = batch.samples[i];
    s.response_ids = std::move((*completions)[i].tokens);
    s.behaviour_logp = std::move((*completions)[i].logp);
    s.finished = (*completions)[i].finished;
    const Verdict v = ctx_.reward->Score(batch.problems[i / rc.group_size],
                                         DecodeResponse(ctx_, s.response_ids));
    s.reward = v.reward;
    s.correct = v.correct;
    batch.reward_sum += v.reward;
    batch.correct += v.correct;
    batch.finished += s.finished;
    batch.tokens += static_cast<int64_t>(s.response_ids.size());
  }
  batch.seconds = SecondsSince(t0);
  return batch;
}

void CardRunner::PublishWeights() {
  std::vector<at::Tensor> copy;
  for (const at::Tensor& p : ctx_.policy->parameters()) {
    copy.push_back(p.detach().clone());
  }
  absl::MutexLock lock(&fusion_->mu);
  fusion_->published = std::move(copy);
  fusion_->published_version = trainer_->version();
  fusion_->changed.SignalAll();
}

void CardRunner::StopFusion() {
  if (fusion_ == nullptr) return;
  {
    absl::MutexLock lock(&fusion_->mu);
    fusion_->stop = true;
    ++fusion_->generation;
    fusion_->changed.SignalAll();
  }
  if (fusion_->thread.joinable()) fusion_->thread.join();
}

void CardRunner::RolloutLoop() {
  Fusion& f = *fusion_;
  const JobConfig& cfg = config();
  const int64_t lag = cfg.stalesync.max_policy_lag;
  const uint64_t per_step = cfg.rollout.prompts_per_step;
  at::set_num_threads(f.rollout_threads);
  Worker::State::CardCounters* counters =
      job_.rollout_counters != nullptr ? job_.rollout_counters : job_.counters;
  absl::MutexLock lock(&f.mu);
  double gate_wait = 0;
  while (!f.stop) {
    const int64_t u = f.next_step;
    if (f.base_groups.empty() || f.published_version < u - 1 - lag) {
      const auto w0 = SteadyClock::now();
      f.changed.Wait(&f.mu);
      if (!f.base_groups.empty()) gate_wait += SecondsSince(w0);
      continue;
    }
    if (f.snapshot_version < f.published_version) {
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> params = f.snapshot->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].copy_(f.published[i]);
      }
      f.snapshot_version = f.published_version;
    }
    std::vector<uint64_t> groups = f.base_groups;
    for (uint64_t& g : groups) g += (u - f.base_step) * per_step;
    const uint64_t generation = f.generation;
    const int rank = f.rank;
    const int64_t version = f.snapshot_version;
    f.rollout_sampling = true;
    f.mu.Unlock();
    absl::StatusOr<RolloutBatch> batch;
    try {
      batch = SampleGroups(*f.engine, groups, u, rank, version,
                           *rollout_memory_, /*on_trainer_thread=*/false);
    } catch (const std::exception& e) {
      batch = absl::InternalError(absl::StrCat("rollout thread: ", e.what()));
    }
    counters->busy_us +=
        batch.ok() ? static_cast<int64_t>(batch->seconds * 1e6) : 0;
    f.mu.Lock();
    f.rollout_sampling = false;
    if (generation != f.generation) continue;  // reset meanwhile: drop it
    if (!batch.ok()) {
      f.error = batch.status();
      f.changed.SignalAll();
      return;
    }
    batch->gate_wait_seconds = gate_wait;
    gate_wait = 0;
    f.ready[u] = *std::move(batch);
    f.next_step = u + 1;
    f.changed.SignalAll();
  }
}

absl::StatusOr<RolloutBatch> CardRunner::TakeFusedBatch(
    const v1::StepPlan& plan) {
  Fusion& f = *fusion_;
  const uint64_t per_step = config().rollout.prompts_per_step;
  absl::MutexLock lock(&f.mu);
  bool predicted =
      !f.base_groups.empty() && f.rank == plan.rank() &&
      plan.step() >= f.base_step &&
      static_cast<size_t>(plan.groups_size()) == f.base_groups.size();
  for (int i = 0; predicted && i < plan.groups_size(); ++i) {
    predicted = plan.groups(i) ==
                f.base_groups[i] + (plan.step() - f.base_step) * per_step;
  }
  if (!predicted) {
    // First step, or the controller replanned: sample what the plan says.
    f.base_groups.assign(plan.groups().begin(), plan.groups().end());
    f.base_step = plan.step();
    f.rank = plan.rank();
    f.next_step = plan.step();
    f.ready.clear();
    ++f.generation;
    f.changed.SignalAll();
  }
  // Steps before this one will not be trained any more.
  f.ready.erase(f.ready.begin(), f.ready.lower_bound(plan.step()));
  const absl::Time deadline =
      absl::Now() + absl::Seconds(config().run.collective_timeout_seconds);
  while (f.ready.count(plan.step()) == 0 && f.error.ok() &&
         absl::Now() < deadline) {
    f.changed.WaitWithDeadline(&f.mu, deadline);
  }
  if (!f.error.ok()) return f.error;
  auto it = f.ready.find(plan.step());
  if (it == f.ready.end()) {
    return absl::DeadlineExceededError(
        absl::StrCat("fused card ", job_.local_rank, ": no rollout for step ",
                     plan.step(), " within run.collective_timeout_seconds"));
  }
  RolloutBatch batch = std::move(it->second);
  f.ready.erase(it);
  return batch;
}

absl::StatusOr<int64_t> CardRunner::SyncWeights(const v1::StepPlan& plan) {
  Worker::State* node = job_.node;
  const std::string key = absl::StrCat(job_.job_id, "/sync");
  const absl::Duration timeout =
      absl::Seconds(config().run.collective_timeout_seconds);
  if (plan.rank() == 0) {
    FUSIONRL_ASSIGN_OR_RETURN(std::string blob,
                              SerializeState(*ctx_.policy, *trainer_));
    FUSIONRL_RETURN_IF_ERROR(rpc::PublishWeights(
        *node->weight_stub, key, plan.step(), node->options.super_node, blob,
        rpc::kDefaultWeightChunkBytes, timeout, node->options.auth_token));
    return static_cast<int64_t>(blob.size());
  }
  if (plan.rank() < job_.local_cards) {
    return 0;  // the lead's node: identical to the lead card already
  }
  // The lead publishes after its own last exchange round, which waited for
  // ours: poll briefly until it is there.
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<std::string> blob =
        rpc::FetchWeights(*node->weight_stub, key, plan.step(), timeout,
                          nullptr, node->options.auth_token);
    if (blob.ok()) {
      FUSIONRL_RETURN_IF_ERROR(AdoptState(*blob, *ctx_.policy, *trainer_));
      return static_cast<int64_t>(blob->size());
    }
    if (!absl::IsNotFound(blob.status()) || absl::Now() >= deadline) {
      return absl::Status(blob.status().code(),
                          absl::StrCat("weight sync after step ", plan.step(),
                                       ": ", blob.status().message()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status CardRunner::PrepareOptimizer() {
  CardMemoryManager& m = *memory_;
  if (m.offload_in_flight()) {
    FUSIONRL_RETURN_IF_ERROR(MoveOptimizerState(*trainer_, c10::kCPU));
    m.OptimizerOffloaded(OptimizerStateBytes(*trainer_));
  }
  if (!m.optimizer_offloaded()) return absl::OkStatus();
  const c10::Device device = ctx_.policy->device();
  int64_t back = m.OptimizerRestoreNeeded() ? 1 : 0;
  if (back == 0 && !device.is_cpu()) {
    // AdamW needs its state next to the parameters: wait for the room.
    FUSIONRL_ASSIGN_OR_RETURN(
        back, m.WaitOptimizerRestore(
                  absl::Now() +
                  absl::Seconds(config().run.collective_timeout_seconds)));
  }
  if (back > 0) {
    FUSIONRL_RETURN_IF_ERROR(MoveOptimizerState(*trainer_, device));
    m.OptimizerRestored(OptimizerStateBytes(*trainer_));
  }
  // On a CPU card a state left "on the host" is the same memory: step on.
  return absl::OkStatus();
}

absl::Status CardRunner::TrainStep(const v1::StepPlan& plan,
                                   v1::FinishStepRequest& report) {
  const JobConfig& cfg = config();
  const auto& rc = cfg.rollout;
  PolicyModel& policy = *ctx_.policy;
  const bool lead = plan.rank() == 0;
  if (lead && plan.eval_before()) {
    FUSIONRL_ASSIGN_OR_RETURN(EvalResult initial,
                              EvaluateGreedy(policy, ctx_, rc.max_new_tokens));
    spdlog::info("[{}] initial eval accuracy {:.3f} ({:.1f}s)", cfg.name,
                 initial.accuracy, initial.seconds);
    report.set_initial_eval_accuracy(initial.accuracy);
  }
  const auto t0 = SteadyClock::now();
  job_.counters->active = true;
  RolloutBatch batch;
  double wait_s = 0;
  if (fusion_ != nullptr) {
    FUSIONRL_ASSIGN_OR_RETURN(batch, TakeFusedBatch(plan));
    wait_s = SecondsSince(t0);
  } else {
    FUSIONRL_ASSIGN_OR_RETURN(
        batch, SampleGroups(*rollout_,
                            std::vector<uint64_t>(plan.groups().begin(),
                                                  plan.groups().end()),
                            plan.step(), plan.rank(), trainer_->version(),
                            *memory_, /*on_trainer_thread=*/true));
  }
  std::vector<Sample>& samples = batch.samples;
  // Over-stale samples: admission makes them impossible, but one is never
  // trained on silently: its group is sampled again from the current
  // weights, or masked out of the step (stalesync.over_stale).
  const int64_t max_lag = cfg.stalesync.max_policy_lag;
  std::vector<uint64_t> stale_groups;
  for (const Sample& s : samples) {
    if (trainer_->version() - s.behaviour_version > max_lag &&
        std::find(stale_groups.begin(), stale_groups.end(), s.group_id) ==
            stale_groups.end()) {
      stale_groups.push_back(s.group_id);
    }
  }
  int64_t over_stale = 0;
  if (!stale_groups.empty()) {
    over_stale = static_cast<int64_t>(stale_groups.size()) * rc.group_size;
    spdlog::warn(
        "{} card {}: step {}: {} prompt group(s) over the policy lag "
        "{}; {}",
        job_.node->node_id, job_.local_rank, plan.step(), stale_groups.size(),
        max_lag, cfg.stalesync.over_stale);
    if (cfg.stalesync.over_stale == "drop") {
      for (Sample& s : samples) {
        if (std::find(stale_groups.begin(), stale_groups.end(), s.group_id) !=
            stale_groups.end()) {
          s.excluded = true;
        }
      }
    } else {
      FUSIONRL_ASSIGN_OR_RETURN(
          RolloutBatch fresh,
          SampleGroups(*rollout_, stale_groups, plan.step(), plan.rank(),
                       trainer_->version(), *memory_,
                       /*on_trainer_thread=*/true));
      size_t next = 0;
      for (Sample& s : samples) {
        if (std::find(stale_groups.begin(), stale_groups.end(), s.group_id) !=
            stale_groups.end()) {
          s = std::move(fresh.samples[next++]);
        }
      }
      // Recount the batch's totals over what is trained.
      batch.tokens = batch.correct = batch.finished = 0;
      batch.reward_sum = 0;
      for (const Sample& s : samples) {
        batch.tokens += static_cast<int64_t>(s.response_ids.size());
        batch.correct += s.correct;
        batch.finished += s.finished;
        batch.reward_sum += s.reward;
      }
    }
  }
  const double rollout_s = batch.seconds;
  int64_t step_tokens = batch.tokens, correct = batch.correct,
          finished = batch.finished;
  const double reward_sum = batch.reward_sum;
  int64_t max_staleness = 0;
  for (const Sample& s : samples) {
    if (s.excluded) continue;
    max_staleness =
        std::max(max_staleness, trainer_->version() - s.behaviour_version);
  }
  FUSIONRL_RETURN_IF_ERROR(PrepareOptimizer());
  const auto t1 = SteadyClock::now();
  TrainStats ts;
  {
    // Activations: the bytes the step allocates and holds at its peak.
    ScopedAllocationCounter counted(ctx_.policy->device());
    FUSIONRL_ASSIGN_OR_RETURN(ts, trainer_->Step(samples));
    memory_->Set(MemoryCategory::kActivations, counted.peak_bytes());
  }
  memory_->Set(MemoryCategory::kGradients, GradientBytes(policy));
  if (!memory_->optimizer_offloaded()) {
    memory_->Set(MemoryCategory::kOptimizer, OptimizerStateBytes(*trainer_));
  }
  const double train_s = SecondsSince(t1);
  std::vector<double> totals = {
      reward_sum, static_cast<double>(correct), static_cast<double>(finished),
      static_cast<double>(step_tokens), static_cast<double>(samples.size())};
  // Staleness histogram: samples with staleness 0..s (summed over cards).
  const int lag = cfg.stalesync.max_policy_lag;
  const size_t hist_at = totals.size();
  totals.resize(hist_at + lag + 1, 0.0);
  for (const Sample& smp : samples) {
    if (smp.excluded) continue;
    totals[hist_at + (trainer_->version() - 1 - smp.behaviour_version)] += 1;
  }
  totals.push_back(static_cast<double>(over_stale));
  FUSIONRL_RETURN_IF_ERROR(SumAcrossRanks(sync_.get(), totals));
  double sync_s = 0;
  int64_t sync_bytes = 0;
  if (plan.sync_weights()) {
    const auto ts0 = SteadyClock::now();
    FUSIONRL_ASSIGN_OR_RETURN(sync_bytes, SyncWeights(plan));
    sync_s = SecondsSince(ts0);
  }
  if (plan.exchange_updates() && job_.local_rank == 0) {
    // Each super node reports its own tokens; the controller adds them up.
    report.set_rollout_tokens(static_cast<int64_t>(totals[3]));
    if (plan.sync_weights()) {
      report.set_weights_crc32c(WeightsCrc32c(policy));
      report.set_has_weights_crc32c(true);
    }
  }
  const double step_s = SecondsSince(t0);
  job_.counters->busy_us += static_cast<int64_t>(step_s * 1e6);
  if (!lead) return absl::OkStatus();

  step_tokens = static_cast<int64_t>(totals[3]);
  const double n = totals[4];
  const double reward_mean = totals[0] / n;
  const double tokens_so_far =
      static_cast<double>(plan.rollout_tokens_before() + step_tokens);
  const double seconds_so_far = plan.loop_seconds_before() + step_s;
  MetricRecord rec = {
      {"step", static_cast<double>(plan.step())},
      {"policy_version", static_cast<double>(trainer_->version())},
      {"reward_mean", reward_mean},
      {"train_accuracy", totals[1] / n},
      {"response_len_mean", step_tokens / n},
      {"finished_frac", totals[2] / n},
      {"loss", ts.loss},
      {"pg_loss", ts.pg_loss},
      {"kl", ts.kl},
      {"entropy", ts.entropy},
      {"clip_frac", ts.clip_frac},
      {"grad_norm", ts.grad_norm},
      {"lr", ts.lr},
      {"advantage_abs_mean", ts.advantage_abs_mean},
      {"behaviour_weight_mean", ts.behaviour_weight_mean},
      {"behaviour_weight_truncated", ts.behaviour_weight_truncated},
      {"max_staleness", static_cast<double>(max_staleness)},
      {"over_stale_samples", totals.back()},
      {"rollout_tokens", static_cast<double>(step_tokens)},
      {"rollout_seconds", rollout_s},
      {"rollout_wait_seconds", wait_s},
      {"train_seconds", train_s},
      {"step_seconds", step_s},
      {"cards", static_cast<double>(plan.world_size())},
      {"nodes", static_cast<double>(plan.nodes())},
      {"attempt", static_cast<double>(plan.attempt())},
      {"cross_node_rounds", static_cast<double>(sync_->rounds())},
      {"cross_node_seconds", sync_->cross_node_seconds()},
      {"cross_node_bytes", static_cast<double>(sync_->cross_node_bytes())},
      {"rollout_gate_wait_seconds", batch.gate_wait_seconds},
      {"updates_received", static_cast<double>(sync_->updates_received())},
      {"max_update_lag", static_cast<double>(sync_->max_update_lag())},
      {"weight_sync_seconds", sync_s},
      {"weight_sync_bytes", static_cast<double>(sync_bytes)},
      {"tokens_per_second",
       seconds_so_far > 0 ? tokens_so_far / seconds_so_far : 0}};
  double last_eval = report.initial_eval_accuracy() >= 0
                         ? report.initial_eval_accuracy()
                         : plan.last_eval_accuracy();
  for (int i = 0; i <= lag; ++i) {
    rec.push_back({absl::StrCat("staleness_", i), totals[hist_at + i]});
  }
  if (cfg.model.moe_experts > 0) {
    // The lead card's own router statistics (like the other trainer stats).
    rec.push_back({"moe_aux_loss", ts.moe_aux_loss});
    rec.push_back({"moe_z_loss", ts.moe_z_loss});
    rec.push_back({"moe_dropped_frac", ts.moe_dropped_frac});
    for (size_t i = 0; i < ts.moe_expert_load.size(); ++i) {
      rec.push_back({absl::StrCat("moe_load_", i), ts.moe_expert_load[i]});
    }
  }
  if (plan.eval_after()) {
    FUSIONRL_ASSIGN_OR_RETURN(EvalResult ev,
                              EvaluateGreedy(policy, ctx_, rc.max_new_tokens));
    last_eval = ev.accuracy;
    report.set_eval_accuracy(ev.accuracy);
    rec.push_back({"eval_accuracy", ev.accuracy});
    rec.push_back({"eval_seconds", ev.seconds});
  }
  if (!plan.checkpoint_name().empty()) {
    const double initial = report.initial_eval_accuracy() >= 0
                               ? report.initial_eval_accuracy()
                               : plan.initial_eval_accuracy();
    CheckpointMeta meta{"rl",
                        cfg.name,
                        plan.step(),
                        trainer_->version(),
                        plan.data_cursor_after(),
                        initial,
                        last_eval,
                        plan.rollout_tokens_before() + step_tokens,
                        seconds_so_far};
    const std::string dir =
        cfg.output_dir + "/checkpoints/" + plan.checkpoint_name();
    FUSIONRL_RETURN_IF_ERROR(
        WriteCheckpoint(dir, policy, trainer_.get(), meta));
    report.set_checkpoint_dir(dir);
  }
  report.set_metrics_json(MetricRecordToJson(rec));
  report.set_rollout_tokens(step_tokens);
  report.set_loop_seconds(step_s);
  report.set_reward_mean(reward_mean);
  report.set_train_accuracy(totals[1] / n);
  report.set_policy_version(trainer_->version());
  return absl::OkStatus();
}

absl::Status CardRunner::WriteEndCheckpoint(const v1::StepPlan& plan,
                                            std::string* dir) {
  const JobConfig& cfg = config();
  CheckpointMeta meta{"rl",
                      cfg.name,
                      plan.step() - 1,
                      trainer_->version(),
                      plan.data_cursor_after(),
                      plan.initial_eval_accuracy(),
                      plan.last_eval_accuracy(),
                      plan.rollout_tokens_before(),
                      plan.loop_seconds_before()};
  *dir = cfg.output_dir + "/checkpoints/" + plan.checkpoint_name();
  FUSIONRL_RETURN_IF_ERROR(
      WriteCheckpoint(*dir, *ctx_.policy, trainer_.get(), meta));
  // A job that ran to its end (not one stopped early) is exported.
  if (cfg.run.export_final && plan.checkpoint_name() == "final") {
    FUSIONRL_RETURN_IF_ERROR(
        ExportJobPolicy(cfg, ctx_, *ctx_.policy, cfg.output_dir + "/hf"));
  }
  return absl::OkStatus();
}

// Runs one assigned job on this node: one thread per card.
absl::Status RunNodeJob(Worker::State& node,
                        const v1::GetAssignmentResponse& assignment) {
  std::vector<std::string> overrides(assignment.overrides().begin(),
                                     assignment.overrides().end());
  absl::StatusOr<JobConfig> config = ParseJobConfig(
      assignment.config_yaml(), assignment.source_name(), overrides);
  auto report_setup_failure = [&](const absl::Status& status) {
    v1::FinishStepRequest report;
    report.set_job_id(assignment.job_id());
    report.set_node_id(node.node_id);
    report.set_error(std::string(status.message()));
    report.set_error_code(static_cast<int>(status.code()));
    grpc::ClientContext ctx;
    node.Prepare(ctx, node.options.rpc_timeout);
    v1::FinishStepResponse response;
    node.work_stub->FinishStep(&ctx, report, &response);
    return status;
  };
  if (!config.ok()) return report_setup_failure(config.status());
  const int assigned = assignment.card_indices_size();
  const int rollout_cards = assignment.rollout_cards();
  if (assigned < 1 || assigned > static_cast<int>(node.cards.size()) ||
      rollout_cards < 0 || rollout_cards >= assigned) {
    return report_setup_failure(absl::InvalidArgumentError(absl::StrCat(
        "assignment uses ", assigned, " card(s), ", rollout_cards,
        " of them for rollout only; this node has ", node.cards.size())));
  }
  // The cards that train are the local ranks; disaggregated rollout cards
  // are served by a rollout thread of each training card they feed.
  const int cards = assigned - rollout_cards;
  std::vector<std::unique_ptr<GradientSync>> local;
  if (cards > 1) {
    auto group = MakeLocalGlooGroup(
        cards, absl::Seconds(config->run.collective_timeout_seconds));
    if (!group.ok()) return report_setup_failure(group.status());
    local = *std::move(group);
  }
  auto counters_of = [&node](int index) {
    return node.cards[std::min<size_t>(index, node.cards.size() - 1)].get();
  };
  auto device_of = [&node, &config](int index) {
    // A node of several GPUs: card i runs on cuda:<its index>.
    return node.options.device == "cuda" && config->device == "cuda"
               ? absl::StrCat("cuda:", index)
               : config->device;
  };
  const std::string& mode = config->placement.mode;
  for (int r = 0; r < assigned; ++r) {
    counters_of(assignment.card_indices(r))->role =
        r < rollout_cards   ? v1::CARD_ROLE_ROLLOUT
        : rollout_cards > 0 ? v1::CARD_ROLE_TRAIN
        : mode == "fused"   ? v1::CARD_ROLE_FUSED
                            : v1::CARD_ROLE_COLOCATED;
  }
  spdlog::info("{}: running {} on {} card(s){}", node.node_id,
               assignment.job_id(), assigned,
               rollout_cards > 0 ? absl::StrCat(" (", rollout_cards,
                                                " rollout, ", cards, " train)")
                                 : std::string());
  std::vector<absl::Status> status(cards);
  std::vector<JobConfig> card_configs(cards);
  NodeRendezvous rendezvous;
  std::vector<std::thread> threads;
  for (int r = 0; r < cards; ++r) {
    const int index = assignment.card_indices(rollout_cards + r);
    CardJob job;
    job.node = &node;
    job.job_id = assignment.job_id();
    card_configs[r] = *config;
    card_configs[r].device = device_of(index);
    job.config = &card_configs[r];
    job.resume_checkpoint = assignment.resume_checkpoint();
    job.local_rank = r;
    job.local_cards = cards;
    job.assigned_cards = assigned;
    job.rollout_cards = rollout_cards;
    if (rollout_cards > 0) {
      const int rollout_index = assignment.card_indices(r % rollout_cards);
      job.rollout_counters = counters_of(rollout_index);
      job.rollout_device = device_of(rollout_index);
      job.rollout_counters->active = true;
    }
    job.local = cards > 1 ? local[r].get() : nullptr;
    job.counters = counters_of(index);
    job.rendezvous = &rendezvous;
    threads.emplace_back([&status, &rendezvous, r, job]() mutable {
      try {
        status[r] = CardRunner(job).Run();
      } catch (const c10::Error& e) {
        status[r] = absl::InternalError(
            absl::StrCat("card ", r, ": ", e.what_without_backtrace()));
      } catch (const std::exception& e) {
        status[r] =
            absl::InternalError(absl::StrCat("card ", r, ": ", e.what()));
      }
      if (r == 0 && !status[r].ok()) {
        // Card 0 hands out the plans: release the cards waiting for one.
        absl::MutexLock lock(&rendezvous.mu);
        rendezvous.status = status[r];
        ++rendezvous.generation;
        rendezvous.published.SignalAll();
      }
      job.counters->active = false;
      job.counters->SetMemory(nullptr);
      if (job.rollout_counters != nullptr) {
        job.rollout_counters->active = false;
        job.rollout_counters->SetMemory(nullptr);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < cards; ++r) {
    if (!status[r].ok()) {
      // The job fails with the card's error (a repeat report is ignored by
      // the controller once the job has failed).
      if (!absl::IsCancelled(status[r])) {
        report_setup_failure(status[r]).IgnoreError();
      }
      return absl::Status(status[r].code(),
                          absl::StrCat(assignment.job_id(), " card ", r, ": ",
                                       status[r].message()));
    }
  }
  spdlog::info("{}: {} done", node.node_id, assignment.job_id());
  return absl::OkStatus();
}

}  // namespace

Worker::Worker(std::shared_ptr<grpc::Channel> channel, WorkerOptions options)
    : state_(std::make_unique<State>()) {
  state_->channel = std::move(channel);
  state_->options = std::move(options);
  if (state_->options.host.empty()) state_->options.host = HostName();
  state_->node_stub = v1::NodeService::NewStub(state_->channel);
  state_->work_stub = v1::WorkService::NewStub(state_->channel);
  state_->weight_stub = v1::WeightService::NewStub(state_->channel);
  for (int i = 0; i < std::max(1, state_->options.cards); ++i) {
    state_->cards.push_back(std::make_unique<State::CardCounters>());
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
  reg.set_version("fusionrl-0.3");
  for (int i = 0; i < s.options.cards; ++i) {
    v1::Card* card = reg.add_cards();
    card->set_index(i);
    card->set_device(s.options.device == "cuda" ? absl::StrCat("cuda:", i)
                                                : s.options.device);
  }
  const absl::Time connect_deadline = absl::Now() + s.options.connect_timeout;
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
    if (absl::Now() >= connect_deadline || s.Stopping()) {
      return absl::UnavailableError(
          absl::StrCat("RegisterNode: controller unreachable for ",
                       absl::FormatDuration(s.options.connect_timeout), ": ",
                       st.error_message()));
    }
    absl::SleepFor(absl::Milliseconds(500));
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
    auto last = SteadyClock::now();
    while (!done.WaitForNotificationWithTimeout(s.heartbeat_interval)) {
      const auto now = SteadyClock::now();
      const double window = std::chrono::duration<double>(now - last).count();
      last = now;
      v1::HeartbeatRequest request;
      request.set_node_id(s.node_id);
      for (size_t i = 0; i < s.cards.size(); ++i) {
        const int64_t busy = s.cards[i]->busy_us.load();
        v1::CardState* card = request.add_cards();
        card->set_index(static_cast<int>(i));
        card->set_role(s.cards[i]->active
                           ? static_cast<v1::CardRole>(s.cards[i]->role.load())
                           : v1::CARD_ROLE_IDLE);
        if (std::shared_ptr<CardMemoryManager> m = s.cards[i]->Memory()) {
          for (const auto& [name, bytes] : m->Snapshot()) {
            (*card->mutable_memory_bytes())[name] = bytes;
          }
        }
        card->set_busy_fraction(
            window > 0 ? std::min(1.0, (busy - last_busy[i]) / 1e6 / window)
                       : 0);
        last_busy[i] = busy;
      }
      grpc::ClientContext ctx;
      s.Prepare(ctx, std::max(s.heartbeat_interval * 2, absl::Seconds(2)));
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
  absl::Status result;
  while (!s.Stopping()) {
    v1::GetAssignmentRequest request;
    request.set_node_id(s.node_id);
    request.set_wait_ms(static_cast<int32_t>(
        absl::ToInt64Milliseconds(s.options.poll_interval)));
    grpc::ClientContext ctx;
    s.Prepare(ctx, s.options.poll_interval + s.options.rpc_timeout);
    v1::GetAssignmentResponse assignment;
    grpc::Status st = s.work_stub->GetAssignment(&ctx, request, &assignment);
    if (!st.ok()) {
      if (st.error_code() == grpc::StatusCode::NOT_FOUND ||
          st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
          st.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        result =
            absl::Status(rpc::FromGrpcStatus(st).code(),
                         absl::StrCat("GetAssignment: ", st.error_message()));
        break;
      }
      spdlog::warn("worker {}: GetAssignment: {}", s.node_id,
                   st.error_message());
      absl::SleepFor(absl::Milliseconds(500));
      continue;
    }
    if (assignment.job_id().empty()) continue;
    absl::Status job = RunNodeJob(s, assignment);
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
