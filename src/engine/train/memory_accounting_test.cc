#include "engine/train/memory_accounting.h"

#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <string>
#include <thread>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/test_util.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using testing_util::TinyModel;
using testing_util::TinyModelConfig;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int kVocab = 98;  // TinyModel's default

// 2^18 float32 values = 1 MiB.
at::Tensor OneMiBTensor() { return torch::empty({262144}, torch::kFloat); }

// Parameters of a model of `c` by hand: embedding and lm_head (V x d each),
// per block two RMSNorm weights (d), wq/wk/wv/wo (d x d) and the SwiGLU
// w1/w3 (d x d_ff) and w2 (d_ff x d), and the final norm (d).
int64_t ParameterCountByHand(const ModelConfig& c, int vocab) {
  const int64_t d = c.d_model, ff = c.d_ff;
  return 2 * vocab * d + c.n_layers * (2 * d + 4 * d * d + 3 * d * ff) + d;
}

TEST(ScopedAllocationCounterTest, CountsANewTensorUntilItIsFreed) {
  ScopedAllocationCounter counter;
  {
    at::Tensor t = OneMiBTensor();
    EXPECT_EQ(counter.current_bytes(), kMiB);
  }
  EXPECT_EQ(counter.current_bytes(), 0);
  EXPECT_EQ(counter.peak_bytes(), kMiB);
  EXPECT_EQ(counter.allocations(), 1);
  // Two at once, then one: the peak is what was live together.
  at::Tensor a = OneMiBTensor();
  at::Tensor b = OneMiBTensor();
  a.reset();
  EXPECT_EQ(counter.current_bytes(), kMiB);
  EXPECT_EQ(counter.peak_bytes(), 2 * kMiB);
}

TEST(ScopedAllocationCounterTest, IgnoresFreesOfBlocksAllocatedBeforeIt) {
  at::Tensor before = OneMiBTensor();  // not profiled at all
  at::Tensor earlier_scope;
  {
    ScopedAllocationCounter first;
    earlier_scope = OneMiBTensor();
    EXPECT_EQ(first.current_bytes(), kMiB);
  }
  ScopedAllocationCounter counter;
  // c10 reports this free as -1 MiB (it saw the block allocated under the
  // first counter); the other it does not report. Neither is this scope's.
  earlier_scope.reset();
  before.reset();
  EXPECT_EQ(counter.current_bytes(), 0);
  EXPECT_EQ(counter.peak_bytes(), 0);
  at::Tensor mine = OneMiBTensor();
  EXPECT_EQ(counter.current_bytes(), kMiB);
  EXPECT_EQ(counter.peak_bytes(), kMiB);
}

TEST(ScopedAllocationCounterTest, NestedCountersBothCount) {
  ScopedAllocationCounter outer;
  at::Tensor a = OneMiBTensor();
  {
    ScopedAllocationCounter inner;
    at::Tensor b = OneMiBTensor();
    EXPECT_EQ(inner.current_bytes(), kMiB);
    EXPECT_EQ(outer.current_bytes(), 2 * kMiB);
  }
  EXPECT_EQ(outer.current_bytes(), kMiB);
  EXPECT_EQ(outer.peak_bytes(), 2 * kMiB);
}

TEST(ScopedAllocationCounterTest, CountsOnlyItsThreadAndDevice) {
  ScopedAllocationCounter counter;
  std::thread other([] { at::Tensor t = OneMiBTensor(); });
  other.join();
  EXPECT_EQ(counter.peak_bytes(), 0);

  ScopedAllocationCounter cuda_only(c10::Device("cuda"));
  at::Tensor t = OneMiBTensor();
  EXPECT_EQ(cuda_only.peak_bytes(), 0);
  EXPECT_EQ(counter.peak_bytes(), kMiB);  // the inner one forwards
}

TEST(MemoryAccountingTest, ParameterBytesMatchTheConfig) {
  const ModelConfig c = TinyModelConfig();
  auto model = TinyModel();
  // d 32, 2 layers, d_ff 64, vocab 98: 2*98*32 + 2*(64 + 4096 + 6144) + 32.
  EXPECT_EQ(ParameterCountByHand(c, kVocab), 26912);
  EXPECT_EQ(ParameterBytes(*model), 26912 * 4);
  EXPECT_EQ(ParameterBytes(*model), model->num_parameters() * 4);
  EXPECT_EQ(GradientBytes(*model), 0);  // no backward pass yet
}

