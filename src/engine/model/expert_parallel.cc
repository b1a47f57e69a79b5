#include "engine/model/expert_parallel.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/collectives/grad_sync.h"
#include "engine/kernels/invariant_ops.h"

namespace fusionrl {

bool IsExpertParameter(const std::string& name) {
  return name.find(".mlp.expert") != std::string::npos;
}

absl::Status GatherExperts(const PolicyModel& shard, PolicyModel& full) {
  if (full.expert_shard().size != 1 || full.lora() ||
      full.named_parameters().size() < shard.named_parameters().size()) {
    return absl::InvalidArgumentError(
        "GatherExperts: the target must hold every expert, without LoRA");
  }
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> mine;
  for (auto& [name, t] : shard.named_parameters()) mine.emplace(name, t);
  std::vector<at::Tensor> experts;
  for (auto& [name, t] : full.named_parameters()) {
    auto it = mine.find(name);
    const bool expert = IsExpertParameter(name);
    if (it == mine.end() && !expert) {
      return absl::InvalidArgumentError(
          absl::StrCat("GatherExperts: '", name, "' is not in the shard"));
    }
    if (it != mine.end()) {
      t.copy_(it->second);
    } else {
      t.zero_();
    }
    if (expert) experts.push_back(t);
  }
  if (shard.expert_shard().size == 1) return absl::OkStatus();
  GradientSync* group = shard.expert_group();
  if (group == nullptr) {
    return absl::FailedPreconditionError(
        "GatherExperts: an expert shard without its group");
  }
  if (experts.empty() || experts.front().scalar_type() == at::kFloat) {
    return group->AllReduceSum(experts);
  }
  // Other dtypes (bf16) travel as float32, which holds them exactly.
  std::vector<at::Tensor> wide;
  for (const at::Tensor& t : experts) wide.push_back(t.to(at::kFloat));
  FUSIONRL_RETURN_IF_ERROR(group->AllReduceSum(wide));
  for (size_t i = 0; i < experts.size(); ++i) experts[i].copy_(wide[i]);
  return absl::OkStatus();
}

std::vector<at::Tensor> DataParallelGradients(PolicyModel& model,
                                              bool with_experts) {
  const ExpertShard& shard = model.expert_shard();
  std::vector<at::Tensor> grads;
  std::map<std::string, at::Tensor> own_experts;
  for (auto& [name, p] : model.named_trainable_parameters()) {
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    if (shard.size > 1 && IsExpertParameter(name)) {
      own_experts.emplace(name, p.grad());
    } else {
      grads.push_back(p.grad());
    }
  }
  if (shard.size == 1 || !with_experts) return grads;
  const ModelConfig& c = model.config();
  const int first = shard.rank * (c.moe_experts / shard.size);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string prefix = absl::StrCat("block", l, ".mlp.expert");
    for (int e = 0; e < c.moe_experts; ++e) {
      for (const char* w : {".w1.weight", ".w3.weight", ".w2.weight"}) {
        auto it = own_experts.find(absl::StrCat(prefix, e, w));
        grads.push_back(it != own_experts.end()
                            ? it->second
                            : at::zeros_like(own_experts.at(
                                  absl::StrCat(prefix, first, w))));
      }
    }
  }
  return grads;
}

absl::StatusOr<double> ShardedGradNorm(const PolicyModel& model,
                                       const std::vector<at::Tensor>& params) {
  const auto named = model.named_trainable_parameters();
  std::vector<at::Tensor> dense, experts;
  for (size_t i = 0; i < params.size() && i < named.size(); ++i) {
    (IsExpertParameter(named[i].first) ? experts : dense).push_back(params[i]);
  }
  std::vector<double> sq = {InvariantGradSquaredNorm(experts)};
  FUSIONRL_RETURN_IF_ERROR(SumAcrossRanks(model.expert_group(), sq));
  return std::sqrt(InvariantGradSquaredNorm(dense) + sq[0]);
}

absl::StatusOr<double> ExpertLockstep::Forwards(double mine) {
  std::vector<double> forwards = {mine};
  const absl::Status status = SumAcrossRanks(group_, forwards);
  if (!status.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat("sampling in expert lockstep (rank ", group_->rank(),
                     " of ", group_->world_size(), "): ", status.message()));
  }
  return forwards[0];
}

absl::Status ExpertLockstep::Applies(const PolicyModel& model, bool fused,
                                     const char* what) {
  if (model.expert_shard().size > 1 && !fused) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": expert lockstep needs an expert shard of a MoE model"));
}

absl::Status ExpertLockstep::Announce() { return Forwards(1.0).status(); }

absl::Status ExpertLockstep::Finish(PolicyModel& model) {
  c10::InferenceMode inference;
  while (true) {
    FUSIONRL_ASSIGN_OR_RETURN(const double forwards, Forwards(0.0));
    if (forwards == 0) return absl::OkStatus();
    FUSIONRL_RETURN_IF_ERROR(model.JoinExpertExchanges());
    ++joins_;
  }
}

}  // namespace fusionrl
