// Helpers shared by the engine tests.
#ifndef FUSIONRL_ENGINE_MODEL_TEST_UTIL_H_
#define FUSIONRL_ENGINE_MODEL_TEST_UTIL_H_

#include <memory>

#include "engine/model/model.h"
#include "fusionrl/config.h"

namespace fusionrl::testing_util {

inline ModelConfig TinyModelConfig() {
  ModelConfig c;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.d_ff = 64;
  c.max_seq_len = 32;
  c.init_std = 0.2;  // large enough that logits are far from uniform
  return c;
}

inline std::unique_ptr<PolicyModel> TinyModel(uint64_t seed = 7,
                                              int vocab = 98) {
  auto m =
      PolicyModel::Create(TinyModelConfig(), vocab, c10::Device("cpu"), seed);
  return std::move(m).value();
}

}  // namespace fusionrl::testing_util

#endif  // FUSIONRL_ENGINE_MODEL_TEST_UTIL_H_
