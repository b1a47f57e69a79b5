// Kernels over the vocabulary dimension, for large vocabularies (Qwen's
// 151,936 ids): each reads a row of logits a fixed number of times and
// allocates nothing of the row's size, where the composite ATen path
// (softmax, cumsum, compare, log_softmax, gather) makes five to eight
// passes and as many [B, V] temporaries. On a CPU those passes, not the LM
// head's matmul, dominate a decode step and a training step of a small model
// with a large vocabulary.
//
//  * SampleRows: temperature sampling (or greedy) of one token per row, by
//    the inverse CDF with a given uniform per row, and its log-probability;
//    the same draw as softmax + cumsum + first index where the CDF reaches
//    u * total (RolloutEngine's composite path), accumulated in double.
//  * HeadLogProbs: log p(target) and the entropy of softmax(h W^T / T) for
//    N rows, with autograd through h and W. Forward keeps only h, the
//    targets and two floats a row; backward recomputes the logits of the
//    rows once and forms the gradient in place: the memory of one [N, V]
//    block at a time, in forward and backward.
//
// Thread safety: pure functions of their arguments.
#ifndef FUSIONRL_ENGINE_KERNELS_VOCAB_KERNELS_H_
#define FUSIONRL_ENGINE_KERNELS_VOCAB_KERNELS_H_

#include <ATen/core/Tensor.h>

namespace fusionrl {

struct SampledRows {
  at::Tensor tokens;  // int64 [B]
  at::Tensor logp;    // float [B]: log softmax(logits / T) at the token
};

// logits [B, V] (any float dtype, CPU); u [B] float in (0, 1]. temperature
// <= 0 is greedy (argmax; its log-prob is taken at temperature 1). The
// returned log-prob is that of softmax(logits / T) (T = 1 when greedy), as
// RolloutEngine records it.
SampledRows SampleRows(const at::Tensor& logits, const at::Tensor& u,
                       double temperature);

struct HeadStats {
  at::Tensor logp;     // float [N]
  at::Tensor entropy;  // float [N]
};

// For hidden states h [N, D] and the LM head's weight [V, D] (no bias):
// z = h W^T / temperature (float32), logp = z[target] - logsumexp(z),
// entropy = logsumexp(z) - sum softmax(z) z. Differentiable in h and
// weight (a custom autograd function). targets int64 [N].
HeadStats HeadLogProbs(const at::Tensor& h, const at::Tensor& weight,
                       const at::Tensor& targets, double temperature);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_KERNELS_VOCAB_KERNELS_H_
