#include "engine/rollout/cpu_decoder.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "engine/kernels/intra_op_threads.h"
#include "engine/model/attention.h"

namespace fusionrl {

bool CpuDecoder::Supports(const PolicyModel& model) {
  const ModelConfig& c = model.config();
  // An unmerged LoRA model's forward adds its adapters, which the fused
  // kernels do not read.
  return model.device().is_cpu() && c.dtype == "float32" &&
         c.moe_experts == 0 && (!model.lora() || model.lora_merged());
}

CpuDecoder::CpuDecoder(const PolicyModel& model, int64_t slots,
                       int64_t capacity)
    : slots_(slots), capacity_(capacity), row_blocks_(at::get_num_threads()) {
  const ModelConfig& c = model.config();
  std::map<std::string, at::Tensor> w;
  for (auto& [name, t] : model.named_parameters()) w[name] = t.detach();
  auto get = [&](const std::string& name) {
    auto it = w.find(name);
    return it == w.end() ? at::Tensor() : it->second;
  };
  d_model_ = c.d_model;
  d_ff_ = get("block0.mlp.w1.weight").size(0);
  vocab_ = model.vocab_size();
  eps_ = static_cast<float>(c.norm_eps);
  layout_.heads = c.n_heads;
  layout_.kv_heads = AttentionImpl::KvHeads(c);
  layout_.head_dim = AttentionImpl::HeadDim(c);
  layout_.capacity = capacity;
  embed_ = get("embed.weight");
  final_norm_ = get("norm.weight");
  at::Tensor head = get("lm_head.weight");
  head_t_ = (head.defined() ? head : embed_).t();
  auto [cos, sin] = RotaryTables(c);
  cos_ = cos.contiguous();
  sin_ = sin.contiguous();
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const int64_t q_width = layout_.heads * layout_.head_dim;
  const int64_t kv_width = layout_.kv_heads * layout_.head_dim;
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "block" + std::to_string(i) + ".";
    Layer l;
    l.attn_norm = get(p + "attn_norm.weight");
    l.wq_t = get(p + "attn.wq.weight").t();
    l.wk_t = get(p + "attn.wk.weight").t();
    l.wv_t = get(p + "attn.wv.weight").t();
    l.bq = get(p + "attn.wq.bias");
    l.bk = get(p + "attn.wk.bias");
    l.bv = get(p + "attn.wv.bias");
    l.q_norm = get(p + "attn.q_norm.weight");
    l.k_norm = get(p + "attn.k_norm.weight");
    l.wo_t = get(p + "attn.wo.weight").t();
    l.mlp_norm = get(p + "mlp_norm.weight");
    l.w1_t = get(p + "mlp.w1.weight").t();
    l.w3_t = get(p + "mlp.w3.weight").t();
    l.w2_t = get(p + "mlp.w2.weight").t();
    l.cache_k =
        at::empty({slots, layout_.kv_heads, capacity, layout_.head_dim}, f32);
    l.cache_v = at::empty_like(l.cache_k);
    layers_.push_back(std::move(l));
  }
  x_ = at::empty({slots, d_model_}, f32);
  h_ = at::empty({slots, d_model_}, f32);
  q_ = at::empty({slots, q_width}, f32);
  k_ = at::empty({slots, kv_width}, f32);
  v_ = at::empty({slots, kv_width}, f32);
  attn_ = at::empty({slots, q_width}, f32);
  gate_ = at::empty({slots, d_ff_}, f32);
  up_ = at::empty({slots, d_ff_}, f32);
  logits_ = at::empty({slots, vocab_}, f32);
  length_.assign(slots, 0);
  count_.assign(slots, 0);
}

int64_t CpuDecoder::cache_bytes() const {
  int64_t bytes = 0;
  for (const Layer& l : layers_) bytes += 2 * l.cache_k.nbytes();
  return bytes;
}

