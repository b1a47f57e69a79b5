// CpuDecoder: RolloutEngine's fused decode step on a CPU.
//
// One Step() feeds one token to each of the first n slots and returns their
// logits. Every buffer it touches (the KV cache of every layer, the hidden
// states, q/k/v, the attention output, the feed-forward's two halves, the
// logits) is allocated once, at construction, for `slots` rows; a step
// creates no tensor storage. Per layer it dispatches seven matmuls into
// those buffers (three projections, the output projection with the residual
// added in place, w1, w3, and w2 with the residual) and runs the small ops
// as fused kernels (engine/kernels/decode_kernels.h): 7 L + 2 ATen calls a
// step, where the composite ForwardCached dispatches about 40 L + 20.
//
// The cache is per slot and unpadded: slot s holds its sequence's keys and
// values at [0, length(s)) and its rotary position is its length. So slots
// are independent: a slot can be loaded with any prefilled prompt
// (LoadPrefill: prefix sharing copies one prefill into every sample of a
// group) and moved (MoveSlot: compaction keeps the live slots first, so a
// step computes only live rows).
//
// Supports(): a float32 dense policy (MoE and bfloat16 policies, and other
// devices, keep the composite path). Weights are read from the model at
// every step (views, no copies), so the decoder follows in-place weight
// updates; the model must outlive it. Not thread-safe.
#ifndef FUSIONRL_ENGINE_ROLLOUT_CPU_DECODER_H_
#define FUSIONRL_ENGINE_ROLLOUT_CPU_DECODER_H_

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/kernels/decode_kernels.h"
#include "engine/model/model.h"

namespace fusionrl {

class CpuDecoder {
 public:
  static bool Supports(const PolicyModel& model);

  // REQUIRES: Supports(model); capacity <= model.config().max_seq_len.
  CpuDecoder(const PolicyModel& model, int64_t slots, int64_t capacity);

  // Loads slot `slot` with `length` cache entries of row `row` of a prefill
  // cache (the model's KvCache layout), entries [offset, offset + length).
  void LoadPrefill(const KvCache& prefill, int64_t row, int64_t offset,
                   int64_t length, int64_t slot);
  // Moves slot `from` into slot `to` (its cache entries and length).
  void MoveSlot(int64_t from, int64_t to);
  // A slot's cache entries copied out: a multi-turn episode waiting on its
  // environment parks its slot (engine/rollout/episode_decoder.h) and is
  // restored into whichever slot is free when it continues.
  struct ParkedSlot {
    std::vector<float> entries;  // per layer: keys then values, per head
    int64_t length = 0;
  };
  void ParkSlot(int64_t slot, ParkedSlot* out) const;
  void RestoreSlot(const ParkedSlot& parked, int64_t slot);
  int64_t capacity() const { return capacity_; }

  // Rows of a step are split into this many blocks (fewer when a block would
  // hold under kMinRowsPerThread rows), each run through every layer by one
  // thread with a single-threaded BLAS. The blocks depend on this number and
  // the row count only, never on how many threads run them, so a step's
  // logits do not change when the thread count does (a matrix product on a
  // different block of rows differs in the last bits). Default: the intra-op
  // thread count at construction.
  void set_row_blocks(int64_t blocks) {
    row_blocks_ = std::max<int64_t>(1, blocks);
  }

  // Feeds tokens[s] to slot s for s < n and returns the logits [n, V], a
  // view of a buffer that the next Step() overwrites.
  const at::Tensor& Step(const int64_t* tokens, int64_t n);

  int64_t length(int64_t slot) const { return length_[slot]; }
  int64_t slots() const { return slots_; }
  // Bytes of the KV cache buffers.
  int64_t cache_bytes() const;

 private:
  struct Layer {
    at::Tensor attn_norm, wq_t, wk_t, wv_t, bq, bk, bv, q_norm, k_norm, wo_t;
    at::Tensor mlp_norm, w1_t, w3_t, w2_t;
    at::Tensor cache_k, cache_v;  // [slots, KvH, capacity, Dh]
  };
  // Fewer rows than this per thread are not worth a thread of their own.
  static constexpr int64_t kMinRowsPerThread = 4;

  // The step for rows [r0, r1): every layer, on one thread.
  void StepRows(const int64_t* tokens, int64_t r0, int64_t r1);
  static void Linear(at::Tensor& out, const at::Tensor& in,
                     const at::Tensor& w_t, const at::Tensor& bias);

  int64_t slots_, capacity_;
  int64_t row_blocks_;
  int64_t d_model_, d_ff_, vocab_;
  float eps_;
  decode::KvLayout layout_;
  at::Tensor embed_, final_norm_, head_t_, cos_, sin_;
  std::vector<Layer> layers_;
  at::Tensor x_, h_, q_, k_, v_, attn_, gate_, up_, logits_;  // [slots, ...]
  at::Tensor logits_rows_;       // logits_ narrowed to the last step's rows
  std::vector<int64_t> length_;  // cache entries per slot
  std::vector<int64_t> count_;   // length + 1 during a step
};

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_ROLLOUT_CPU_DECODER_H_
