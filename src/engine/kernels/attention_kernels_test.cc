// The fused attention core (engine/kernels/attention_kernels.h through
// FusedAttentionCore) against the composite ATen ops it replaces: outputs
// and q/k/v gradients, with grouped-query heads, strided inputs, padding
// and a prefill offset; and a whole policy's logits and parameter
// gradients with either kernel.
#include "engine/kernels/attention_kernels.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

#include "engine/model/attention.h"
#include "engine/model/model.h"
#include "engine/model/test_util.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

// The composite path, written out: repeat_kv, scores, mask, softmax,
// weighted sum.
torch::Tensor ReferenceCore(const torch::Tensor& q, torch::Tensor k,
                            torch::Tensor v, const torch::Tensor& mask) {
  const int64_t rep = q.size(1) / k.size(1);
  k = k.repeat_interleave(rep, 1);
  v = v.repeat_interleave(rep, 1);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(q.size(3));
  scores = scores.masked_fill(mask.logical_not(),
                              -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
}

void ExpectClose(const torch::Tensor& a, const torch::Tensor& b,
                 const char* what, double tol = 2e-5) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const double err = (a - b).abs().max().item<double>();
  const double scale = b.abs().max().item<double>();
  EXPECT_LE(err, tol * std::max(1.0, scale)) << what << ": max error " << err;
}

struct Case {
  int64_t batch, heads, kv_heads, t, start, dh;
};

// q, k, v as the attention sub-block makes them: q contiguous, k and v
// transposed views of [B, K, KvH, Dh] projections.
void CheckCase(const Case& c) {
  SCOPED_TRACE(::testing::Message()
               << "B " << c.batch << " H " << c.heads << " KvH " << c.kv_heads
               << " T " << c.t << " start " << c.start << " Dh " << c.dh);
  torch::manual_seed(11);
  const int64_t keys = c.start + c.t;
  auto q = torch::randn({c.batch, c.heads, c.t, c.dh}).requires_grad_();
  auto k_raw = torch::randn({c.batch, keys, c.kv_heads, c.dh});
  auto v_raw = torch::randn({c.batch, keys, c.kv_heads, c.dh});
  auto k = k_raw.transpose(1, 2).requires_grad_();
  auto v = v_raw.transpose(1, 2).requires_grad_();
  // Row 0 unpadded, the others left-padded by 1, 2, ...
  auto valid = torch::ones({c.batch, keys}, torch::kBool);
  for (int64_t b = 1; b < c.batch; ++b) {
    valid[b].narrow(0, 0, std::min<int64_t>(b, keys - 1)).fill_(false);
  }
  auto mask = AttentionMask(valid, c.start, c.t);
  auto grad = torch::randn({c.batch, c.heads, c.t, c.dh});

  auto fused = FusedAttentionCore(q, k, v, mask);
  ASSERT_TRUE(fused.defined());
  auto gf = torch::autograd::grad({fused}, {q, k, v}, {grad});
  auto ref = ReferenceCore(q, k, v, mask);
  auto gr = torch::autograd::grad({ref}, {q, k, v}, {grad});
  ExpectClose(fused, ref, "output");
  ExpectClose(gf[0], gr[0], "dq");
  ExpectClose(gf[1], gr[1], "dk");
  ExpectClose(gf[2], gr[2], "dv");
}

TEST(AttentionKernelsTest, FusedCoreEqualsCompositeOutputAndGradients) {
  CheckCase({1, 1, 1, 1, 0, 8});    // one query, one key
  CheckCase({3, 4, 4, 9, 0, 16});   // multi-head, padded rows
  CheckCase({2, 4, 2, 7, 0, 32});   // grouped-query
  CheckCase({2, 6, 1, 5, 0, 12});   // multi-query, Dh not a multiple of 8
  CheckCase({2, 4, 2, 3, 6, 16});   // prefill after 6 cached slots
  CheckCase({5, 2, 2, 20, 0, 64});  // longer rows than one task's grain
}

TEST(AttentionKernelsTest, AQueryWithNoKeyGetsZeros) {
  auto q = torch::randn({1, 2, 2, 8}).requires_grad_();
  auto k = torch::randn({1, 2, 2, 8}).requires_grad_();
  auto v = torch::randn({1, 2, 2, 8}).requires_grad_();
  auto mask = torch::tensor({true, false, false, false}, torch::kBool)
                  .view({1, 1, 2, 2});
  auto out = FusedAttentionCore(q, k, v, mask);
  ASSERT_TRUE(out.defined());
  EXPECT_TRUE(torch::equal(out.select(2, 1), torch::zeros({1, 2, 8})));
  // Query 0 sees key 0 only: its output is v's row 0.
  EXPECT_TRUE(torch::allclose(out.select(2, 0), v.select(2, 0)));
  auto g = torch::autograd::grad({out.sum()}, {q, k, v});
  EXPECT_TRUE(torch::isfinite(g[0]).all().item<bool>());
  EXPECT_TRUE(torch::equal(g[0].select(2, 1), torch::zeros({1, 2, 8})));
}

TEST(AttentionKernelsTest, NotFloat32OnCpuIsLeftToTheCompositePath) {
  auto q = torch::randn({1, 2, 3, 8}, torch::kDouble);
  auto mask = torch::ones({1, 1, 3, 3}, torch::kBool);
  EXPECT_FALSE(FusedAttentionCore(q, q, q, mask).defined());
  auto f = q.to(torch::kFloat);
  EXPECT_FALSE(FusedAttentionCore(f, f, f, mask.to(torch::kFloat)).defined());
}

// The whole policy: logits and every parameter's gradient of a padded
// batch with model.attention_kernel fused and composite.
TEST(AttentionKernelsTest, PolicyLogitsAndGradientsEqualWithEitherKernel) {
  ModelConfig c = testing_util::TinyModelConfig();
  c.n_kv_heads = 2;
  auto tokens =
      torch::tensor({{0, 0, 7, 8, 9, 10}, {4, 5, 6, 7, 30, 31}}, torch::kLong);
  auto valid = tokens != 0;
  torch::manual_seed(3);
  auto weight = torch::randn({2, 6, 98});  // a loss that reads every logit
  std::vector<torch::Tensor> logits, grads;
  for (AttentionKernel kernel :
       {AttentionKernel::kFused, AttentionKernel::kComposite}) {
    c.attention_kernel = kernel;
    auto model = PolicyModel::Create(c, 98, c10::Device("cpu"), 7).value();
    auto out = model->Forward(tokens, PositionsFromValid(valid), valid);
    (out * weight).sum().backward();
    logits.push_back(out.detach());
    std::vector<torch::Tensor> g;
    for (const auto& p : model->parameters()) g.push_back(p.grad().flatten());
    grads.push_back(torch::cat(g));
  }
  ExpectClose(logits[0], logits[1], "logits");
  ExpectClose(grads[0], grads[1], "parameter gradients");
}

}  // namespace
}  // namespace fusionrl
