// The trainer's batch: collating samples into padded tensors
// (CollatedBatch, declared in engine/train/trainer.h with Collate and the
// response log-prob passes), and the row and column views the trainer's
// mini- and micro-batches take of it. Internal to engine/.
#ifndef FUSIONRL_ENGINE_TRAIN_TRAINER_BATCH_H_
#define FUSIONRL_ENGINE_TRAIN_TRAINER_BATCH_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "engine/train/trainer.h"

namespace fusionrl {

// Rows [start, start + n) of every tensor in the batch.
CollatedBatch Slice(const CollatedBatch& b, int64_t start, int64_t n);

// `b` without the padding columns no row uses: prompts trimmed to the
// longest `p` tokens (they are left-padded), responses to the longest `r`.
// Positions are kept, so every real token computes what it did untrimmed.
CollatedBatch Trim(const CollatedBatch& b, int64_t p, int64_t r);

// Rows `index` (int64, on the batch's device) of every tensor in the batch.
CollatedBatch Rows(const CollatedBatch& b, const at::Tensor& index);

// Router replay's measure: of the tokens with a recorded routing
// (recorded[b, t, 0, 0] >= 0), how many ran on another set of experts at
// some layer. actual and recorded [B, T, n_layers, top_k] int64.
struct RouteAgreement {
  double tokens = 0;
  double differing = 0;
};
RouteAgreement CompareRoutes(const at::Tensor& actual,
                             const at::Tensor& recorded);

// The mean of `x` over the positions where `mask` is 1 (0 for none).
double MaskedMean(const at::Tensor& x, const at::Tensor& mask);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_TRAIN_TRAINER_BATCH_H_
