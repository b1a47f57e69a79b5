#include "worker/step/step_snapshot.h"

#include <ATen/ATen.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"
#include "core/status_macros.h"
#include "engine/model/model.h"
#include "engine/train/trainer.h"

namespace fusionrl {

absl::StatusOr<StepSnapshot> StepSnapshot::Take(PolicyModel& policy,
                                                const Trainer& trainer,
                                                bool on_host) {
  StepSnapshot s;
  for (const at::Tensor& p : policy.trainable_parameters()) {
    s.params.push_back(on_host ? p.detach().to(at::kCPU, /*non_blocking=*/false,
                                               /*copy=*/true)
                               : p.detach().clone());
  }
  FUSIONRL_ASSIGN_OR_RETURN(s.optimizer, trainer.OptimizerState());
  s.version = trainer.version();
  return s;
}

absl::Status StepSnapshot::Restore(PolicyModel& policy,
                                   Trainer& trainer) const {
  const StepSnapshot& s = *this;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params = policy.trainable_parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(s.params[i]);
  FUSIONRL_RETURN_IF_ERROR(trainer.RestoreOptimizerState(s.optimizer));
  trainer.set_version(s.version);
  return absl::OkStatus();
}

namespace {

// The weights' raw bytes in parameter order (what a weight sync copies and
// its CRC-32C covers).
std::string WeightBytes(PolicyModel& policy) {
  std::string out;
  for (const at::Tensor& p : policy.trainable_parameters()) {
    const at::Tensor c = p.detach().to(at::kCPU).contiguous();
    out.append(static_cast<const char*>(c.data_ptr()),
               c.numel() * c.element_size());
  }
  return out;
}

}  // namespace

uint32_t WeightsCrc32c(PolicyModel& policy) {
  return Crc32c(WeightBytes(policy));
}

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
  std::vector<at::Tensor> params = policy.trainable_parameters();
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

}  // namespace fusionrl
