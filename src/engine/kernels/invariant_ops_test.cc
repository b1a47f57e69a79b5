#include "engine/kernels/invariant_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/kernels/intra_op_threads.h"
#include "engine/kernels/op_counter.h"

namespace fusionrl {
namespace {

// Runs f with the calling thread's intra-op count at `threads`.
template <typename F>
auto WithThreads(int threads, F f) {
  const int before = at::get_num_threads();
  SetIntraOpThreads(threads);
  auto out = f();
  SetIntraOpThreads(before);
  return out;
}

bool Same(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && at::equal(a, b);
}

// [rows, cols] of `dtype`, row-major, or the transposed view of a
// [cols, rows] row-major tensor (what dy.t() and weight.t() are).
at::Tensor Operand(int64_t rows, int64_t cols, bool transposed,
                   at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype);
  return transposed ? at::randn({cols, rows}, options).t()
                    : at::randn({rows, cols}, options);
}

// Up to 16 rows a product is one block, so InvariantMm is one BLAS call:
// it must be the call at::mm makes, bit for bit, in every layout the model
// uses (x @ w^T, dy @ w, dy^T @ x) and at the edges (one row, one column,
// K = 1).
TEST(InvariantOpsTest, OneBlockIsBitwiseTorchMm) {
  at::manual_seed(1);
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (int64_t m : {1, 2, 9, 16}) {
      for (int64_t k : {1, 3, 64}) {
        for (int64_t n : {1, 2, 37}) {
          for (int layout = 0; layout < 4; ++layout) {
            const at::Tensor a = Operand(m, k, layout & 1, dtype);
            const at::Tensor b = Operand(k, n, layout & 2, dtype);
            const at::Tensor want =
                WithThreads(1, [&] { return at::mm(a, b); });
            const at::Tensor got = InvariantMm(a, b);
            EXPECT_TRUE(Same(got, want))
                << at::toString(dtype) << " m " << m << " k " << k << " n " << n
                << " layout " << layout << ": max diff "
                << (got - want).abs().max().item<double>();
          }
        }
      }
    }
  }
}

// A product of many blocks calls the BLAS per block itself: no operator per
// block goes through the dispatcher (this fails if the blocks fall back to
// at::mm_out), and the result is the same on one thread and on two.
TEST(InvariantOpsTest, BlocksCallTheBlasWithoutTheDispatcher) {
  at::manual_seed(2);
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor a = Operand(300, 64, false, dtype);  // 19 blocks
    const at::Tensor w = Operand(48, 64, false, dtype);
    at::Tensor got;
    int64_t ops = 0;
    {
      OpCounter counter;
      got = WithThreads(2, [&] { return InvariantMm(a, w.t()); });
      ops = counter.count();
    }
    EXPECT_LE(ops, 4) << at::toString(dtype);
    EXPECT_TRUE(
        Same(got, WithThreads(1, [&] { return InvariantMm(a, w.t()); })));
    EXPECT_TRUE(at::allclose(got, at::mm(a, w.t()), 1e-5, 1e-5));
  }
}

// Grouped linear maps against one InvariantLinear per group: the output and
// every gradient bitwise, an empty group's weight without a gradient, and
// on one thread as on two.
TEST(InvariantOpsTest, GroupedLinearIsOneLinearPerGroup) {
  at::manual_seed(3);
  const std::vector<int64_t> counts = {5, 0, 40, 1, 130};
  int64_t rows = 0;
  for (int64_t c : counts) rows += c;
  for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
    for (int threads : {1, 2}) {
      const auto options = at::TensorOptions().dtype(dtype);
      const at::Tensor x0 = at::randn({rows, 24}, options);
      std::vector<at::Tensor> w0;
      for (size_t g = 0; g < counts.size(); ++g) {
        w0.push_back(at::randn({20, 24}, options));
      }
      const at::Tensor dy = at::randn({rows, 20}, options);
      struct Run {
        at::Tensor y, dx;
        std::vector<at::Tensor> dw;
      };
      auto run = [&](bool grouped) {
        return WithThreads(threads, [&] {
          const at::Tensor x = x0.clone().requires_grad_(true);
          std::vector<at::Tensor> w;
          for (const at::Tensor& t : w0) {
            w.push_back(t.clone().requires_grad_(true));
          }
          at::Tensor y;
          if (grouped) {
            y = InvariantGroupedLinear(x, counts, w);
          } else {
            std::vector<at::Tensor> ys;
            int64_t start = 0;
            for (size_t g = 0; g < counts.size(); ++g) {
              if (counts[g] > 0) {
                ys.push_back(
                    InvariantLinear(x.narrow(0, start, counts[g]), w[g]));
              }
              start += counts[g];
            }
            y = at::cat(ys);
          }
          torch::autograd::backward({y}, {dy});
          Run r{y.detach(), x.grad(), {}};
          for (const at::Tensor& t : w) r.dw.push_back(t.grad());
          return r;
        });
      };
      const Run want = run(false), got = run(true);
      const std::string where = at::toString(dtype) +
                                std::string(", threads ") +
                                std::to_string(threads);
      EXPECT_TRUE(Same(got.y, want.y)) << where;
      EXPECT_TRUE(Same(got.dx, want.dx)) << where;
      for (size_t g = 0; g < counts.size(); ++g) {
        ASSERT_EQ(got.dw[g].defined(), counts[g] > 0) << where << " g " << g;
        if (counts[g] > 0) {
          EXPECT_TRUE(Same(got.dw[g], want.dw[g])) << where << " g " << g;
        }
      }
    }
  }
}

TEST(InvariantOpsTest, GroupedLinearRefusesCountsThatDoNotCoverTheRows) {
  const at::Tensor x = at::randn({6, 4});
  const std::vector<at::Tensor> w = {at::randn({3, 4}), at::randn({3, 4})};
  EXPECT_THROW(InvariantGroupedLinear(x, {2, 3}, w), c10::Error);
  EXPECT_THROW(InvariantGroupedLinear(x, {6}, w), c10::Error);
  EXPECT_THROW(InvariantGroupedLinear(x, {2, 4}, {w[0], at::randn({3, 5})}),
               c10::Error);
  EXPECT_EQ(InvariantGroupedLinear(x, {2, 4}, w).sizes(),
            (std::vector<int64_t>{6, 3}));
}

}  // namespace
}  // namespace fusionrl
