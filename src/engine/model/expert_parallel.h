// Expert parallelism (placement.expert_parallel; docs/moe.md): what the
// cards of an expert group do with their shards besides the forward's token
// exchange (engine/model/moe_module.h): gather the whole model, combine
// gradients with the other groups, take one norm. Shards are made by
// PolicyModel::ExpertShardOf; their activation plans are shared by
// ShareActivationPlan (engine/train/activation_planner.h).
//
// The collectives here are the group's: every rank of it calls them at the
// same point.
#ifndef FUSIONRL_ENGINE_MODEL_EXPERT_PARALLEL_H_
#define FUSIONRL_ENGINE_MODEL_EXPERT_PARALLEL_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model.h"

namespace fusionrl {

// A routed expert's parameter: "block<l>.mlp.expert<i>.<w>.weight".
bool IsExpertParameter(const std::string& name);

// Sets every parameter of `full` (a model of `shard`'s config holding every
// expert, on any device) from `shard`'s group: dense ones from `shard`,
// each expert from the rank that holds it. One sum over the group in which
// the ranks that do not hold an expert add zeros, so the values arrive bit
// for bit (bf16 travels as float32). A collective of the group.
absl::Status GatherExperts(const PolicyModel& shard, PolicyModel& full);

// The gradients a data-parallel sum combines, in the same order and with
// the same shapes on every rank: those of `model`'s dense parameters, then
// (with_experts) for each layer and each of the block's N experts in order
// its w1, w3, w2 gradients, this shard's own tensors (the sum replaces them
// in place) and zeros for the others'. A sum over ranks then adds each
// expert's gradient over the ranks that hold it, and only over those.
// Without shards: every trainable gradient. Undefined gradients are set to
// zeros first.
std::vector<at::Tensor> DataParallelGradients(PolicyModel& model,
                                              bool with_experts);

// The whole model's gradient norm from a shard: the dense part of `params`
// (trainable_parameters()'s order, or their float32 masters; equal on every
// rank) and every shard's experts, summed over `model`'s expert group.
absl::StatusOr<double> ShardedGradNorm(const PolicyModel& model,
                                       const std::vector<at::Tensor>& params);

// Sampling from expert shards in lockstep (RolloutEngine and
// EpisodeDecoder's set_expert_lockstep; docs/moe.md "Sampling from a
// shard"). Every rank of the group announces each forward it is about to
// run (a sum over the group); a rank done with its own work calls Finish,
// which joins the others' forwards with no tokens until no rank announces
// one. So every rank makes the same expert exchanges in the same order,
// whatever its prompts. One per decode call; every rank's call must end
// in Finish, whatever its outcome. Errors name the rank and the group's
// failure.
class ExpertLockstep {
 public:
  // `group`: the shard's expert group (borrowed).
  explicit ExpertLockstep(GradientSync* group) : group_(group) {}
  // Before each forward of this rank.
  absl::Status Announce();
  // After this rank's last forward: joins the group's remaining ones with
  // `model` (the expert shard; PolicyModel::JoinExpertExchanges).
  absl::Status Finish(PolicyModel& model);
  // Finish, then what the decode call in lockstep returns: `out`, or
  // Finish's error where `out` succeeded and Finish did not.
  template <typename T>
  absl::StatusOr<T> Finish(PolicyModel& model, absl::StatusOr<T> out) {
    const absl::Status finished = Finish(model);
    if (!out.ok() || finished.ok()) return out;
    return finished;
  }
  // OK where `what` (a decoder) can sample in lockstep from `model` on the
  // path it takes (`fused`: the fused CPU decoder, which takes no MoE
  // model): FailedPrecondition unless the model is an expert shard. The
  // same on every rank of a group, so all of them refuse and none waits.
  static absl::Status Applies(const PolicyModel& model, bool fused,
                              const char* what);
  // Forwards joined with no tokens.
  int64_t joins() const { return joins_; }

 private:
  absl::StatusOr<double> Forwards(double mine);

  GradientSync* group_;
  int64_t joins_ = 0;
};

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_MODEL_EXPERT_PARALLEL_H_
