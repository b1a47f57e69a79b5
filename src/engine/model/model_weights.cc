// PolicyModel (engine/model/model.h): its weights in and out: copies, frozen
// clones (and LoRA's views), expert shards and whole models, save
// and load (engine/train/checkpoint.h writes the directories).
#include <torch/serialize.h>

#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/model/model.h"
#include "engine/model/model_impl.h"

namespace fusionrl {

using model_internal::Decoder;
using model_internal::ModelDtype;

void PolicyModel::CopyWeightsFrom(const PolicyModel& other) {
  torch::NoGradGuard no_grad;
  auto dst = impl_->decoder->parameters();
  auto src = other.impl_->decoder->parameters();
  TORCH_CHECK(dst.size() == src.size(), "CopyWeightsFrom: different models");
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  if (lora() && other.lora() && !other.lora_merged()) {
    LoadTrainable(other.trainable_parameters());
  }
}

std::unique_ptr<PolicyModel> PolicyModel::CloneFrozen() const {
  return CloneFrozen(impl_->device);
}

std::unique_ptr<PolicyModel> PolicyModel::CloneFrozen(
    c10::Device device) const {
  // LoRA: float32 merges (the merge rounds at float32's spacing, and the
  // fused decoder reads plain weights); bfloat16 does not, since W + s B A
  // rounded back to bfloat16 loses every update below W's spacing.
  const bool merge = impl_->config.dtype == "float32";
  auto impl =
      std::make_unique<Impl>(impl_->config, impl_->vocab_size, device, nullptr);
  impl->decoder = Decoder(impl_->config, impl_->vocab_size, impl_->shard);
  impl->decoder->to(device, ModelDtype(impl_->config));
  impl->shard = impl_->shard;
  std::unique_ptr<PolicyModel> clone(new PolicyModel(std::move(impl)));
  clone->set_expert_group(impl_->expert_group);
  if (!lora()) {
    clone->CopyWeightsFrom(*this);
  } else {
    // A view: untargeted tensors shared on the same device; the targeted
    // weights merged from the base (shared too), or, unmerged, the base
    // itself shared with the adapters copied.
    torch::NoGradGuard no_grad;
    // Each targeted weight's base (a merged source's own base).
    std::unordered_map<const void*, at::Tensor> base_of;
    for (const auto& slot : impl_->lora) {
      base_of[slot->weight.unsafeGetTensorImpl()] =
          slot->base.defined() ? slot->base : slot->weight;
    }
    const bool same_device = device == impl_->device;
    auto dst = clone->impl_->decoder->named_parameters();
    auto src = impl_->decoder->named_parameters();
    std::map<std::string, at::Tensor> by_name;
    for (size_t i = 0; i < dst.size(); ++i) {
      at::Tensor d = dst[i].value();
      const at::Tensor& from = src[i].value();
      const auto target = base_of.find(from.unsafeGetTensorImpl());
      const bool is_target = target != base_of.end();
      if (is_target && !merge) {
        const at::Tensor& base = target->second;
        if (same_device) {
          d.set_data(base.detach());
        } else {
          d.copy_(base);
        }
      } else if (same_device && !is_target) {
        d.set_data(from.detach());
      } else if (!is_target) {
        d.copy_(from);
      }
      by_name[dst[i].key()] = d;
    }
    Impl& ci = *clone->impl_;
    // The clone's modules, by slot name, to point at its adapters.
    std::map<std::string, const LoraAdapter**> hooks;
    for (const auto& target :
         ci.LoraTargets(ParseLoraTargets(ci.config.lora.targets).value())) {
      hooks[target.name] = target.hook;
    }
    for (const auto& source : impl_->lora) {
      const LoraSlot& slot = *source;
      auto copy = std::make_unique<LoraSlot>();
      copy->name = slot.name;
      copy->weight = by_name.at(slot.name + ".weight");
      if (merge) {
        const at::Tensor& base = slot.base.defined() ? slot.base : slot.weight;
        copy->base = same_device ? base.detach() : base.detach().to(device);
      }
      copy->adapter = slot.adapter;
      copy->adapter.a = slot.adapter.a.detach().to(
          device, /*non_blocking=*/false, /*copy=*/true);
      copy->adapter.b = slot.adapter.b.detach().to(device, false, true);
      copy->adapter.dropout_seed = nullptr;
      if (!merge) *hooks.at(slot.name) = &copy->adapter;
      ci.lora.push_back(std::move(copy));
    }
    ci.lora_merged = merge;
    ci.lora_view = true;
    if (merge) ci.Remerge();
  }
  for (auto& p : clone->impl_->decoder->parameters())
    p.set_requires_grad(false);
  clone->set_training(false);
  return clone;
}

absl::StatusOr<std::unique_ptr<PolicyModel>> PolicyModel::ExpertShardOf(
    ExpertShard shard) const {
  const ModelConfig& c = impl_->config;
  if (c.moe_experts == 0 || impl_->shard.size != 1 || lora() ||
      shard.size < 1 || c.moe_experts % shard.size != 0 || shard.rank < 0 ||
      shard.rank >= shard.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert shard ", shard.rank, " of ", shard.size,
        ": needs a mixture-of-experts model holding every expert, without "
        "LoRA, and a shard count dividing model.moe_experts (",
        c.moe_experts, ")"));
  }
  auto impl =
      std::make_unique<Impl>(c, impl_->vocab_size, impl_->device, nullptr);
  try {
    impl->decoder = Decoder(c, impl_->vocab_size, shard);
    impl->decoder->to(impl_->device, ModelDtype(c));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("expert shard: ", e.what_without_backtrace()));
  }
  impl->shard = shard;
  std::unique_ptr<PolicyModel> model(new PolicyModel(std::move(impl)));
  {
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> mine;
    for (auto& [name, t] : named_parameters()) mine.emplace(name, t);
    for (auto& [name, t] : model->named_parameters()) t.copy_(mine.at(name));
  }
  FUSIONRL_RETURN_IF_ERROR(model->SetActivationPlan(activation_plan()));
  return model;
}

