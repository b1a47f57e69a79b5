#include "engine/train/activation_memory.h"

#include <ATen/ATen.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/model/model.h"
#include "engine/train/memory_accounting.h"
#include "engine/train/trainer.h"

namespace fusionrl {

at::Tensor DefaultStepLoss(PolicyModel& model, const CollatedBatch& batch,
                           const at::Tensor& logits) {
  const int64_t t = batch.input_ids.size(1);
  auto logp = at::log_softmax(logits.narrow(1, 0, t - 1), -1);
  auto target = batch.input_ids.narrow(1, 1, t - 1);
  auto mask =
      (batch.valid.narrow(1, 1, t - 1) & batch.valid.narrow(1, 0, t - 1))
          .to(logp.scalar_type());
  auto nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1);
  auto loss = (nll * mask).sum() / mask.sum().clamp_min(1);
  at::Tensor aux = model.AuxLoss();
  if (aux.defined()) loss = loss + aux;
  return loss;
}

absl::StatusOr<ActivationReport> MeasureTrainStep(PolicyModel& model,
                                                  const CollatedBatch& batch,
                                                  const StepLoss& loss_fn,
                                                  bool run_backward) {
  ActivationReport report;
  ActivationHostPool& pool = model.activation_host_pool();
  const int64_t pool_before = pool.current_bytes();
  pool.ResetPeak();
  try {
    model.set_training(true);
    at::AutoGradMode grad_on(true);
    at::Tensor loss;
    {
      ScopedAllocationCounter counter(model.device());
      const absl::Time start = absl::Now();
      at::Tensor logits =
          model.Forward(batch.input_ids, batch.positions, batch.valid);
      loss = loss_fn ? loss_fn(model, batch, logits)
                     : DefaultStepLoss(model, batch, logits);
      logits.reset();
      // item() waits for the device, so the time is the forward's own.
      report.loss = loss.item<double>();
      report.forward_time = absl::Now() - start;
      report.host_pool_bytes = pool.current_bytes() - pool_before;
      // On a CPU device the pool's copies were allocated by the same
      // allocator on this thread: the counter saw them.
      const int64_t pool_seen =
          model.device().is_cpu() ? report.host_pool_bytes : 0;
      report.device_held_bytes = counter.current_bytes() - pool_seen;
      report.device_peak_bytes = counter.peak_bytes();
    }
    report.held_bytes = report.device_held_bytes +
                        (model.device().is_cpu() ? report.host_pool_bytes : 0);
    if (!run_backward) return report;
    const absl::Time start = absl::Now();
    loss.backward();
    if (!model.device().is_cpu()) {
      // Wait for the backward kernels (a host read syncs the stream).
      for (const at::Tensor& p : model.trainable_parameters()) {
        if (p.grad().defined()) {
          p.grad().sum().item<double>();
          break;
        }
      }
    }
    report.backward_time = absl::Now() - start;
    report.host_pool_peak_bytes = pool.peak_bytes() - pool_before;
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("training step failed: ", e.what_without_backtrace()));
  }
  return report;
}

}  // namespace fusionrl
