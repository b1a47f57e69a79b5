// decoder_logits_dump: the logits of every decoder path of the engine on a
// Hugging Face directory, written to a safetensors file for the float64
// reference test (tests/decoder_logits_reference.py, which also says what
// each path is; docs/testing.md). A test tool: it compares nothing itself.
//
// Usage: decoder_logits_dump REQUEST.json
//   {"jobs": [{"name", "dir", "dtype": "float32" | "bfloat16",
//              "sequences": {"ids": [[...], ...], "prompt_len": [...]},
//              "greedy_new_tokens": N, "out": "PATH.safetensors"}]}
// Writes, per sequence b (F32 unless said): forward/b, forward_composite/b,
// kv_cache/b [T, V]; cpu_decoder/b [T - P, V] (the logits after feeding
// tokens P..T-1); trainer_logp/b, trainer_logp_full/b [T - P] (log-probs of
// tokens P..T-1); rollout_{fused,composite}/b/tokens (I64) and /logp [N]
// (greedy from the first P tokens). Paths a dtype does not have (the fused
// decoder and core in bfloat16) are left out. Exit 1 with the reason on
// any error.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/hf_config.h"
#include "engine/model/hf_model.h"
#include "engine/model/model.h"
#include "engine/rollout/cpu_decoder.h"
#include "engine/rollout/rollout.h"
#include "engine/rollout/sample.h"
#include "engine/train/trainer.h"
#include "hf/safetensors.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

struct Job {
  std::string name, dir, dtype, out;
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> prompt_len;
  int greedy_new_tokens = 0;
};

// Tensors to write, kept alive until the file is written.
class Dump {
 public:
  void Add(const std::string& name, const at::Tensor& t) {
    tensors_.emplace_back(name, t.detach().contiguous());
  }
  absl::Status Write(const std::string& path) const {
    std::vector<StTensorView> views;
    for (const auto& [name, t] : tensors_) {
      const StDtype dtype =
          t.scalar_type() == at::kLong ? StDtype::kI64 : StDtype::kF32;
      views.push_back({name, dtype, t.sizes().vec(), t.data_ptr(),
                       static_cast<size_t>(t.nbytes())});
    }
    return WriteSafetensors(path, views, {});
  }

 private:
  std::vector<std::pair<std::string, at::Tensor>> tensors_;
};

absl::StatusOr<std::unique_ptr<PolicyModel>> LoadModel(const Job& job,
                                                       AttentionKernel kernel) {
  absl::StatusOr<HfModelInfo> info = ReadHfModelConfig(job.dir);
  if (!info.ok()) return info.status();
  ModelConfig m = info->model;
  m.max_seq_len = info->max_position_embeddings;
  m.dtype = job.dtype;
  m.attention_kernel = kernel;
  absl::StatusOr<std::unique_ptr<PolicyModel>> model =
      PolicyModel::Create(m, m.vocab_size, c10::Device("cpu"), 0);
  if (!model.ok()) return model.status();
  if (absl::Status s = LoadHfWeights(job.dir, **model); !s.ok()) return s;
  return model;
}

at::Tensor Row(const std::vector<int64_t>& ids, int64_t begin, int64_t end) {
  return at::tensor(
             std::vector<int64_t>(ids.begin() + begin, ids.begin() + end),
             at::TensorOptions().dtype(at::kLong))
      .unsqueeze(0);
}

// Forward() of the sequences left-padded into one batch: each sequence's
// logits at its own positions.
void FullForward(PolicyModel& model, const Job& job, const std::string& path,
                 Dump& dump) {
  at::NoGradGuard no_grad;
  int64_t t_max = 0;
  for (const auto& s : job.ids) t_max = std::max<int64_t>(t_max, s.size());
  const int64_t b_n = job.ids.size();
  at::Tensor tokens = at::zeros({b_n, t_max}, at::kLong);
  at::Tensor valid = at::zeros({b_n, t_max}, at::kBool);
  for (int64_t b = 0; b < b_n; ++b) {
    const int64_t t = job.ids[b].size();
    tokens[b].narrow(0, t_max - t, t).copy_(Row(job.ids[b], 0, t)[0]);
    valid[b].narrow(0, t_max - t, t).fill_(true);
  }
  const at::Tensor logits =
      model.Forward(tokens, PositionsFromValid(valid), valid);
  for (int64_t b = 0; b < b_n; ++b) {
    const int64_t t = job.ids[b].size();
    dump.Add(absl::StrCat(path, "/", b),
             logits[b].narrow(0, t_max - t, t).to(at::kFloat));
  }
}

