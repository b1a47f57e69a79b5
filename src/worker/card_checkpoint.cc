#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/collectives/grad_sync.h"
#include "engine/model/model.h"
#include "engine/train/checkpoint.h"
#include "engine/train/trainer.h"
#include "spdlog/spdlog.h"
#include "worker/card_runner_impl.h"
#include "worker/fused_rollout.h"
#include "worker/step/rollout_prefetch.h"

namespace fusionrl {

std::function<void()> CardRunner::CheckpointPause() const {
  if (job_.debug_checkpoint_delay <= absl::ZeroDuration()) return {};
  return [this] { SleepOnClock(clock_, job_.debug_checkpoint_delay); };
}

absl::Status CardRunner::SavePrefetch(int64_t step) {
  if (fused_ == nullptr) return absl::OkStatus();
  Doing(absl::StrCat("keeping the rollout sampled ahead of step ", step));
  FUSIONRL_ASSIGN_OR_RETURN(std::optional<RolloutPrefetch> pending,
                            fused_->Pending(step, trainer_->version()));
  if (!pending) return absl::OkStatus();
  pending->checkpoint_step = step;
  pending->weights_crc32c = WeightsCrc32c(*ctx_.policy);
  return WriteRolloutPrefetch(
      RolloutPrefetchPath(config().output_dir + "/checkpoints", step,
                          pending->rank),
      *pending);
}

void CardRunner::SaveEndPrefetch(int64_t step) {
  if (end_prefetch_saved_) return;
  end_prefetch_saved_ = true;
  if (absl::Status s = SavePrefetch(step); !s.ok()) {
    spdlog::warn("{} card {}: {}; a resume samples the steps after {} afresh",
                 job_.node_id, job_.local_rank, s.ToString(), step);
  }
}

void CardRunner::RestorePrefetch(const StepPlan& plan) {
  const JobConfig& cfg = config();
  if (cfg.stalesync.rollout_version != RolloutVersion::kLagged) return;
  const std::string path = RolloutPrefetchPath(
      std::filesystem::path(job_.resume_checkpoint).parent_path().string(),
      resumed_step_, plan.rank);
  absl::StatusOr<RolloutPrefetch> saved = ReadRolloutPrefetch(path);
  std::string why;
  if (!saved.ok()) {
    why = std::string(saved.status().message());
  } else if (saved->checkpoint_step != resumed_step_ ||
             saved->rank != plan.rank ||
             saved->weights_crc32c != resumed_crc32c_) {
    why = absl::StrCat(path, " is not this checkpoint's (step ",
                       saved->checkpoint_step, ", rank ", saved->rank,
                       ", weights CRC ", saved->weights_crc32c, ")");
  } else if (saved->max_policy_lag != cfg.stalesync.max_policy_lag ||
             saved->prompts_per_step != cfg.rollout.prompts_per_step ||
             saved->partial_rollout_tokens !=
                 cfg.stalesync.partial_rollout_tokens ||
             saved->steps_per_version != cfg.stalesync.steps_per_version) {
    why = absl::StrCat(path, " was sampled with max_policy_lag ",
                       saved->max_policy_lag, ", prompts_per_step ",
                       saved->prompts_per_step, ", partial_rollout_tokens ",
                       saved->partial_rollout_tokens, " and steps_per_version ",
                       saved->steps_per_version);
  }
  if (samples_shard_) {
    // The cards of an expert group decode every round together: all of
    // them continue their pipelines, or none does.
    std::vector<double> kept = {why.empty() ? 0.0 : 1.0};
    if (absl::Status s = SumAcrossRanks(job_.experts, kept); !s.ok()) {
      why = absl::StrCat("the expert group could not agree: ", s.message());
    } else if (why.empty() && kept[0] > 0) {
      why = "another card of its expert group samples them afresh";
    }
  }
  if (!why.empty()) {
    spdlog::warn(
        "{} card {}: sampling the steps after {} afresh from the "
        "checkpoint's weights ({}): every prompt group is still trained "
        "once, but from other policy versions than an uninterrupted run",
        job_.node_id, job_.local_rank, resumed_step_, why);
    return;
  }
  spdlog::info(
      "{} card {}: continuing the rollout pipeline of step {} ({} "
      "batch(es) sampled ahead)",
      job_.node_id, job_.local_rank, resumed_step_, saved->batches.size());
  fused_->Restore(*std::move(saved));
}

absl::Status CardRunner::SaveExpertShard(const std::string& checkpoint,
                                         int rank, int64_t step) {
  if (job_.experts == nullptr || checkpoint.empty() || rank == 0 ||
      rank >= job_.experts->world_size()) {
    return absl::OkStatus();
  }
  Doing(absl::StrCat("writing expert shard ", rank, " of checkpoint ",
                     checkpoint));
  // Sampling from the shards, no card holds the whole model: each writes
  // its experts beside its optimizer state.
  return WriteExpertShard(config().output_dir + "/checkpoints/" + checkpoint,
                          rank, step, *trainer_,
                          samples_shard_ ? ctx_.policy.get() : nullptr);
}

absl::Status CardRunner::WriteStepCheckpoint(const StepPlan& plan, int64_t step,
                                             std::string* dir) {
  const JobConfig& cfg = config();
  CheckpointMeta meta{"rl",
                      cfg.name,
                      step,
                      trainer_->version(),
                      plan.data_cursor_after,
                      LoraBaseModel(cfg)};
  *dir = cfg.output_dir + "/checkpoints/" + plan.checkpoint_name;
  Doing(absl::StrCat("writing checkpoint ", plan.checkpoint_name));
  // Expert parallelism: model.pt holds every expert (the gathered model),
  // or (sampling from the shards) this card's shard, the others' experts
  // in files of their own; the other shards' optimizer states (and
  // experts) were written by their cards.
  if (job_.experts != nullptr) {
    meta.expert_parallel = job_.experts->world_size();
    meta.expert_weights_split = samples_shard_;
    // Written before the step's sum, or (the end checkpoint) by the cards
    // as they end: wait for them.
    const absl::Time deadline = clock_.Now() + timeout_;
    for (int r = 1; r < meta.expert_parallel; ++r) {
      const std::string path = ExpertShardOptimizerPath(*dir, r, step);
      while (!std::filesystem::exists(path)) {
        if (clock_.Now() >= deadline) {
          return absl::DeadlineExceededError(
              absl::StrCat("checkpoint '", *dir, "': expert shard ", r,
                           " did not write its optimizer state (", path,
                           ") within ", absl::FormatDuration(timeout_)));
        }
        SleepOnClock(clock_, absl::Milliseconds(20));
      }
    }
  }
  return WriteCheckpoint(*dir, RolloutSource(), trainer_.get(), meta,
                         CheckpointPause());
}

absl::Status CardRunner::WriteEndCheckpoint(const StepPlan& plan,
                                            std::string* dir) {
  const JobConfig& cfg = config();
  FUSIONRL_RETURN_IF_ERROR(WriteStepCheckpoint(plan, plan.step - 1, dir));
  // A job that ran to its end (not one stopped early) is exported.
  if (cfg.run.export_final && plan.checkpoint_name == "final") {
    if (!samples_shard_) {
      return ExportJobPolicy(cfg, ctx_, RolloutSource(),
                             cfg.output_dir + "/hf");
    }
    // The experts are in the shards' files: the whole model is read from
    // them on the host, for the export alone.
    std::unique_ptr<PolicyModel> whole = ctx_.policy->WholeFrozen(c10::kCPU);
    FUSIONRL_RETURN_IF_ERROR(ReadCheckpoint(*dir, *whole, nullptr).status());
    FUSIONRL_RETURN_IF_ERROR(
        ExportJobPolicy(cfg, ctx_, *whole, cfg.output_dir + "/hf"));
  }
  return absl::OkStatus();
}

}  // namespace fusionrl
