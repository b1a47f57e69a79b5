// Samples and a job config shared by the trainer tests.
#ifndef FUSIONRL_ENGINE_TRAINER_TEST_UTIL_H_
#define FUSIONRL_ENGINE_TRAINER_TEST_UTIL_H_

#include <utility>
#include <vector>

#include "engine/model/test_util.h"
#include "engine/rollout/sample.h"
#include "engine/train/trainer.h"
#include "fusionrl/config.h"

namespace fusionrl::trainer_testing {

inline constexpr int kPad = 0, kBos = 1, kEos = 2;
inline const c10::Device kCpu("cpu");

inline Sample MakeSample(std::vector<int> prompt, std::vector<int> response,
                         double reward) {
  Sample s;
  s.prompt_ids = std::move(prompt);
  s.response_ids = std::move(response);
  s.behaviour_logp.assign(s.response_ids.size(), -1.0f);
  s.reward = reward;
  return s;
}

// The tiny model, groups of four, plain SGD-like settings (no clipping).
inline JobConfig TinyJob() {
  JobConfig c;
  c.model = testing_util::TinyModelConfig();
  c.rollout.group_size = 4;
  c.optim.lr = 1e-2;
  c.optim.grad_clip = 0;
  return c;
}

// Four groups of four samples with responses of 2..6 tokens and rewards 1
// where (group + index) % 3 == 0, else 0.
inline std::vector<Sample> FourGroupsOfFour() {
  std::vector<Sample> s;
  for (int g = 0; g < 4; ++g) {
    for (int i = 0; i < 4; ++i) {
      std::vector<int> resp;
      for (int t = 0; t <= (g + i) % 5; ++t) resp.push_back(20 + g * 3 + i + t);
      resp.push_back(kEos);
      s.push_back(
          MakeSample({kBos, 40 + g}, resp, (i + g) % 3 == 0 ? 1.0 : 0.0));
    }
  }
  return s;
}

// Sets every sample's behaviour log-probs to `model`'s own log-probs plus
// `shift` (shift 0: the samples are exactly on-policy).
inline void SetBehaviourLogProbs(PolicyModel& model,
                                 std::vector<Sample>& samples, float shift) {
  at::NoGradGuard no_grad;
  const CollatedBatch b = Collate(samples, kPad, kCpu);
  const at::Tensor logp = ResponseLogProbs(model, b, 1.0, nullptr);
  for (size_t i = 0; i < samples.size(); ++i) {
    for (size_t t = 0; t < samples[i].response_ids.size(); ++t) {
      samples[i].behaviour_logp[t] =
          logp[static_cast<int64_t>(i)][static_cast<int64_t>(t)].item<float>() +
          shift;
    }
  }
}

// Gradients of one Step() of a fresh testing_util::TinyModel(3) on `samples`.
inline std::vector<at::Tensor> GradsAfterStep(
    const JobConfig& c, const std::vector<Sample>& samples, TrainStats* stats) {
  auto model = testing_util::TinyModel(3);
  auto trainer = Trainer::Create(*model, nullptr, c, kPad).value();
  *stats = trainer->Step(samples).value();
  std::vector<at::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

}  // namespace fusionrl::trainer_testing

#endif  // FUSIONRL_ENGINE_TRAINER_TEST_UTIL_H_
