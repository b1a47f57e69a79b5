// CardMemoryManager: the memory books of one card in RL Fusion, where the
// trainer and the rollout engine share a card and its memory.
//
// The books hold seven categories of bytes:
//   weights      the trainer's policy parameters
//   snapshot     the rollout's copy of the weights (fused mode), 0 if none
//   optimizer    optimizer state (AdamW exp_avg, exp_avg_sq) on the card
//   gradients    parameter gradients
//   activations  transient working memory of a train step (its peak)
//   kv_cache     the rollout's key/value cache
//   optimizer_host  optimizer state offloaded to host memory (not counted
//                against the card's budget)
// The first six are device memory; their sum is "in use" and is held to the
// budget (0 = unlimited: the books are kept, nothing is ever refused).
//
// Figures are measured by the caller (engine/train/memory_accounting.h) and set
// with Set(). The two growing consumers ask first: RequestKvCache() before a
// sampling round allocates its cache, RequestActivations() before a train
// step. A request that fits is granted and recorded. One that does not fit
// is, under OffloadPolicy::kAuto, granted on condition that the optimizer
// state moves to host memory first (kGrantedAfterOffload): the books record
// the plan at once (optimizer -> optimizer_host, the request's bytes in its
// category), and the caller must move the state and then confirm with
// OptimizerOffloaded(). Otherwise the request is refused with a message that
// names the card, the shortfall and what is in use. Before its next
// optimizer step the trainer asks OptimizerRestoreNeeded() (or waits with
// WaitOptimizerRestore()); a true answer reserves the room, and the trainer
// moves the state back and confirms with OptimizerRestored().
//
// The manager only keeps books and decides; it never touches memory. On a
// CPU "card", host and device are the same memory and an offload only moves
// the accounting.
//
// Thread safety: thread-safe. Every method takes one internal mutex and
// calls nothing outside this class while holding it; the Wait* methods
// block on a condition variable that every change signals. At most one
// thread (the trainer's) may carry out offloads and restores at a time.
#ifndef FUSIONRL_CORE_MEMORY_MANAGER_H_
#define FUSIONRL_CORE_MEMORY_MANAGER_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "fusionrl/config.h"

namespace fusionrl {

enum class MemoryCategory : int {
  kWeights = 0,
  kSnapshot,
  kOptimizer,
  kGradients,
  kActivations,
  kKvCache,
  kOptimizerHost,
};
inline constexpr int kNumMemoryCategories = 7;

// "weights", "snapshot", "optimizer", "gradients", "activations",
// "kv_cache", "optimizer_host": the keys of Snapshot() and of the status
// RPC's CardState.memory_bytes.
absl::string_view MemoryCategoryName(MemoryCategory category);

// Whether `category` is device memory (counted against the budget): all but
// kOptimizerHost.
bool IsDeviceMemory(MemoryCategory category);

// The answer to RequestKvCache() / RequestActivations().
struct MemoryDecision {
  enum class Outcome {
    kGranted,              // fits; recorded
    kGrantedAfterOffload,  // fits once the optimizer state is on the host:
                           //   move `offload_bytes` of it, then call
                           //   OptimizerOffloaded()
    kRefused,              // does not fit; nothing recorded
  };
  Outcome outcome = Outcome::kGranted;
  int64_t offload_bytes = 0;  // kGrantedAfterOffload: optimizer bytes to move
  std::string message;        // kRefused: why ("card 0: KV cache needs 12.0 MiB
                              // more; budget 64.0 MiB, in use ..."); else ""
  bool granted() const { return outcome != Outcome::kRefused; }
};

class CardMemoryManager {
 public:
  // From the job's `memory` section. InvalidArgument if card_index < 0,
  // memory.card_budget_mib is negative, not finite or above 2^40.
  static absl::StatusOr<std::unique_ptr<CardMemoryManager>> Create(
      int card_index, const MemoryConfig& config);

  // `budget_bytes` = 0: unlimited. REQUIRES: card_index >= 0,
  // budget_bytes >= 0 (unchecked; use Create() for untrusted values).
  CardMemoryManager(int card_index, int64_t budget_bytes, OffloadPolicy policy);

  CardMemoryManager(const CardMemoryManager&) = delete;
  CardMemoryManager& operator=(const CardMemoryManager&) = delete;