const ExpertShard& PolicyModel::expert_shard() const { return impl_->shard; }

std::unique_ptr<PolicyModel> PolicyModel::WholeFrozen(
    c10::Device device) const {
  auto impl =
      std::make_unique<Impl>(impl_->config, impl_->vocab_size, device, nullptr);
  impl->decoder = Decoder(impl_->config, impl_->vocab_size);
  impl->decoder->to(device, ModelDtype(impl_->config));
  std::unique_ptr<PolicyModel> whole(new PolicyModel(std::move(impl)));
  for (auto& p : whole->impl_->decoder->parameters()) {
    p.set_requires_grad(false);
  }
  whole->set_training(false);
  return whole;
}

absl::Status PolicyModel::Save(const std::string& path) const {
  return Save(path, [](const std::string&) { return true; });
}

absl::Status PolicyModel::Save(
    const std::string& path,
    const std::function<bool(const std::string&)>& keep) const {
  try {
    torch::serialize::OutputArchive archive;
    for (const auto& [name, value] : named_trainable_parameters()) {
      if (keep(name)) archive.write(name, value.detach().to(torch::kCPU));
    }
    archive.save_to(path);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot write weights to '", path,
                                            "': ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status PolicyModel::Load(const std::string& path) {
  return Load(std::vector<std::string>{path});
}

absl::Status PolicyModel::Load(const std::vector<std::string>& paths) {
  if (paths.empty()) {
    return absl::InvalidArgumentError("Load: no weight archive to read");
  }
  const std::string& path = paths.front();  // named in errors
  std::vector<torch::serialize::InputArchive> archives(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    try {
      archives[i].load_from(paths[i]);
    } catch (const c10::Error& e) {
      return absl::DataLossError(
          absl::StrCat("cannot read weights from '", paths[i],
                       "': ", e.what_without_backtrace()));
    }
  }
  torch::NoGradGuard no_grad;
  // A LoRA model reads the adapters of a LoRA archive, or the base weights
  // of a full one; a full model refuses a LoRA archive by name.
  bool has_adapters = false;
  for (const std::string& key : archives.front().keys()) {
    has_adapters = has_adapters || absl::EndsWith(key, ".lora_A");
  }
  if (has_adapters && !lora()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", path,
        "' holds LoRA adapters, not a full model: set model.lora as in the "
        "run that wrote it (its config.yaml), or export it merged (fusionrl "
        "export --merge)"));
  }
  const bool adapters = lora() && has_adapters;
  if (impl_->lora_view && !adapters) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", path, "': a LoRA view (its base shared) takes adapters only"));
  }
  std::vector<std::pair<std::string, at::Tensor>> wanted;
  if (adapters) {
    wanted = named_trainable_parameters();
  } else {
    for (auto& item : impl_->decoder->named_parameters()) {
      wanted.emplace_back(item.key(), item.value());
    }
  }
  for (auto& [name, value] : wanted) {
    torch::Tensor stored;
    bool found = false;
    for (auto& archive : archives) {
      if (archive.try_read(name, stored)) {
        found = true;
        break;
      }
    }
    if (!found) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", path, "'",
          paths.size() > 1 ? " and its expert shards' files have" : " has",
          " no tensor '", name,
          adapters
              ? "': the adapters were made with other model.lora "
                "targets (its config.yaml says which)"
              : "': the checkpoint was made for a different model config"));
    }
    if (stored.sizes() != value.sizes()) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", path, "': tensor '", name, "' has shape ",
                       c10::str(stored.sizes()), " but the model config needs ",
                       c10::str(value.sizes()),
                       adapters ? " (another model.lora.rank?)" : ""));
    }
    value.copy_(stored);
  }
  if (impl_->lora_merged) impl_->Remerge();
  return absl::OkStatus();
}

}  // namespace fusionrl