TEST(MemoryAccountingTest, ForwardBackwardShowsActivationsAndGradients) {
  auto model = TinyModel();
  const int64_t batch = 4, len = 16;
  auto tokens = torch::randint(3, kVocab, {batch, len}, torch::kLong);
  auto valid = torch::ones({batch, len}, torch::kBool);
  auto positions = PositionsFromValid(valid);
  int64_t peak = 0, retained = 0;
  {
    ScopedAllocationCounter counter;
    auto logits = model->Forward(tokens, positions, valid);
    logits.logsumexp(-1).mean().backward();
    logits.reset();
    peak = counter.peak_bytes();
    retained = counter.current_bytes();
  }
  // At least the logits [4, 16, 98] float were live at once.
  EXPECT_GE(peak, batch * len * kVocab * 4);
  // What the pass keeps is exactly the gradients it created: one per
  // parameter, the size of the parameters.
  EXPECT_EQ(GradientBytes(*model), ParameterBytes(*model));
  EXPECT_EQ(retained, GradientBytes(*model));
  EXPECT_GT(peak, retained);
}

TEST(MemoryAccountingTest, KvCacheBytesMatchTheShape) {
  auto model = TinyModel();
  KvCache cache = model->NewCache(3, 20);
  // 2 (keys, values) x 2 layers x 3 x 20 slots x d 32 x 4 bytes.
  EXPECT_EQ(KvCacheBytes(cache), 30720);
  EXPECT_EQ(KvCacheBytesFor(TinyModelConfig(), 3, 20), 30720);
  EXPECT_EQ(KvCacheBytes(KvCache{}), 0);
}

TEST(MemoryAccountingTest, OptimizerStateIsTwiceTheParametersAndMoves) {
  auto model = TinyModel();
  JobConfig config;
  config.model = TinyModelConfig();
  config.rollout.group_size = 2;
  auto trainer = Trainer::Create(*model, nullptr, config, /*pad_id=*/0);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ(OptimizerStateBytes(**trainer), 0);  // AdamW's state is lazy

  std::vector<Sample> samples(2);
  for (int i = 0; i < 2; ++i) {
    samples[i].prompt_ids = {1, 10 + i, 11};
    samples[i].response_ids = {20 + i, 21, 2};
    samples[i].behaviour_logp.assign(3, -1.0f);
    samples[i].reward = i;
  }
  int64_t retained = 0;
  {
    // How the worker measures a train step's activations.
    ScopedAllocationCounter counter;
    ASSERT_TRUE((*trainer)->Step(samples).ok());
    retained = counter.current_bytes();
    // Activations and the optimizer's temporaries came and went.
    EXPECT_GT(counter.peak_bytes(), retained);
  }
  // exp_avg and exp_avg_sq, one of each per parameter.
  EXPECT_EQ(OptimizerStateBytes(**trainer), 2 * 26912 * 4);
  // The first step keeps what it created: gradients and the AdamW state.
  EXPECT_EQ(retained, GradientBytes(*model) + OptimizerStateBytes(**trainer));

  // To the host and back: on a CPU card nothing moves (every state tensor
  // keeps its storage: no copy is made) and nothing changes (the state's
  // bytes are identical), and the next step continues from that state.
  auto state_pointers = [&] {
    std::vector<const void*> out;
    for (const auto& entry : (*trainer)->optimizer().state()) {
      const auto& s =
          static_cast<const torch::optim::AdamWParamState&>(*entry.second);
      out.push_back(s.exp_avg().data_ptr());
      out.push_back(s.exp_avg_sq().data_ptr());
    }
    return out;
  };
  const std::vector<const void*> pointers = state_pointers();
  ASSERT_EQ(pointers.size(), 2 * model->parameters().size());
  const std::string state = (*trainer)->OptimizerState().value();
  ASSERT_TRUE(MoveOptimizerState(**trainer, c10::Device("cpu")).ok());
  EXPECT_EQ(state_pointers(), pointers);
  ASSERT_TRUE(MoveOptimizerState(**trainer, model->device()).ok());
  EXPECT_EQ(state_pointers(), pointers);
  EXPECT_EQ((*trainer)->OptimizerState().value(), state);
  EXPECT_TRUE((*trainer)->Step(samples).ok());
  EXPECT_EQ(OptimizerStateBytes(**trainer), 2 * 26912 * 4);
  for (const auto& entry : (*trainer)->optimizer().state()) {
    const auto& s =
        static_cast<const torch::optim::AdamWParamState&>(*entry.second);
    EXPECT_EQ(s.step(), 2);  // the second step, not a fresh first one
  }
}

}  // namespace
}  // namespace fusionrl
