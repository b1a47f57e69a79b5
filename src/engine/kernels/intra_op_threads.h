// Intra-op thread counts that can change per micro-batch.
//
// at::set_num_threads() is not meant for a hot path: besides the calling
// thread's OpenMP team size it rebuilds LibTorch's global pthreadpool (used
// by its mobile kernels, never by ours), which measured 5.1 ms a call on a
// 2-core machine (docs/BENCHMARKS.md "RL Fusion: where the fused trainer's
// time went"). The RL Fusion trainer sizes its pool before every forward
// pass, so it calls SetIntraOpThreads() instead: it only sets the calling
// thread's OpenMP team size, through the OpenMP runtime LibTorch itself
// loaded (libgomp in Debian's build, a bundled copy in the official one), and
// falls back to at::set_num_threads() only when LibTorch has no OpenMP
// backend and the count actually changes.
//
// Thread safety: affects the calling thread only (OpenMP's nthreads-var is
// per thread); any thread may call it.
#ifndef FUSIONRL_ENGINE_KERNELS_INTRA_OP_THREADS_H_
#define FUSIONRL_ENGINE_KERNELS_INTRA_OP_THREADS_H_

#include <cstdint>
#include <functional>

namespace fusionrl {

// Sets the calling thread's intra-op thread count to `threads` (>= 1).
// Cheap when the count is unchanged (a comparison) and when it changes
// (one OpenMP call, no thread is created or destroyed).
void SetIntraOpThreads(int threads);

// Runs run(b0, b1) over the blocks [0, blocks), each block on one thread
// whose team is narrowed to one (so BLAS inside it runs the one-thread
// product: inside a parallel region OpenBLAS 0.3.21 runs on one thread but
// partitions a product for the region's team size, which changes its last
// bits). The blocks are spread over the caller's threads when it has more
// than one and is not inside a parallel region. What a block computes does
// not depend on the caller's thread count: the thread-count-invariant
// products (invariant_ops.h) and the fused decoder's row blocks run here.
void RunBlocksAlone(int64_t blocks,
                    const std::function<void(int64_t, int64_t)>& run);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_KERNELS_INTRA_OP_THREADS_H_
