#include "engine/train/trainer_batch.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/kernels/invariant_ops.h"
#include "engine/kernels/vocab_kernels.h"
#include "engine/train/algorithms.h"

namespace fusionrl {

CollatedBatch Collate(const std::vector<Sample>& samples, int pad_id,
                      c10::Device device) {
  const int64_t batch = static_cast<int64_t>(samples.size());
  int64_t p_len = 1, r_len = 1;
  for (const auto& s : samples) {
    p_len = std::max<int64_t>(p_len, s.prompt_ids.size());
    r_len = std::max<int64_t>(r_len, s.response_ids.size());
  }
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  auto input_ids = at::full({batch, p_len + r_len}, pad_id, long_opts);
  auto valid = at::zeros({batch, p_len + r_len}, long_opts.dtype(at::kBool));
  auto resp_mask = at::zeros({batch, r_len}, at::kFloat);
  auto behaviour = at::zeros({batch, r_len}, at::kFloat);
  auto ids = input_ids.accessor<int64_t, 2>();
  auto val = valid.accessor<bool, 2>();
  auto mask = resp_mask.accessor<float, 2>();
  auto blp = behaviour.accessor<float, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    const auto& s = samples[b];
    const int64_t off = p_len - static_cast<int64_t>(s.prompt_ids.size());
    for (size_t j = 0; j < s.prompt_ids.size(); ++j) {
      ids[b][off + j] = s.prompt_ids[j];
      val[b][off + j] = true;
    }
    for (size_t j = 0; j < s.response_ids.size(); ++j) {
      ids[b][p_len + j] = s.response_ids[j];
      val[b][p_len + j] = true;
      const bool model_token = j >= s.loss_mask.size() || s.loss_mask[j];
      mask[b][j] = s.excluded || !model_token ? 0.0f : 1.0f;
      if (j < s.behaviour_logp.size()) blp[b][j] = s.behaviour_logp[j];
    }
  }
  CollatedBatch out;
  out.prompt_len = p_len;
  out.input_ids = input_ids.to(device);
  out.valid = valid.to(device);
  out.positions = PositionsFromValid(out.valid);
  out.response_ids = out.input_ids.narrow(1, p_len, r_len);
  out.response_mask = resp_mask.to(device);
  out.behaviour_logp = behaviour.to(device);
  return out;
}

absl::StatusOr<at::Tensor> CollateRoutes(const std::vector<Sample>& samples,
                                         const CollatedBatch& batch,
                                         const ModelConfig& config) {
  const int64_t width =
      static_cast<int64_t>(config.n_layers) * config.moe_top_k;
  bool any = false;
  for (const Sample& s : samples) any = any || !s.routes.empty();
  if (config.moe_experts == 0 || !any) return at::Tensor();
  const int64_t b_n = batch.input_ids.size(0), t_n = batch.input_ids.size(1);
  auto routes = at::full({b_n, t_n, config.n_layers, config.moe_top_k}, -1,
                         at::TensorOptions().dtype(at::kLong));
  int64_t* out = routes.data_ptr<int64_t>();
  for (int64_t b = 0; b < b_n; ++b) {
    const Sample& s = samples[b];
    const int64_t n = static_cast<int64_t>(s.routes.size());
    const int64_t tokens =
        static_cast<int64_t>(s.prompt_ids.size() + s.response_ids.size());
    if (n % width != 0 || n / width > tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trainer: sample ", b, " carries ", n,
          " routing entries: not whole tokens of n_layers * top_k = ", width,
          " experts within its ", tokens, " tokens"));
    }
    const int64_t off =
        batch.prompt_len - static_cast<int64_t>(s.prompt_ids.size());
    for (int64_t i = 0; i < n; ++i) {
      const int e = s.routes[i];
      if (e < 0 || e >= config.moe_experts) {
        return absl::InvalidArgumentError(absl::StrCat(
            "trainer: sample ", b, " routes token ", i / width, " to expert ",
            e, " (the model has ", config.moe_experts, ")"));
      }
      // Prompt positions are left-padded; the response follows the prompt
      // at column prompt_len.
      const int64_t pos = i / width;
      const int64_t col = pos < static_cast<int64_t>(s.prompt_ids.size())
                              ? off + pos
                              : batch.prompt_len + pos -
                                    static_cast<int64_t>(s.prompt_ids.size());
      out[(b * t_n + col) * width + i % width] = e;
    }
  }
  return routes.to(batch.input_ids.device());
}

RouteAgreement CompareRoutes(const at::Tensor& actual,
                             const at::Tensor& recorded) {
  at::NoGradGuard no_grad;
  const auto has = recorded.select(-1, 0).select(-1, 0).ge(0);  // [B, T]
  const auto a = std::get<0>(actual.sort(-1));
  const auto r = std::get<0>(recorded.sort(-1));
  const auto differs = a.ne(r).any(-1).any(-1).logical_and(has);
  RouteAgreement out;
  out.tokens = has.sum().item<double>();
  out.differing = differs.sum().item<double>();
  return out;
}