// ForwardCached: the prompt in one call, then one token a call.
void KvCacheDecode(PolicyModel& model, const Job& job, Dump& dump) {
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < job.ids.size(); ++b) {
    const auto& ids = job.ids[b];
    const int64_t t = ids.size(), p = job.prompt_len[b];
    KvCache cache = model.NewCache(1, t);
    std::vector<at::Tensor> rows;
    at::Tensor valid = at::ones({1, p}, at::kBool);
    rows.push_back(model
                       .ForwardCached(Row(ids, 0, p), PositionsFromValid(valid),
                                      valid, cache)
                       .to(at::kFloat)[0]);
    for (int64_t i = p; i < t; ++i) {
      valid = at::ones({1, i + 1}, at::kBool);
      const at::Tensor pos = at::full({1, 1}, i, at::kLong);
      rows.push_back(model.ForwardCached(Row(ids, i, i + 1), pos, valid, cache)
                         .to(at::kFloat)[0]);
    }
    dump.Add(absl::StrCat("kv_cache/", b), at::cat(rows, 0));
  }
}

// The fused decoder as the rollout drives it: the prompts prefilled
// together (left-padded, ForwardCached), each slot loaded from its row of
// that cache, then every live slot stepped once a token.
void CpuDecoderSteps(PolicyModel& model, const Job& job, Dump& dump) {
  at::NoGradGuard no_grad;
  const int64_t b_n = job.ids.size();
  const int64_t p_max =
      *std::max_element(job.prompt_len.begin(), job.prompt_len.end());
  at::Tensor tokens = at::zeros({b_n, p_max}, at::kLong);
  at::Tensor valid = at::zeros({b_n, p_max}, at::kBool);
  int64_t capacity = 0;
  for (int64_t b = 0; b < b_n; ++b) {
    const int64_t p = job.prompt_len[b];
    tokens[b].narrow(0, p_max - p, p).copy_(Row(job.ids[b], 0, p)[0]);
    valid[b].narrow(0, p_max - p, p).fill_(true);
    capacity = std::max<int64_t>(capacity, job.ids[b].size());
  }
  KvCache prefill = model.NewCache(b_n, p_max);
  model.ForwardCached(tokens, PositionsFromValid(valid), valid, prefill,
                      /*last_only=*/true);
  // Slots in the order of the steps each sequence needs, most first, so
  // that the live slots are always the first n.
  std::vector<int64_t> order(b_n);
  std::iota(order.begin(), order.end(), 0);
  auto steps = [&](int64_t b) {
    return static_cast<int64_t>(job.ids[b].size()) - job.prompt_len[b];
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return steps(a) > steps(b); });
  CpuDecoder decoder(model, b_n, capacity);
  std::vector<std::vector<at::Tensor>> rows(b_n);
  for (int64_t s = 0; s < b_n; ++s) {
    const int64_t b = order[s], p = job.prompt_len[b];
    decoder.LoadPrefill(prefill, b, p_max - p, p, s);
  }
  std::vector<int64_t> feed(b_n);
  for (int64_t k = 0; k < steps(order[0]); ++k) {
    int64_t n = 0;
    while (n < b_n && steps(order[n]) > k) {
      feed[n] = job.ids[order[n]][job.prompt_len[order[n]] + k];
      ++n;
    }
    const at::Tensor& logits = decoder.Step(feed.data(), n);
    for (int64_t s = 0; s < n; ++s) rows[order[s]].push_back(logits[s].clone());
  }
  for (int64_t b = 0; b < b_n; ++b) {
    dump.Add(absl::StrCat("cpu_decoder/", b), at::stack(rows[b], 0));
  }
}

// The trainer's log-probs of tokens P..T-1, with autograd on as in training.
void TrainerLogProbs(PolicyModel& model, const Job& job, Dump& dump) {
  std::vector<Sample> samples(job.ids.size());
  for (size_t b = 0; b < job.ids.size(); ++b) {
    const auto& ids = job.ids[b];
    samples[b].prompt_ids.assign(ids.begin(), ids.begin() + job.prompt_len[b]);
    samples[b].response_ids.assign(ids.begin() + job.prompt_len[b], ids.end());
  }
  const CollatedBatch batch = Collate(samples, 0, c10::Device("cpu"));
  model.set_training(true);
  const at::Tensor chunked =
      ResponseTokenLogProbs(model, batch, 1.0, /*chunk_tokens=*/64, false).logp;
  const at::Tensor full = ResponseLogProbs(model, batch, 1.0, nullptr);
  model.set_training(false);
  for (size_t b = 0; b < samples.size(); ++b) {
    const int64_t r = samples[b].response_ids.size();
    dump.Add(absl::StrCat("trainer_logp/", b),
             chunked[b].narrow(0, 0, r).to(at::kFloat));
    dump.Add(absl::StrCat("trainer_logp_full/", b),
             full[b].narrow(0, 0, r).to(at::kFloat));
  }
}

