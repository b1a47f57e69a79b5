// RendezvousStore: the small key-value store through which the cards of a
// job form their c10d process group (the data plane), hosted by the
// controller.
//
// It has the semantics of c10d's TCPStore (set, compare-set, blocking get,
// add, check, wait, delete) so that a c10d::Store adapter on the worker
// (worker/controller_store.h) can hand it to ProcessGroupGloo unchanged. It
// carries only addresses and counters of the rendezvous, a few hundred bytes
// per card and generation: tensor bytes never go through it.
//
// Keys live in scopes, one per rendezvous generation of a job (the
// controller names them "<job>/<generation>"). When the controller starts a
// new generation (a node was lost, an attempt aborted) it closes the old
// scope: its keys are gone, every call on it, including those waiting,
// returns Aborted at once, so a card stuck in the old group's rendezvous or
// probing it learns to re-form. A closed scope stays a tombstone (a few
// bytes); the oldest tombstones are forgotten past kMaxClosedScopes.
//
// Limits (so a buggy or hostile caller cannot grow the controller without
// bound): keys of at most kMaxKeyBytes, values of at most kMaxValueBytes,
// at most kMaxKeysPerScope keys per scope and kMaxScopes open scopes; past them
// a call is ResourceExhausted or InvalidArgument, never a crash.
//
// Ownership: borrows `clock`, which must outlive the store.
// Thread safety: thread-safe. Blocking calls (Get, Wait) wait on the clock
// with a deadline and never hold the lock while they sleep.
#ifndef FUSIONRL_CONTROLLER_RENDEZVOUS_STORE_H_
#define FUSIONRL_CONTROLLER_RENDEZVOUS_STORE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace fusionrl {

class RendezvousStore {
 public:
  static constexpr size_t kMaxKeyBytes = 1024;
  static constexpr size_t kMaxValueBytes = 1 << 20;
  static constexpr size_t kMaxKeysPerScope = 1 << 16;
  static constexpr size_t kMaxScopes = 4096;
  static constexpr size_t kMaxClosedScopes = 4096;

  explicit RendezvousStore(const Clock& clock);

  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  // Stores `value` under `key` (replacing any value there).
  absl::Status Set(const std::string& scope, const std::string& key,
                   std::string value);
  // If `key` holds `expected` (or is absent and `expected` is empty), stores
  // `desired`. Returns the value the key holds afterwards (c10d's rule: on a
  // mismatch, the current value; when absent and `expected` is not empty,
  // `expected` itself).
  absl::StatusOr<std::string> CompareSet(const std::string& scope,
                                         const std::string& key,
                                         const std::string& expected,
                                         std::string desired);
  // The value of `key`, waiting until `deadline` for it to be set.
  // DeadlineExceeded names the key when it never appears.
  absl::StatusOr<std::string> Get(const std::string& scope,
                                  const std::string& key, absl::Time deadline);
  // Adds `delta` to the integer under `key` (absent: 0) and returns the
  // result. The value is kept as decimal text, as TCPStore does.
  // FailedPrecondition: the key holds something that is not an integer.
  absl::StatusOr<int64_t> Add(const std::string& scope, const std::string& key,
                              int64_t delta);
  // Whether every key in `keys` is set (no wait).
  absl::StatusOr<bool> Check(const std::string& scope,
                             const std::vector<std::string>& keys);
  // Waits until every key in `keys` is set, or `deadline`.
  absl::Status Wait(const std::string& scope,
                    const std::vector<std::string>& keys, absl::Time deadline);
  // Removes `key`; whether it was there.
  absl::StatusOr<bool> Delete(const std::string& scope, const std::string& key);
  // Keys in `scope`.
  int64_t NumKeys(const std::string& scope) const;

  // Closes `scope` (which need not exist yet): its keys are dropped, calls
  // on it (waiting or new) return Aborted.
  void CloseScope(const std::string& scope);
  int64_t open_scopes() const;

 private:
  struct Scope {
    std::map<std::string, std::string> keys;
    bool closed = false;
  };

  // The open scope, created if needed (ResourceExhausted past kMaxScopes,
  // Aborted when closed).
  absl::StatusOr<Scope*> MutableScopeLocked(const std::string& scope)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static absl::Status ClosedError(const std::string& scope);
  static absl::Status CheckKey(const std::string& scope,
                               const std::string& key);
  absl::Status CheckRoomLocked(const Scope& s, const std::string& key,
                               size_t value_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool AllSet(const Scope& s, const std::vector<std::string>& keys);
  // Wait()'s loop; on OK every key is set in the (open) scope.
  absl::Status WaitLocked(const std::string& scope,
                          const std::vector<std::string>& keys,
                          absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock& clock_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::string, Scope> scopes_ ABSL_GUARDED_BY(mu_);
  size_t open_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::string> closed_order_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_RENDEZVOUS_STORE_H_