  // Records a measured figure (negative values count as 0). Never refused:
  // it is what the card holds. Setting kKvCache or kActivations to 0
  // releases them. Wakes the Wait* methods.
  void Set(MemoryCategory category, int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // The KV cache is about to grow (or shrink) to `bytes` in total. See the
  // class comment for the three outcomes. With an offload or a restore in
  // flight a request that does not fit is refused.
  MemoryDecision RequestKvCache(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for the activations of the next train step (its expected
  // peak, e.g. the last measured one). Note: a train step needs its
  // optimizer state on the card for the update, after its activations are
  // freed; acting on kGrantedAfterOffload here therefore needs the state
  // brought back between the last backward pass and the update.
  MemoryDecision RequestActivations(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // The caller moved `bytes` of optimizer state to host memory. After a
  // kGrantedAfterOffload decision this confirms it (the books were moved at
  // the decision; `bytes` replaces the planned figure in optimizer_host).
  // Without one it moves min(bytes, optimizer) from optimizer to
  // optimizer_host. Wakes the Wait* methods.
  void OptimizerOffloaded(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the trainer should bring the offloaded optimizer state back now:
  // true only if some is on the host, no offload or restore is in flight and
  // it fits in the budget next to what is in use. A true answer reserves the
  // room (the books move it to `optimizer` at once): the caller must then
  // move the state to the card and call OptimizerRestored().
  bool OptimizerRestoreNeeded() ABSL_LOCKS_EXCLUDED(mu_);

  // For the trainer's thread before an optimizer step: blocks until
  // OptimizerRestoreNeeded() would return true and reserves as it does,
  // returning the bytes to move back. Returns 0 at once when the state is
  // physically on the card: nothing offloaded, a restore already reserved,
  // or an offload decided but not yet carried out (offload_in_flight(); the
  // trainer should carry it out first, see WaitOptimizerOffloaded()).
  // DeadlineExceeded once `clock` reaches `deadline` (a time on that
  // clock), naming what takes the
  // room: "card 0: optimizer state (40.0 MiB) cannot come back: budget
  // 64.0 MiB, in use 32.0 MiB: weights 20.0, kv_cache 12.0".
  absl::StatusOr<int64_t> WaitOptimizerRestore(const Clock& clock,
                                               absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // For a requester that got kGrantedAfterOffload but may not touch the
  // trainer itself (fused mode: the rollout thread while the trainer
  // steps): blocks until OptimizerOffloaded() confirmed the offload, so that
  // it allocates only after the state left the card. OK at once if none is
  // in flight; DeadlineExceeded once `clock` reaches `deadline`.
  absl::Status WaitOptimizerOffloaded(const Clock& clock, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The caller moved `bytes` of optimizer state back to the card; confirms
  // a reservation (or, without one, moves min(bytes, optimizer_host) back).
  // Wakes the Wait* methods.
  void OptimizerRestored(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t Get(MemoryCategory category) const ABSL_LOCKS_EXCLUDED(mu_);
  // The largest value `category` has had.
  int64_t Peak(MemoryCategory category) const ABSL_LOCKS_EXCLUDED(mu_);
  // Device bytes in use now (every category but optimizer_host) and the
  // largest that sum has been.
  int64_t InUse() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t PeakInUse() const ABSL_LOCKS_EXCLUDED(mu_);
  // True while the books say the optimizer state is (or is about to be) in
  // host memory.
  bool optimizer_offloaded() const ABSL_LOCKS_EXCLUDED(mu_);
  // True between a kGrantedAfterOffload decision and OptimizerOffloaded():
  // the state must leave the card and has not yet.
  bool offload_in_flight() const ABSL_LOCKS_EXCLUDED(mu_);

  int card_index() const { return card_index_; }
  int64_t budget_bytes() const { return budget_bytes_; }
  OffloadPolicy policy() const { return policy_; }

  // Every category by its MemoryCategoryName(), "peak_<name>" for each,
  // "in_use", "peak_total" and "budget" (0 = unlimited): what a heartbeat
  // puts in CardState.memory_bytes.
  std::map<std::string, int64_t> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

  // "card 0: in use 32.0 MiB: weights 20.0, kv_cache 12.0 MiB; budget
  // 64.0 MiB, optimizer_host 40.0 MiB, peak 60.0 MiB, offload auto".
  std::string DebugString() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  MemoryDecision RequestLocked(MemoryCategory category, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool TryReserveRestoreLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t InUseLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Updates the peaks after a change.
  void NoteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "in use 60.0 MiB: weights 20.0, optimizer 40.0".
  std::string InUseTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  int64_t& At(MemoryCategory c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return bytes_[static_cast<int>(c)];
  }

  const int card_index_;
  const int64_t budget_bytes_;
  const OffloadPolicy policy_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on every change of the books
  std::array<int64_t, kNumMemoryCategories> bytes_ ABSL_GUARDED_BY(mu_) = {};
  std::array<int64_t, kNumMemoryCategories> peak_ ABSL_GUARDED_BY(mu_) = {};
  int64_t peak_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  // Planned bytes of an offload (restore) decided but not yet confirmed by
  // OptimizerOffloaded() (OptimizerRestored()); -1 when none is in flight.
  int64_t offload_in_flight_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t restore_in_flight_ ABSL_GUARDED_BY(mu_) = -1;
};

// One line for `fusionrl status` from a Snapshot() map (possibly sent by a
// worker of another version): "card 0 memory: weights 1.2 MiB, snapshot
// 1.2 MiB, optimizer 2.4 MiB, gradients 1.2 MiB, activations 8.1 MiB
// (peak), kv_cache 0.5 MiB; in use 6.5 MiB (peak 14.6 MiB), budget 64.0 MiB".
// Categories in the order above (optimizer_host after optimizer, only when
// non-zero; activations as their peak when known), unknown keys after them
// by name; "budget unlimited" for 0. "" for an empty map.
std::string FormatCardMemory(int card_index,
                             const std::map<std::string, int64_t>& snapshot);

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_MEMORY_MANAGER_H_
