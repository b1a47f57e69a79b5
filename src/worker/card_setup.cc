#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/memory_manager.h"
#include "core/status_macros.h"
#include "engine/kernels/intra_op_threads.h"
#include "engine/model/expert_parallel.h"
#include "engine/model/model.h"
#include "engine/rollout/rollout.h"
#include "engine/train/activation_planner.h"
#include "engine/train/checkpoint.h"
#include "engine/train/memory_accounting.h"
#include "engine/train/trainer.h"
#include "rpc/remote_environment.h"
#include "spdlog/spdlog.h"
#include "worker/card_runner_impl.h"
#include "worker/controller_store.h"
#include "worker/fused_rollout.h"
#include "worker/hier_sync.h"
#include "worker/step/card_turns.h"
#include "worker/step/group_sampler.h"

namespace fusionrl {

absl::Status CardRunner::Setup() {
  const JobConfig& cfg = config();
  rpc::RegisterRemoteEnvironment();  // env.name: remote
  FUSIONRL_ASSIGN_OR_RETURN(ctx_, PrepareJob(cfg, std::string(), job_.device));
  sampler_ = std::make_unique<GroupSampler>(cfg, ctx_);
  // Each of the node's cards in the job gets an equal share of the threads.
  per_card_threads_ = std::max(1, job_.threads / job_.assigned_cards);
  SetIntraOpThreads(per_card_threads_);
  if (job_.experts != nullptr) {
    FUSIONRL_RETURN_IF_ERROR(CutExpertShard());
  }
  FUSIONRL_RETURN_IF_ERROR(MakeTrainerAndRollout());
  LogPolicy();
  if (!job_.resume_checkpoint.empty()) {
    FUSIONRL_ASSIGN_OR_RETURN(
        CheckpointMeta meta,
        ReadCheckpoint(job_.resume_checkpoint, *ctx_.policy, trainer_.get()));
    trainer_->set_version(meta.policy_version);
    resumed_step_ = meta.step;
    resumed_crc32c_ = WeightsCrc32c(*ctx_.policy);
    FUSIONRL_RETURN_IF_ERROR(GatherExperts());
  }
  LogExpertParallel();
  FUSIONRL_RETURN_IF_ERROR(BookMemory());
  const bool fused = cfg.placement.mode == PlacementMode::kFused;
  if (!fused && cfg.placement.mode != PlacementMode::kDisaggregated) {
    return absl::OkStatus();
  }
  return SetUpRolloutThread();
}

absl::Status CardRunner::CutExpertShard() {
  const JobConfig& cfg = config();
  // Expert parallelism: the model PrepareJob made (every expert, as a job
  // without shards starts) is cut into this card's shard, which trains;
  // a frozen copy of the whole stays for sampling (expert_sampling
  // gathered), or the shard samples too (shard).
  // model.activations.policy auto is planned here, on the whole model
  // (whose passes exchange nothing), and the group then takes its rank
  // 0's plan (Trainer::Create).
  FUSIONRL_RETURN_IF_ERROR(
      PlanActivationsForJob(*ctx_.policy,
                            std::max<int64_t>(1, cfg.optim.micro_batch_size))
          .status());
  const ExpertShard shard{job_.experts->rank(), job_.experts->world_size()};
  FUSIONRL_ASSIGN_OR_RETURN(std::unique_ptr<PolicyModel> mine,
                            ctx_.policy->ExpertShardOf(shard));
  mine->set_expert_group(job_.experts);
  samples_shard_ = cfg.placement.expert_sampling == ExpertSampling::kShard;
  if (!samples_shard_) gathered_ = ctx_.policy->CloneFrozen();
  ctx_.policy = std::move(mine);
  return absl::OkStatus();
}

absl::Status CardRunner::MakeTrainerAndRollout() {
  const JobConfig& cfg = config();
  PolicyModel& policy = *ctx_.policy;
  if (cfg.algorithm.kl_coef > 0) reference_ = policy.CloneFrozen();
  sync_ = MakeSync();
  sync_->set_activity_hook([this](const char* what, int64_t round) {
    Doing(what == nullptr
              ? absl::StrCat("training step ", plan_step_)
              : absl::StrCat(what, " round ", round, " of step ", plan_step_));
  });
  FUSIONRL_ASSIGN_OR_RETURN(
      trainer_, Trainer::Create(policy, reference_.get(), cfg,
                                ctx_.tokenizer->pad_id(), sync_.get()));
  // LoRA: rollout on a view of the policy (PolicyModel::CloneFrozen:
  // merged in float32, at the base model's decoding cost; unmerged in
  // bfloat16, where a merge would round the update away).
  if (policy.lora()) merged_ = policy.CloneFrozen();
  rollout_ =
      std::make_unique<RolloutEngine>(merged_ ? *merged_ : RolloutSource(),
                                      ctx_.tokenizer->pad_id(), ctx_.stop_ids);
  rollout_->Configure(cfg.rollout);
  rollout_->set_row_blocks(per_card_threads_);
  if (samples_shard_) rollout_->set_expert_lockstep(job_.experts);
  return absl::OkStatus();
}

void CardRunner::LogPolicy() const {
  if (job_.local_rank != 0) return;
  const JobConfig& cfg = config();
  const PolicyModel& policy = *ctx_.policy;
  spdlog::info(
      "[{}] {}: policy {} parameters on {} x {} card(s), task {} "
      "({} eval problems)",
      cfg.name, job_.node_id, policy.num_parameters(), job_.local_cards,
      ctx_.device.str(), ctx_.task->name(), ctx_.task->eval_set().size());
  if (!policy.lora()) return;
  const LoraConfig& l = cfg.model.lora;
  spdlog::info(
      "[{}] LoRA rank {} (alpha {}) on {}: {} trainable parameters, "
      "{:.1f} MiB a weight publish; base frozen",
      cfg.name, l.rank, l.alpha, l.targets, policy.num_trainable_parameters(),
      4.0 * policy.num_trainable_parameters() / 1048576.0);
}

void CardRunner::LogExpertParallel() const {
  if (job_.local_rank != 0 || job_.experts == nullptr) return;
  const JobConfig& cfg = config();
  spdlog::info(
      "[{}] expert parallel {}: each card trains {} parameters ({} experts "
      "of {} per block) and samples from {}",
      cfg.name, job_.experts->world_size(), ctx_.policy->num_parameters(),
      cfg.model.moe_experts / job_.experts->world_size(), cfg.model.moe_experts,
      samples_shard_ ? "its shard, in lockstep with its expert group"
                     : "all of them, gathered after every step");
}

absl::Status CardRunner::BookMemory() {
  const JobConfig& cfg = config();
  const PolicyModel& policy = *ctx_.policy;
  FUSIONRL_ASSIGN_OR_RETURN(
      memory_, CardMemoryManager::Create(job_.local_rank, cfg.memory));
  memory_->Set(MemoryCategory::kWeights,
               ParameterBytes(policy) +
                   (reference_ ? ParameterBytes(*reference_, &policy) : 0) +
                   (merged_ ? ParameterBytes(*merged_, &policy) : 0) +
                   (gathered_ ? ParameterBytes(*gathered_, &policy) : 0));
  memory_->Set(MemoryCategory::kOptimizer, OptimizerStateBytes(*trainer_));
  job_.counters->SetMemory(memory_);
  rollout_memory_ = memory_;
  if (job_.rollout_counters != nullptr) {
    FUSIONRL_ASSIGN_OR_RETURN(
        rollout_memory_,
        CardMemoryManager::Create(job_.local_rank, cfg.memory));
    job_.rollout_counters->SetMemory(rollout_memory_);
  }
  return absl::OkStatus();
}

std::unique_ptr<HierarchicalSync> CardRunner::MakeSync() {
  WorkClient* client = job_.client;
  auto header = [this](int64_t step, int64_t round) {
    return StepCallHeader{job_.job_id, job_.node_id, step, plan_attempt_,
                          round};
  };
  return std::make_unique<HierarchicalSync>(
      job_.local, job_.local_rank,
      [this, client, header](
          int64_t round, ReduceDtype dtype,
          std::string payload) -> absl::StatusOr<std::string> {
        ReduceCall call{header(plan_step_, round), dtype, std::move(payload)};
        return client->Reduce(std::move(call), timeout_);
      },
      [this, client, header](int64_t step, int64_t round, int64_t due_step,
                             std::string payload) {
        UpdateCall call{header(step, round), due_step, std::move(payload),
                        std::nullopt};
        return client->ExchangeUpdates(std::move(call), timeout_);
      },
      [this, client](int64_t generation, int node_rank, int nodes) {
        return FormCrossNodeGroup(client, job_.job_id, job_.node_id, generation,
                                  node_rank, nodes, timeout_);
      });
}

absl::Status CardRunner::GatherExperts() {
  if (gathered_ == nullptr) return absl::OkStatus();
  Doing(absl::StrCat("gathering the experts after step ", plan_step_));
  return fusionrl::GatherExperts(*ctx_.policy, *gathered_);
}

PolicyModel& CardRunner::SamplingPolicy() {
  if (gathered_ != nullptr) return *gathered_;
  if (merged_ == nullptr) return *ctx_.policy;
  merged_->LoadTrainable(ctx_.policy->trainable_parameters());
  return *merged_;
}

// The card's rollout thread while SetUpRolloutThread builds it.
struct CardRunner::RolloutThreadParts {
  FusedRollout::Options options;
  std::unique_ptr<PolicyModel> snapshot;  // what the thread samples from
  std::unique_ptr<RolloutEngine> engine;
  int train_threads = 1;  // the trainer's share of the card's threads
  // The decoder's row blocks: the card's whole thread budget.
  int card_threads = 1;
  // Fused with placement.fused_share_idle_threads: the rollout borrows the
  // trainer's idle threads; `trainer_shares`: the trainer borrows the
  // rollout's too.
  bool share = false;
  bool trainer_shares = false;
};

namespace {

// The job's StaleSync choices for the rollout thread, starting from policy
// version `version`.
FusedRollout::Options RolloutOptionsOf(const CardJob& job, int64_t version,
                                       absl::Duration timeout) {
  const JobConfig& cfg = *job.config;
  FusedRollout::Options fo;
  fo.max_policy_lag = cfg.stalesync.max_policy_lag;
  fo.lagged = cfg.stalesync.rollout_version == RolloutVersion::kLagged;
  fo.just_in_time =
      cfg.stalesync.rollout_version == RolloutVersion::kJustInTime;
  fo.prompts_per_step = cfg.rollout.prompts_per_step;
  fo.partial_rollout_tokens = cfg.stalesync.partial_rollout_tokens;
  fo.steps_per_version = cfg.stalesync.steps_per_version;
  fo.snapshot_version = version;
  fo.timeout = timeout;
  fo.freeze_snapshot_before_step =
      job.debug_freeze_rollout_snapshot_before_step;
  return fo;
}

}  // namespace

absl::Status CardRunner::SetUpRolloutThread() {
  RolloutThreadParts parts;
  parts.options = RolloutOptionsOf(job_, trainer_->version(), timeout_);
  FUSIONRL_RETURN_IF_ERROR(SplitRolloutThreads(parts));
  MakeRolloutThreadEngine(parts);
  SetUpTurns(parts);
  if (parts.share && parts.engine->fused()) ShareIdleTrainerThreads(parts);
  // Continuous batching across the steps StaleSync admits at once: only
  // where the engine refills slots (the fused path; the composite one
  // would hand every step over at the end of the round).
  if (parts.engine->fused() && config().rollout.cross_step_batching) {
    parts.options.max_steps_per_round =
        static_cast<int>(parts.options.max_policy_lag) + 1;
  }
  StartRolloutThread(parts);
  if (parts.trainer_shares) {
    FusedRollout* f = fused_.get();
    CardTurns* turns = turns_.get();
    trainer_->set_compute_hook([f, turns, train_threads = parts.train_threads,
                                card_threads = parts.card_threads] {
      const bool alone =
          !f->sampling() || (turns != nullptr && turns->interleaved());
      SetIntraOpThreads(alone ? card_threads : train_threads);
    });
  }
  PublishToRollout();
  return absl::OkStatus();
}

absl::Status CardRunner::SplitRolloutThreads(RolloutThreadParts& parts) {
  const JobConfig& cfg = config();
  FusedRollout::Options& fo = parts.options;
  parts.train_threads = per_card_threads_;
  if (cfg.placement.mode == PlacementMode::kFused) {
    // RL Fusion: this thread trains with half the card's threads, the
    // rollout thread samples with the rest; either borrows the other's
    // share while the other is idle.
    parts.train_threads = cfg.placement.fused_train_threads > 0
                              ? cfg.placement.fused_train_threads
                              : std::max(1, per_card_threads_ / 2);
    fo.rollout_threads =
        cfg.placement.fused_rollout_threads > 0
            ? cfg.placement.fused_rollout_threads
            : std::max(1, per_card_threads_ - parts.train_threads);
    parts.snapshot = RolloutSource().CloneFrozen();
    if (samples_shard_) {
      // The snapshot is the card's shard: its exchanges go over the
      // rollout's own group, beside the trainer's.
      parts.snapshot->set_expert_group(job_.rollout_experts);
    }
    // At s = 0 nothing can overlap (the next step samples from the weights
    // this step trains): the card samples between its steps, on its whole
    // thread budget, from the snapshot.
    fo.synchronous_on_caller = true;
  } else {
    // Disaggregated: this card trains with its whole share; the rollout
    // thread samples on its rollout card with that card's share (split
    // between the training cards it serves).
    const int served = std::max(1, job_.local_cards / job_.rollout_cards);
    fo.rollout_threads = std::max(1, per_card_threads_ / served);
    FUSIONRL_ASSIGN_OR_RETURN(c10::Device rollout_device,
                              ResolveDevice(job_.rollout_device));
    parts.snapshot = RolloutSource().CloneFrozen(rollout_device);
  }
  return absl::OkStatus();
}

void CardRunner::MakeRolloutThreadEngine(RolloutThreadParts& parts) {
  const JobConfig& cfg = config();
  rollout_memory_->Set(MemoryCategory::kSnapshot,
                       ParameterBytes(*parts.snapshot, ctx_.policy.get()));
  SetIntraOpThreads(parts.train_threads);
  parts.engine = std::make_unique<RolloutEngine>(
      *parts.snapshot, ctx_.tokenizer->pad_id(), ctx_.stop_ids);
  parts.engine->Configure(cfg.rollout);
  if (samples_shard_) parts.engine->set_expert_lockstep(job_.rollout_experts);
  // The decoder's rows are split as on a card that samples with all its
  // threads, whatever share the rollout holds at a step: the samples are
  // those of a colocated-sync run, and the same in every run.
  parts.card_threads = std::max(per_card_threads_, parts.train_threads);
  parts.engine->set_row_blocks(parts.card_threads);
  parts.share = cfg.placement.mode == PlacementMode::kFused &&
                cfg.placement.fused_share_idle_threads;
  // The trainer's step does not depend on its thread count either
  // (engine/kernels/invariant_ops.h), except through the composite attention
  // kernel's batched products: with it the trainer keeps its share.
  parts.trainer_shares =
      parts.share && (cfg.model.attention_kernel == AttentionKernel::kFused ||
                      !ctx_.policy->device().is_cpu());
}

void CardRunner::SetUpTurns(const RolloutThreadParts& parts) {
  const int64_t lag = parts.options.max_policy_lag;
  if (!parts.trainer_shares || !parts.engine->fused() || lag <= 0) return;
  // Both roles share every thread: the card measures whether they
  // compute faster at once or in turns (worker/step/card_turns.h).
  // auto on a CPU card takes turns without probing: both roles are bound
  // by the same cores there, concurrent never won on either benchmark,
  // and the probe's early blocks (answers still shortening) picked it on
  // configs/bench.yaml at 0.77x colocated-sync against interleaved's 1.00x
  // (docs/BENCHMARKS.md "auto on a CPU card"). probe measures anywhere.
  const FusedTurns want = config().placement.fused_turns;
  CardTurns::Options turns;
  turns.settle_steps = static_cast<int>(lag) + 1;
  turns.automatic =
      want == FusedTurns::kProbe ||
      (want == FusedTurns::kAuto && !ctx_.policy->device().is_cpu());
  turns.fixed = want == FusedTurns::kConcurrent ? CardTurns::Mode::kConcurrent
                                                : CardTurns::Mode::kInterleaved;
  turns_ = std::make_unique<CardTurns>(turns, clock_);
}

void CardRunner::ShareIdleTrainerThreads(RolloutThreadParts& parts) {
  // The rollout borrows the trainer's threads at every decode step the
  // trainer does not compute (the trainer does the same before each of
  // its forward passes, SetUpRolloutThread). Only on the fused decoder,
  // whose samples do not depend on its thread count.
  const int rollout_threads = parts.options.rollout_threads;
  const int card_threads = parts.card_threads;
  parts.engine->set_step_hook([this, rollout_threads, card_threads] {
    if (turns_ != nullptr && turns_->interleaved()) {
      // Waiting for its turn is not computing (the card's time split).
      // The engine's loop has no status to return: the round ends with
      // the exception (FusedRollout records it as the thread's error).
      overlap_.End(RoleOverlap::Role::kRollout);
      absl::Status s = turns_->RolloutStep(clock_.Now() + timeout_);
      overlap_.Begin(RoleOverlap::Role::kRollout);
      if (!s.ok()) throw std::runtime_error(std::string(s.message()));
      SetIntraOpThreads(card_threads);
      return;
    }
    SetIntraOpThreads(overlap_.Computing(RoleOverlap::Role::kTrainer)
                          ? rollout_threads
                          : card_threads);
  });
  parts.options.round_on_own_thread = true;
}

void CardRunner::StartRolloutThread(RolloutThreadParts& parts) {
  CardCounters* counters =
      job_.rollout_counters != nullptr ? job_.rollout_counters : job_.counters;
  CardMemoryManager* rollout_memory = rollout_memory_.get();
  const bool host_memory = ctx_.policy->device().is_cpu();
  // Where a round's KV cache was granted after an optimizer offload.
  auto offload = [this, rollout_memory, host_memory](const MemoryDecision& kv) {
    if (host_memory) {
      // Host and card are the same memory: only the books move.
      rollout_memory->OptimizerOffloaded(kv.offload_bytes);
      return absl::OkStatus();
    }
    // The trainer moves it before its next step (PrepareOptimizer).
    return rollout_memory->WaitOptimizerOffloaded(clock_,
                                                  clock_.Now() + timeout_);
  };
  fused_ = std::make_unique<FusedRollout>(
      std::move(parts.snapshot), std::move(parts.engine), parts.options,
      [this, rollout_memory, offload](
          RolloutEngine& engine, const std::vector<StepGroups>& steps, int rank,
          int64_t version, const GroupSampler::DeliverFn& deliver,
          const GroupSampler::SegmentEndFn& segment_end) {
        overlap_.Begin(RoleOverlap::Role::kRollout);
        absl::Cleanup done = [this] {
          if (turns_ != nullptr) turns_->RolloutIdle();
          overlap_.End(RoleOverlap::Role::kRollout);
        };
        return CountSamplingExchanges(engine.expert_lockstep(), [&] {
          return sampler_->SampleSteps(engine, steps, rank, version,
                                       *rollout_memory, offload, deliver,
                                       segment_end);
        });
      },
      [counters](double seconds) {
        counters->busy_us += static_cast<int64_t>(seconds * 1e6);
      },
      clock_);
}

}  // namespace fusionrl