void CpuDecoder::LoadPrefill(const KvCache& prefill, int64_t row,
                             int64_t offset, int64_t length, int64_t slot) {
  TORCH_CHECK(length <= capacity_, "CpuDecoder: prefill of ", length,
              " entries exceeds the capacity ", capacity_);
  const int64_t dh = layout_.head_dim;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const at::Tensor& pk = prefill.keys[i];  // [U, KvH, cap, Dh]
    const at::Tensor& pv = prefill.values[i];
    TORCH_CHECK(pk.is_contiguous() && pk.scalar_type() == at::kFloat,
                "CpuDecoder: prefill cache must be contiguous float32");
    const int64_t pcap = pk.size(2);
    for (int64_t h = 0; h < layout_.kv_heads; ++h) {
      const int64_t src = ((row * layout_.kv_heads + h) * pcap + offset) * dh;
      const int64_t dst = (slot * layout_.kv_heads + h) * capacity_ * dh;
      std::memcpy(layers_[i].cache_k.data_ptr<float>() + dst,
                  pk.data_ptr<float>() + src, length * dh * sizeof(float));
      std::memcpy(layers_[i].cache_v.data_ptr<float>() + dst,
                  pv.data_ptr<float>() + src, length * dh * sizeof(float));
    }
  }
  length_[slot] = length;
}

void CpuDecoder::MoveSlot(int64_t from, int64_t to) {
  if (from == to) return;
  const int64_t dh = layout_.head_dim;
  for (Layer& l : layers_) {
    for (int64_t h = 0; h < layout_.kv_heads; ++h) {
      const int64_t src = (from * layout_.kv_heads + h) * capacity_ * dh;
      const int64_t dst = (to * layout_.kv_heads + h) * capacity_ * dh;
      std::memcpy(l.cache_k.data_ptr<float>() + dst,
                  l.cache_k.data_ptr<float>() + src,
                  length_[from] * dh * sizeof(float));
      std::memcpy(l.cache_v.data_ptr<float>() + dst,
                  l.cache_v.data_ptr<float>() + src,
                  length_[from] * dh * sizeof(float));
    }
  }
  length_[to] = length_[from];
}

void CpuDecoder::ParkSlot(int64_t slot, ParkedSlot* out) const {
  const int64_t dh = layout_.head_dim;
  const int64_t n = length_[slot] * dh;
  out->length = length_[slot];
  out->entries.resize(layers_.size() * 2 * layout_.kv_heads * n);
  float* dst = out->entries.data();
  for (const Layer& l : layers_) {
    for (const at::Tensor* cache : {&l.cache_k, &l.cache_v}) {
      for (int64_t h = 0; h < layout_.kv_heads; ++h) {
        const int64_t src = (slot * layout_.kv_heads + h) * capacity_ * dh;
        std::memcpy(dst, cache->data_ptr<float>() + src, n * sizeof(float));
        dst += n;
      }
    }
  }
}

void CpuDecoder::RestoreSlot(const ParkedSlot& parked, int64_t slot) {
  TORCH_CHECK(parked.length <= capacity_, "CpuDecoder: parked slot of ",
              parked.length, " entries exceeds the capacity ", capacity_);
  const int64_t dh = layout_.head_dim;
  const int64_t n = parked.length * dh;
  const float* src = parked.entries.data();
  for (Layer& l : layers_) {
    for (at::Tensor* cache : {&l.cache_k, &l.cache_v}) {
      for (int64_t h = 0; h < layout_.kv_heads; ++h) {
        const int64_t dst = (slot * layout_.kv_heads + h) * capacity_ * dh;
        std::memcpy(cache->data_ptr<float>() + dst, src, n * sizeof(float));
        src += n;
      }
    }
  }
  length_[slot] = parked.length;
}

void CpuDecoder::Linear(at::Tensor& out, const at::Tensor& in,
                        const at::Tensor& w_t, const at::Tensor& bias) {
  if (bias.defined()) {
    at::addmm_out(out, bias, in, w_t);
  } else {
    at::mm_out(out, in, w_t);
  }
}