at::Tensor ResponseLogProbs(PolicyModel& model, const CollatedBatch& batch,
                            double temperature, at::Tensor* logits_out) {
  const int64_t r_len = batch.response_ids.size(1);
  auto logits = model.Forward(batch.input_ids, batch.positions, batch.valid)
                    .narrow(1, batch.prompt_len - 1, r_len)
                    .to(at::kFloat);
  if (temperature > 0 && temperature != 1.0) logits = logits / temperature;
  if (logits_out != nullptr) *logits_out = logits;
  return at::log_softmax(logits, -1)
      .gather(-1, batch.response_ids.unsqueeze(-1))
      .squeeze(-1);
}

ResponseTokenStats ResponseTokenLogProbs(PolicyModel& model,
                                         const CollatedBatch& batch,
                                         double temperature,
                                         int64_t chunk_tokens,
                                         bool with_entropy) {
  ResponseTokenStats out;
  if (chunk_tokens <= 0) {
    at::Tensor logits;
    out.logp = ResponseLogProbs(model, batch, temperature, &logits);
    if (with_entropy) out.entropy = algo::EntropyFromLogits(logits);
    return out;
  }
  const int64_t b = batch.response_ids.size(0);
  const int64_t r_len = batch.response_ids.size(1);
  // The logits of response token j are at position prompt_len - 1 + j.
  auto hidden = model
                    .ForwardHidden(batch.input_ids, batch.positions,
                                   batch.valid, batch.prompt_len - 1)
                    .narrow(1, 0, r_len);
  const int64_t d = hidden.size(2);
  // Real response positions only (padding never reaches the head).
  const auto index = batch.valid.narrow(1, batch.prompt_len, r_len)
                         .reshape(-1)
                         .nonzero()
                         .squeeze(-1);
  const int64_t n = index.size(0);
  const auto h = hidden.reshape({b * r_len, d}).index_select(0, index);
  const auto targets = batch.response_ids.reshape(-1).index_select(0, index);
  const at::Tensor weight = model.head_parameters()[0];
  std::vector<at::Tensor> logps, ents;
  for (int64_t start = 0; start < n; start += chunk_tokens) {
    const int64_t len = std::min(chunk_tokens, n - start);
    HeadStats stats = HeadLogProbs(h.narrow(0, start, len), weight,
                                   targets.narrow(0, start, len), temperature);
    logps.push_back(stats.logp);
    if (with_entropy) ents.push_back(stats.entropy);
  }
  auto scatter = [&](const std::vector<at::Tensor>& parts) {
    auto flat = at::zeros({b * r_len}, hidden.options().dtype(at::kFloat));
    if (!parts.empty()) flat = flat.index_copy(0, index, at::cat(parts));
    return flat.view({b, r_len});
  };
  out.logp = scatter(logps);
  if (with_entropy) out.entropy = scatter(ents);
  return out;
}

CollatedBatch Slice(const CollatedBatch& b, int64_t start, int64_t n) {
  CollatedBatch s;
  s.prompt_len = b.prompt_len;
  s.input_ids = b.input_ids.narrow(0, start, n);
  s.valid = b.valid.narrow(0, start, n);
  s.positions = b.positions.narrow(0, start, n);
  s.response_ids = b.response_ids.narrow(0, start, n);
  s.response_mask = b.response_mask.narrow(0, start, n);
  s.behaviour_logp = b.behaviour_logp.narrow(0, start, n);
  if (b.routes.defined()) s.routes = b.routes.narrow(0, start, n);
  return s;
}

CollatedBatch Trim(const CollatedBatch& b, int64_t p, int64_t r) {
  CollatedBatch s;
  const int64_t cut = b.prompt_len - p;
  s.prompt_len = p;
  s.input_ids = b.input_ids.narrow(1, cut, p + r);
  s.valid = b.valid.narrow(1, cut, p + r);
  s.positions = b.positions.narrow(1, cut, p + r);
  s.response_ids = b.response_ids.narrow(1, 0, r);
  s.response_mask = b.response_mask.narrow(1, 0, r);
  s.behaviour_logp = b.behaviour_logp.narrow(1, 0, r);
  if (b.routes.defined()) s.routes = b.routes.narrow(1, cut, p + r);
  return s;
}

CollatedBatch Rows(const CollatedBatch& b, const at::Tensor& index) {
  CollatedBatch s;
  s.prompt_len = b.prompt_len;
  s.input_ids = b.input_ids.index_select(0, index);
  s.valid = b.valid.index_select(0, index);
  s.positions = b.positions.index_select(0, index);
  s.response_ids = s.input_ids.narrow(1, b.prompt_len, b.response_ids.size(1));
  s.response_mask = b.response_mask.index_select(0, index);
  s.behaviour_logp = b.behaviour_logp.index_select(0, index);
  if (b.routes.defined()) s.routes = b.routes.index_select(0, index);
  return s;
}

double MaskedMean(const at::Tensor& x, const at::Tensor& mask) {
  const double denom = mask.sum().item<double>();
  return denom > 0 ? (x * mask).sum().item<double>() / denom : 0.0;
}

}  // namespace fusionrl