absl::Status Greedy(PolicyModel& model, const Job& job,
                    RolloutEngine::DecodePath path, const std::string& name,
                    Dump& dump) {
  RolloutEngine engine(model, /*pad_id=*/0, std::vector<int>{});
  engine.set_decode_path(path);
  std::vector<std::vector<int>> prompts;
  for (size_t b = 0; b < job.ids.size(); ++b) {
    prompts.emplace_back(job.ids[b].begin(),
                         job.ids[b].begin() + job.prompt_len[b]);
  }
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = job.greedy_new_tokens;
  absl::StatusOr<std::vector<Completion>> out =
      engine.Generate(prompts, greedy, 0);
  if (!out.ok()) return out.status();
  if (path == RolloutEngine::DecodePath::kFused && !engine.last_stats().fused) {
    return absl::InternalError(name + ": the fused path did not run");
  }
  for (size_t b = 0; b < out->size(); ++b) {
    const Completion& c = (*out)[b];
    dump.Add(absl::StrCat(name, "/", b, "/tokens"),
             at::tensor(std::vector<int64_t>(c.tokens.begin(), c.tokens.end()),
                        at::TensorOptions().dtype(at::kLong)));
    dump.Add(absl::StrCat(name, "/", b, "/logp"), at::tensor(c.logp));
  }
  return absl::OkStatus();
}

absl::Status RunJob(const Job& job) {
  absl::StatusOr<std::unique_ptr<PolicyModel>> model =
      LoadModel(job, AttentionKernel::kFused);
  if (!model.ok()) return model.status();
  PolicyModel& policy = **model;
  policy.set_training(false);
  Dump dump;
  FullForward(policy, job, "forward", dump);
  KvCacheDecode(policy, job, dump);
  TrainerLogProbs(policy, job, dump);
  absl::Status s = Greedy(policy, job, RolloutEngine::DecodePath::kComposite,
                          "rollout_composite", dump);
  if (!s.ok()) return s;
  if (CpuDecoder::Supports(policy)) {
    CpuDecoderSteps(policy, job, dump);
    s = Greedy(policy, job, RolloutEngine::DecodePath::kFused, "rollout_fused",
               dump);
    if (!s.ok()) return s;
  }
  if (job.dtype == "float32") {
    absl::StatusOr<std::unique_ptr<PolicyModel>> composite =
        LoadModel(job, AttentionKernel::kComposite);
    if (!composite.ok()) return composite.status();
    (*composite)->set_training(false);
    FullForward(**composite, job, "forward_composite", dump);
  }
  return dump.Write(job.out);
}

absl::StatusOr<std::vector<Job>> ReadRequest(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::vector<Job> jobs;
  try {
    const nlohmann::json request = nlohmann::json::parse(in);
    for (const auto& j : request.at("jobs")) {
      Job job;
      job.name = j.at("name").get<std::string>();
      job.dir = j.at("dir").get<std::string>();
      job.dtype = j.at("dtype").get<std::string>();
      job.out = j.at("out").get<std::string>();
      job.ids = j.at("sequences").at("ids").get<decltype(job.ids)>();
      job.prompt_len =
          j.at("sequences").at("prompt_len").get<decltype(job.prompt_len)>();
      job.greedy_new_tokens = j.at("greedy_new_tokens").get<int>();
      if (job.ids.empty() || job.ids.size() != job.prompt_len.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": job ", job.name,
                         ": one prompt_len per sequence, at least one"));
      }
      for (size_t b = 0; b < job.ids.size(); ++b) {
        if (job.prompt_len[b] < 1 ||
            job.prompt_len[b] >= static_cast<int64_t>(job.ids[b].size())) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": job ", job.name, ": sequence ", b,
                           " needs 1 <= prompt_len < its length"));
        }
      }
      jobs.push_back(std::move(job));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  return jobs;
}

}  // namespace
}  // namespace fusionrl

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: decoder_logits_dump REQUEST.json\n";
    return 1;
  }
  at::set_num_threads(1);
  absl::StatusOr<std::vector<fusionrl::Job>> jobs =
      fusionrl::ReadRequest(argv[1]);
  if (!jobs.ok()) {
    std::cerr << "decoder_logits_dump: " << jobs.status() << "\n";
    return 1;
  }
  for (const fusionrl::Job& job : *jobs) {
    absl::Status s;
    try {
      s = fusionrl::RunJob(job);
    } catch (const c10::Error& e) {
      s = absl::InternalError(e.what_without_backtrace());
    }
    if (!s.ok()) {
      std::cerr << "decoder_logits_dump: " << job.name << ": " << s << "\n";
      return 1;
    }
    std::cout << "decoder_logits_dump: " << job.name << " -> " << job.out
              << "\n";
  }
  return 0;
}
