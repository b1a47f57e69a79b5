#include "engine/kernels/intra_op_threads.h"

#include <ATen/Config.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <dlfcn.h>

#include <algorithm>

namespace fusionrl {
namespace {

using SetThreadsFn = void (*)(int);

// omp_set_num_threads of the OpenMP runtime already in the process (the one
// LibTorch links), or null. Looked up rather than linked, so that a LibTorch
// with its own bundled libgomp is the one addressed.
SetThreadsFn OpenMpSetNumThreads() {
#if AT_PARALLEL_OPENMP
  static const SetThreadsFn fn = reinterpret_cast<SetThreadsFn>(
      dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  return fn;
#else
  return nullptr;
#endif
}

}  // namespace

void SetIntraOpThreads(int threads) {
  threads = std::max(1, threads);
  // LibTorch sizes a thread's team from its process-wide count the first
  // time the thread runs a parallel op; do that first, so it cannot undo
  // the count set here later.
  at::internal::lazy_init_num_threads();
  if (at::get_num_threads() == threads) return;
  if (SetThreadsFn set = OpenMpSetNumThreads(); set != nullptr) {
    set(threads);
    return;
  }
  at::set_num_threads(threads);
}

void RunBlocksAlone(int64_t blocks,
                    const std::function<void(int64_t, int64_t)>& run) {
  if (blocks <= 0) return;
  // The blocks call LibTorch ops: a team's other threads run them under
  // the caller's grad mode and dispatch state (e.g. no autograd inside a
  // custom Function's forward), which are thread-local.
  const at::ThreadLocalState caller;
  auto alone = [&](int64_t b0, int64_t b1) {
    at::ThreadLocalStateGuard same_state(caller);
    const int team = at::get_num_threads();
    SetIntraOpThreads(1);
    run(b0, b1);
    SetIntraOpThreads(team);
  };
  if (blocks > 1 && at::get_num_threads() > 1 && !at::in_parallel_region()) {
    at::parallel_for(0, blocks, 1, alone);
  } else {
    alone(0, blocks);
  }
}

}  // namespace fusionrl
