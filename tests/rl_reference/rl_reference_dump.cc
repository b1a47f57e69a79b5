// rl_reference_dump: runs the trainer's step math (engine/train/step_math.h) in
// float64 on the batches of a case file and writes what it computed, for
// tests/rl_reference/check.py to compare with its independent PyTorch
// implementation of the published formulas.
//
//   rl_reference_dump CASES.json OUT.json
//
// A case: {"name", "overrides": ["algorithm.adv_estimator=rloo", ...] (job
// config keys, as `--set` takes them), "micro_batch_size", "samples":
// [{"loss_mask": [0/1 per response token], "finished", "excluded",
// "reward"}], and [B, T] arrays "logp", "behaviour_logp", "prox_logp",
// "ref_logp", "entropy"} (T = the longest response). The steps below are
// Trainer::Step's, in its order: rewards and masks, the proximal log-probs
// and behaviour weights, the advantages (with the KL penalty as a reward),
// the loss normalisers, then each micro-batch's loss, summed, and its
// gradient with respect to `logp`.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "engine/train/step_math.h"
#include "fusionrl/config.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

using nlohmann::json;

at::Tensor Matrix(const json& rows, int64_t b_n, int64_t t_n) {
  at::Tensor out = at::zeros({b_n, t_n}, at::kDouble);
  auto a = out.accessor<double, 2>();
  for (int64_t b = 0; b < b_n; ++b) {
    for (int64_t t = 0; t < t_n; ++t) a[b][t] = rows.at(b).at(t).get<double>();
  }
  return out;
}

json ToJson(const at::Tensor& t) {
  const at::Tensor d = t.detach().to(at::kDouble).contiguous();
  if (d.dim() == 0) return d.item<double>();
  json out = json::array();
  for (int64_t i = 0; i < d.size(0); ++i) out.push_back(ToJson(d[i]));
  return out;
}

json RunCase(const json& c) {
  std::vector<std::string> overrides =
      c.at("overrides").get<std::vector<std::string>>();
  auto config =
      ParseJobConfig("{}", c.at("name").get<std::string>(), overrides);
  if (!config.ok()) {
    return json{{"name", c.at("name")},
                {"error", std::string(config.status().message())}};
  }
  const AlgorithmConfig& a = config->algorithm;
  std::vector<Sample> samples;
  for (const json& js : c.at("samples")) {
    Sample s;
    s.prompt_ids = {1};
    for (const json& m : js.at("loss_mask")) {
      s.loss_mask.push_back(static_cast<uint8_t>(m.get<int>()));
    }
    s.response_ids.assign(s.loss_mask.size(), 2);
    s.finished = js.at("finished").get<bool>();
    s.excluded = js.at("excluded").get<bool>();
    s.reward = js.at("reward").get<double>();
    samples.push_back(std::move(s));
  }
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const algo::StepRewards step =
      algo::PrepareStepRewards(samples, config->rollout, f64);
  const int64_t b_n = step.loss_mask.size(0), t_n = step.loss_mask.size(1);
  const at::Tensor logp =
      Matrix(c.at("logp"), b_n, t_n).set_requires_grad(true);
  const at::Tensor behaviour = Matrix(c.at("behaviour_logp"), b_n, t_n);
  const at::Tensor prox = Matrix(c.at("prox_logp"), b_n, t_n);
  const at::Tensor ref = Matrix(c.at("ref_logp"), b_n, t_n);
  const at::Tensor entropy = Matrix(c.at("entropy"), b_n, t_n);
  const bool use_kl = a.kl_coef > 0;
  at::Tensor old = behaviour, weight;
  if (a.RecomputesProximal()) {
    old = prox;
    weight = algo::BehaviourWeights(prox, behaviour, step.loss_mask,
                                    algo::BehaviourWeightRuleOf(a));
  }
  const at::Tensor advantages =
      algo::StepAdvantages(a, config->rollout.group_size, step,
                           use_kl && a.kl_mode == KlMode::kReward
                               ? algo::KlPenalty(old, ref, a.kl_estimator)
                               : at::Tensor());
  const algo::AggNorm norm =
      algo::LocalAggNorm(step.loss_mask, config->rollout.max_new_tokens);
  const int64_t micro = std::max<int64_t>(1, c.value("micro_batch_size", b_n));
  at::Tensor loss = at::zeros({}, f64);
  std::vector<at::Tensor> per_token;
  for (int64_t u0 = 0; u0 < b_n; u0 += micro) {
    const int64_t n = std::min(micro, b_n - u0);
    auto rows = [&](const at::Tensor& t) {
      return t.defined() ? t.narrow(0, u0, n) : t;
    };
    const algo::MicroBatchLoss parts = algo::MicroBatchLossOf(
        a, rows(logp), rows(old), rows(advantages), rows(step.loss_mask), norm,
        rows(weight), use_kl ? rows(ref) : at::Tensor(), rows(entropy));
    loss = loss + parts.loss;
    per_token.push_back(parts.pg.per_token);
  }
  const at::Tensor grad = torch::autograd::grad({loss}, {logp})[0];
  json out{{"name", c.at("name")},
           {"rewards", ToJson(step.rewards)},
           {"loss_mask", ToJson(step.loss_mask)},
           {"advantages", ToJson(advantages)},
           {"pg_per_token", ToJson(at::cat(per_token, 0))},
           {"loss", ToJson(loss)},
           {"grad_logp", ToJson(grad)}};
  out["weights"] = weight.defined() ? ToJson(weight) : json();
  return out;
}

}  // namespace
}  // namespace fusionrl

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: rl_reference_dump CASES.json OUT.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::cerr << "rl_reference_dump: cannot read " << argv[1] << "\n";
    return 2;
  }
  nlohmann::json cases;
  try {
    in >> cases;
    nlohmann::json out = nlohmann::json::array();
    for (const auto& c : cases) out.push_back(fusionrl::RunCase(c));
    std::ofstream(argv[2]) << out.dump();
  } catch (const std::exception& e) {
    std::cerr << "rl_reference_dump: " << argv[1] << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
