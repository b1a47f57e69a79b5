#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/model/model.h"
#include "engine/train/checkpoint.h"
#include "engine/train/trainer.h"
#include "spdlog/spdlog.h"
#include "worker/card_runner_impl.h"
#include "worker/fused_rollout.h"
#include "worker/hier_sync.h"

namespace fusionrl {

absl::Status CardRunner::KeepSyncPoint(int64_t step) {
  sync_points_.erase(sync_points_.lower_bound(step), sync_points_.end());
  while (sync_points_.size() > 1) sync_points_.erase(sync_points_.begin());
  FUSIONRL_ASSIGN_OR_RETURN(
      StepSnapshot kept,
      StepSnapshot::Take(*ctx_.policy, *trainer_, /*on_host=*/true));
  sync_points_.emplace(step, std::move(kept));
  return absl::OkStatus();
}

absl::Status CardRunner::EnterSkewedStep(const StepPlan& plan) {
  if (sync_points_.empty()) {
    // Every super node starts from the same weights: the first sync point.
    FUSIONRL_RETURN_IF_ERROR(KeepSyncPoint(plan.step - 1));
  }
  const bool rolled_back =
      plan.rollback_to_step >= 0 && plan.attempt != skewed_attempt_;
  skewed_attempt_ = plan.attempt;
  if (!rolled_back) return absl::OkStatus();
  auto it = sync_points_.find(plan.rollback_to_step);
  if (it == sync_points_.end()) {
    std::string kept;
    for (const auto& [step, point] : sync_points_) {
      absl::StrAppend(&kept, kept.empty() ? "" : ", ", step);
    }
    return absl::InternalError(
        absl::StrCat("StaleSync roll-back to the weight sync of step ",
                     plan.rollback_to_step, ": this card kept those of steps ",
                     kept, " only"));
  }
  if (job_.local_rank == 0) {
    spdlog::warn("{}: rolling back to the weight sync of step {} (attempt {})",
                 job_.node_id, plan.rollback_to_step, plan.attempt);
  }
  FUSIONRL_RETURN_IF_ERROR(it->second.Restore(*ctx_.policy, *trainer_));
  FUSIONRL_RETURN_IF_ERROR(GatherExperts());
  sync_points_.erase(std::next(it), sync_points_.end());
  if (fused_ != nullptr) {
    // Sample the steps again from the restored weights.
    PublishToRollout();
    fused_->Reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CardRunner::SyncWeights(const StepPlan& plan) {
  if (plan.nodes <= 1) return 0;  // one super node left: nothing to sync
  // Expert parallelism: a card's state is its shard's (its experts and
  // their AdamW moments besides the rest), so a card of another super node
  // takes that of the lead node's card holding the same shard (an expert
  // group never spans nodes under StaleSync across super nodes).
  const int shards = job_.experts != nullptr ? job_.experts->world_size() : 1;
  const int shard = job_.experts != nullptr ? job_.experts->rank() : 0;
  if (plan.c10d_data_plane) {
    // Broadcast over the nodes' group, one shard after the other: no
    // weight goes through the controller.
    int64_t bytes = 0;
    for (int r = 0; r < shards; ++r) {
      std::string blob;
      if (plan.node_rank == 0 && job_.local_rank == r) {
        FUSIONRL_ASSIGN_OR_RETURN(blob,
                                  SerializeState(*ctx_.policy, *trainer_));
      }
      FUSIONRL_RETURN_IF_ERROR(sync_->BroadcastFromLead(blob, r));
      if (plan.node_rank != 0 && shard == r) {
        FUSIONRL_RETURN_IF_ERROR(AdoptState(blob, *ctx_.policy, *trainer_));
      }
      bytes += static_cast<int64_t>(blob.size());  // 0 on the lead's others
    }
    return bytes;
  }
  const std::string key =
      absl::StrCat(job_.job_id, "/sync",
                   shards > 1 ? absl::StrCat("/shard", shard) : std::string());
  // A controller that went away took the weights it held: a restarted one
  // rolls the job back to its last weight sync, so the step is aborted
  // (the next plan restores that sync) rather than the job failed.
  auto lost = [&](const absl::Status& s) {
    return absl::Status(
        absl::IsUnavailable(s) ? absl::StatusCode::kAborted : s.code(),
        absl::StrCat("weight sync after step ", plan.step, ": ", s.message()));
  };
  if (plan.rank < shards) {  // the lead node's card of each shard
    FUSIONRL_ASSIGN_OR_RETURN(std::string blob,
                              SerializeState(*ctx_.policy, *trainer_));
    if (absl::Status s = job_.client->PublishWeights(
            key, plan.step, job_.super_node, blob, timeout_);
        !s.ok()) {
      return lost(s);
    }
    return static_cast<int64_t>(blob.size());
  }
  if (plan.rank < job_.local_cards) {
    return 0;  // the lead's node: identical to the lead card already
  }
  // The lead publishes after its own last exchange round, which waited for
  // ours: poll briefly until it is there.
  const absl::Time deadline = clock_.Now() + timeout_;
  for (;;) {
    absl::StatusOr<std::string> blob =
        job_.client->FetchWeights(key, plan.step, timeout_);
    if (blob.ok()) {
      FUSIONRL_RETURN_IF_ERROR(AdoptState(*blob, *ctx_.policy, *trainer_));
      return static_cast<int64_t>(blob->size());
    }
    if (!absl::IsNotFound(blob.status()) || clock_.Now() >= deadline) {
      return lost(blob.status());
    }
    SleepOnClock(clock_, absl::Milliseconds(20), absl::Milliseconds(20));
  }
}

}  // namespace fusionrl