const at::Tensor& CpuDecoder::Step(const int64_t* tokens, int64_t n) {
  TORCH_CHECK(n >= 1 && n <= slots_, "CpuDecoder: ", n, " rows of ", slots_);
  for (int64_t s = 0; s < n; ++s) {
    TORCH_CHECK(tokens[s] >= 0 && tokens[s] < vocab_, "CpuDecoder: token ",
                tokens[s], " outside the vocabulary");
    TORCH_CHECK(length_[s] < capacity_, "CpuDecoder: slot ", s, " is full");
    count_[s] = length_[s] + 1;
  }
  // Rows are independent through the whole stack, so each thread runs every
  // layer on its own block of rows, with a single-threaded BLAS
  // (RunBlocksAlone): no barrier between the ops of a step, and no small
  // GEMM split across threads, which on two threads measured slower than on
  // one. The blocks are fixed by row_blocks_ (set_row_blocks), not by the
  // threads that run them.
  const int64_t blocks =
      std::max<int64_t>(1, std::min(row_blocks_, n / kMinRowsPerThread));
  const int64_t rows = (n + blocks - 1) / blocks;
  auto run = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * rows;
      if (r0 < n) StepRows(tokens, r0, std::min(n, r0 + rows));
    }
  };
  RunBlocksAlone(blocks, run);
  for (int64_t s = 0; s < n; ++s) length_[s] = count_[s];
  if (!logits_rows_.defined() || logits_rows_.size(0) != n) {
    logits_rows_ = logits_.narrow(0, 0, n);
  }
  return logits_rows_;
}

void CpuDecoder::StepRows(const int64_t* tokens, int64_t r0, int64_t r1) {
  const int64_t n = r1 - r0;
  auto rows = [&](const at::Tensor& t) { return t.narrow(0, r0, n); };
  at::Tensor x = rows(x_), h = rows(h_), q = rows(q_), k = rows(k_),
             v = rows(v_), attn = rows(attn_), gate = rows(gate_),
             up = rows(up_), logits = rows(logits_);
  float* xp = x.data_ptr<float>();
  float* hp = h.data_ptr<float>();
  const float* embed = embed_.data_ptr<float>();
  for (int64_t s = 0; s < n; ++s) {
    std::memcpy(xp + s * d_model_, embed + tokens[r0 + s] * d_model_,
                d_model_ * sizeof(float));
  }
  const int64_t cache_row =
      layout_.kv_heads * layout_.capacity * layout_.head_dim;
  const int64_t* length = length_.data() + r0;
  const int64_t* count = count_.data() + r0;
  for (Layer& l : layers_) {
    float* ck = l.cache_k.data_ptr<float>() + r0 * cache_row;
    float* cv = l.cache_v.data_ptr<float>() + r0 * cache_row;
    decode::RmsNormRows(xp, l.attn_norm.data_ptr<float>(), hp, n, d_model_,
                        eps_);
    Linear(q, h, l.wq_t, l.bq);
    Linear(k, h, l.wk_t, l.bk);
    Linear(v, h, l.wv_t, l.bv);
    decode::RotaryAppendKv(
        q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
        cos_.data_ptr<float>(), sin_.data_ptr<float>(), length, length,
        l.q_norm.defined() ? l.q_norm.data_ptr<float>() : nullptr,
        l.k_norm.defined() ? l.k_norm.data_ptr<float>() : nullptr, eps_,
        layout_, ck, cv, n);
    decode::DecodeAttention(q.data_ptr<float>(), ck, cv, count, layout_,
                            attn.data_ptr<float>(), n);
    x.addmm_(attn, l.wo_t);
    decode::RmsNormRows(xp, l.mlp_norm.data_ptr<float>(), hp, n, d_model_,
                        eps_);
    at::mm_out(gate, h, l.w1_t);
    at::mm_out(up, h, l.w3_t);
    decode::SwiGluInPlace(gate.data_ptr<float>(), up.data_ptr<float>(),
                          n * d_ff_);
    x.addmm_(gate, l.w2_t);
  }
  decode::RmsNormRows(xp, final_norm_.data_ptr<float>(), hp, n, d_model_, eps_);
  at::mm_out(logits, h, head_t_);
}

}  // namespace fusionrl
