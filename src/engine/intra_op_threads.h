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
#ifndef FUSIONRL_ENGINE_INTRA_OP_THREADS_H_
#define FUSIONRL_ENGINE_INTRA_OP_THREADS_H_

namespace fusionrl {

// Sets the calling thread's intra-op thread count to `threads` (>= 1).
// Cheap when the count is unchanged (a comparison) and when it changes
// (one OpenMP call, no thread is created or destroyed).
void SetIntraOpThreads(int threads);

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_INTRA_OP_THREADS_H_
