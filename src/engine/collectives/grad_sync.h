// GradientSync: the collective that makes several cards train one policy
// data-parallel (one replica per card, gradients summed after backward).
//
// Inside a super node this is c10d's ProcessGroupGloo (NCCL on GPUs belongs
// behind the same interface), never a hand-written collective. Each rank
// holds one GradientSync; all ranks must call the same collectives in the
// same order with tensors of the same shapes.
//
// Thread safety: one GradientSync per rank; a rank's calls come from one
// thread. Ranks may be threads of one process (MakeLocalGlooGroup) or
// processes (MakeTcpGlooGroup). Every collective has the group's timeout:
// a rank that never arrives becomes a DeadlineExceeded error, not a hang.
#ifndef FUSIONRL_ENGINE_COLLECTIVES_GRAD_SYNC_H_
#define FUSIONRL_ENGINE_COLLECTIVES_GRAD_SYNC_H_

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace c10d {
class Store;
class Work;
}  // namespace c10d

namespace fusionrl {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Replaces each tensor by its element-wise sum over all ranks. The tensors
  // are flattened into one buffer, so any number costs one sum (a Gloo
  // group's in buckets of kGradientBucketBytes).
  virtual absl::Status AllReduceSum(std::vector<at::Tensor>& tensors) = 0;

  // Combines the gradients of one optimizer step across the data-parallel
  // replicas (called by the trainer after backward when ExchangesGradients()).
  // Default: their sum, i.e. AllReduceSum. StaleSync across super nodes
  // overrides it (worker/hier_sync.h).
  virtual bool ExchangesGradients() const { return world_size() > 1; }
  virtual absl::Status ReduceGradients(std::vector<at::Tensor>& grads) {
    return AllReduceSum(grads);
  }
  // True when ReduceGradients also adds replicas world_size() does not
  // count (StaleSync across super nodes: other super nodes' updates), so
  // expert parallelism must send every expert's slot even where one expert
  // group spans the ranks.
  virtual bool AddsOtherNodesUpdates() const { return false; }

  // An asynchronous sum (StaleSync's updates on the c10d data plane): starts
  // replacing `flat` (one contiguous tensor, which the caller keeps alive
  // and leaves untouched until WaitAllReduceSum returns) by its sum over
  // the ranks, and returns its ticket. Every rank starts the same sums in
  // the same order, interleaved alike with the blocking collectives.
  // Default: the sum is taken at once (a blocking AllReduceSum).
  virtual absl::StatusOr<int64_t> StartAllReduceSum(at::Tensor flat);
  // Waits for the sum started as `ticket` (the group's timeout and probe
  // apply). After an error the group takes no further collectives.
  virtual absl::Status WaitAllReduceSum(int64_t ticket);

  // Replaces each tensor by rank `root`'s (same shapes and dtypes on every
  // rank), bit for bit. Default: Unimplemented.
  virtual absl::Status Broadcast(std::vector<at::Tensor>& tensors, int root);

  // Exchanges rows (expert parallelism): rank r sends rows
  // [sum(send_rows[0..d)), +send_rows[d]) of `input` to rank d and returns
  // the rows it receives, rank s's recv_rows[s] rows in rank order (a
  // tensor of input's trailing shape and dtype). send_rows[d] on rank r
  // must equal recv_rows[r] on rank d. Default: Unimplemented.
  virtual absl::StatusOr<at::Tensor> AllToAll(
      const at::Tensor& input, const std::vector<int64_t>& send_rows,
      const std::vector<int64_t>& recv_rows);

  // What this rank's AllToAll calls moved since the group was made: the
  // bytes it sent to other ranks (rows to itself stay put) and the seconds
  // it spent in them. Read from the rank's own thread.
  struct AllToAllTotals {
    int64_t calls = 0;
    int64_t bytes = 0;
    double seconds = 0;
  };
  const AllToAllTotals& all_to_all_totals() const { return all_to_all_; }

 protected:
  AllToAllTotals all_to_all_;
};

// Sums `values` over the ranks of `sync` (in place). A null `sync` or a
// group of one is the identity. Used for loss normalisers and metrics.
absl::Status SumAcrossRanks(GradientSync* sync, std::vector<double>& values);

// Gloo groups sum in buckets of at most this many bytes (DDP's default
// bucket_cap_mb): no collective message grows with the model, and a sum's
// buckets go out one after the other in Gloo's thread. Each bucket is a ring
// all-reduce of its own, so where a bucket boundary falls is part of the
// bits of the result (identical on every rank, as ever).
inline constexpr int64_t kGradientBucketBytes = int64_t{25} << 20;

// `world_size` ranks in this process (one per card thread), connected over
// loopback through an in-memory store. Element i is rank i.
absl::StatusOr<std::vector<std::unique_ptr<GradientSync>>> MakeLocalGlooGroup(
    int world_size, absl::Duration timeout,
    int64_t bucket_bytes = kGradientBucketBytes);

// One rank of a group formed through `store` (any c10d Store; the cards of
// a job spanning super nodes use the controller's, worker/controller_store.h)
// on the host's network interface (GLOO_SOCKET_IFNAME, else the address its
// name resolves to). `probe` (may be null): asked about once per 200 ms
// while a collective has run for over a second; an error from it abandons
// the collective and the group (the error is returned; form a new group).
absl::StatusOr<std::unique_ptr<GradientSync>> MakeStoreGlooGroup(
    c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
    absl::Duration timeout, std::function<absl::Status()> probe);

// One rank of a group spanning processes: rank 0 hosts a TCP store on
// host:port, the others connect to it (all within `timeout`).
absl::StatusOr<std::unique_ptr<GradientSync>> MakeTcpGlooGroup(
    const std::string& host, int port, int rank, int world_size,
    absl::Duration timeout);

namespace internal {

// Waits up to `slice` for `work`: true once it has completed, false while
// it still runs; throws the collective's own error. c10d's wait(timeout)
// throws "Operation timed out!" when the work completes just after the
// wait gave up: that counts as completed here (the collective is then
// waited for again, which returns or throws its own error), not as a
// failed collective.
bool WaitSlice(const c10::intrusive_ptr<c10d::Work>& work,
               absl::Duration slice);

}  // namespace internal

}  // namespace fusionrl

#endif  // FUSIONRL_ENGINE_COLLECTIVES_GRAD_SYNC_H_
