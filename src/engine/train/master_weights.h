// Mixed-precision AdamW: a policy computing in bfloat16 (or float16) is
// optimized through float32 master weights, as Megatron and FSDP do.
//
// AdamW stepping bf16 parameters directly loses every update smaller than
// half a unit in the last place of the weight (bf16 keeps 8 bits of
// mantissa: a weight of 0.02 moves in steps of ~1.2e-4, so at a learning
// rate of 1e-6 nothing moves at all). Here each low-precision parameter has
// a float32 master; AdamW's moments and step live on the masters, and after
// each step the parameter is set to its master rounded to the parameter's
// dtype. The model (forward, backward, rollout) keeps computing in the low
// precision. Float32 parameters need no master: AdamW steps them directly,
// exactly as before.
//
// A parameter overwritten from outside between steps (a weight sync, a
// restored snapshot) is authoritative: its master is re-read from it
// before the next step (MastersFromParameters), so the masters never undo a
// write they did not make.
//
// Not thread-safe (the trainer's thread).
#ifndef FUSIONRL_ENGINE_TRAIN_MASTER_WEIGHTS_H_
#define FUSIONRL_ENGINE_TRAIN_MASTER_WEIGHTS_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace torch::optim {
class AdamW;
}  // namespace torch::optim
namespace torch::serialize {
class InputArchive;
class OutputArchive;
}  // namespace torch::serialize

namespace fusionrl {

struct AdamWSettings {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

class MasterWeightAdamW {
 public:
  // `params`: the model's parameters (shared storage; the optimizer writes
  // them in Step()). Those not in float32 get a float32 master.
  MasterWeightAdamW(std::vector<at::Tensor> params,
                    const AdamWSettings& settings);
  ~MasterWeightAdamW();
  MasterWeightAdamW(const MasterWeightAdamW&) = delete;
  MasterWeightAdamW& operator=(const MasterWeightAdamW&) = delete;

  // Some parameter is in a low precision and has a float32 master.
  bool has_masters() const { return masters_ > 0; }

  // Zeroes the parameters' gradients (backward accumulates into them).
  void ZeroGrad();

  // Hands the parameters' gradients (as accumulated by backward, and
  // reduced across ranks) to the tensors AdamW steps: each master's gradient
  // becomes its parameter's, in float32. First re-reads any master whose
  // parameter was written from outside since the last Step(). Call once per
  // optimizer step, after the gradients are final and before clipping.
  void GradientsToMasters();

  // The tensors AdamW steps, whose gradients the clip reads and scales after
  // GradientsToMasters(): the float32 master of each low-precision
  // parameter, the parameter itself for a float32 one.
  const std::vector<at::Tensor>& stepped() const { return stepped_; }

  void SetLearningRate(double lr);

  // AdamW's step on stepped(), then every low-precision parameter set to its
  // master rounded to the parameter's dtype.
  void Step();

  // The AdamW state and the masters (key "master_weight/<i>"). Load() of an
  // archive without masters (written before they existed, or by a float32
  // run) takes them from the parameters.
  void Save(torch::serialize::OutputArchive& archive) const;
  void Load(torch::serialize::InputArchive& archive);

  // Moves the masters (with the AdamW state, by the caller) to `device`:
  // the optimizer's memory, offloaded with it.
  void MoveMastersTo(c10::Device device);

  // Bytes of the float32 masters (0 without).
  int64_t MasterBytes() const;

  torch::optim::AdamW& adamw() { return *adamw_; }
  const torch::optim::AdamW& adamw() const { return *adamw_; }

 private:
  // Re-reads each master whose parameter no longer equals the master
  // rounded to the parameter's dtype (written from outside).
  void MastersFromParameters();

  std::vector<at::Tensor> params_;
  // stepped_[i] is params_[i] (float32) or its master.
  std::vector<at::Tensor> stepped_;
  int masters_ = 0;
  std::unique_ptr<torch::optim::AdamW> adamw_;
};

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_TRAIN_MASTER_WEIGHTS_H_
