// The controller's versioned weight snapshots: what super nodes publish after
// each optimizer step and what other super nodes and rollout engines fetch.
#ifndef FUSIONRL_CORE_WEIGHT_STORE_H_
#define FUSIONRL_CORE_WEIGHT_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace fusionrl {

// One stored version of one job's weights: opaque serialized bytes (the store
// never looks inside) and their CRC-32C.
//
// `bytes` is shared and immutable: a reader that got this from
// WeightStore::Get() may stream it for as long as it likes, without a copy
// and without holding the store's lock, even after the store evicted the
// version (the last holder frees the bytes).
struct WeightVersion {
  std::string job_id;
  int64_t version = 0;     // >= 1: optimizer steps behind the weights
  std::string super_node;  // who published it, as the publisher said
  std::shared_ptr<const std::string> bytes;  // never null in a stored version
  uint32_t crc32c = 0;                       // Crc32c(*bytes)
  absl::Time published;  // clock time of the Put that stored it
};

// WeightStore: the newest few versions of each job's weights, in memory.
//
// Versions of a job are stored in increasing order: Put() accepts a version
// only if it is newer than every version the job has stored, so a slow or
// retried publisher can never roll a job back. The one exception is a
// re-publish of a version the store still keeps with the same super node and
// identical bytes: that is an idempotent no-op returning OK (a publisher
// whose reply got lost retries safely); the same version with different bytes
// or a different super node is AlreadyExists. After each stored version only
// the newest `keep_versions_per_job` versions of that job are kept; older
// ones are evicted (readers holding them keep their bytes alive).
//
// Versions need not be consecutive (a job may publish only every few steps).
// RemoveJob() forgets a job entirely; after it the job starts afresh.
//
// Ownership: borrows `clock`, which must outlive the store. Owns the stored
// bytes jointly with the readers they were handed to.
// Thread safety: thread-safe. One internal mutex guards the tables; it is
// never held while hashing or comparing payload bytes, nor while calling out
// (the Clock is the only callee, and is called outside it), so a large Put
// does not stall concurrent Gets.
class WeightStore {
 public:
  // Counters since construction.
  struct Stats {
    int64_t puts = 0;            // versions stored
    int64_t duplicate_puts = 0;  // idempotent re-publishes (OK, no change)
    int64_t rejected_puts = 0;   // Puts that returned an error
    int64_t evictions = 0;       // versions evicted to keep the newest N
    int64_t gets = 0;            // successful Gets
    int64_t misses = 0;          // Gets that returned NotFound
    int64_t bytes_in = 0;        // payload bytes of the versions stored
    int64_t bytes_out = 0;       // payload bytes of the versions Get returned
  };

  // REQUIRES: keep_versions_per_job >= 1 (aborts otherwise).
  WeightStore(const Clock& clock, int keep_versions_per_job);

  WeightStore(const WeightStore&) = delete;
  WeightStore& operator=(const WeightStore&) = delete;

  // Stores `bytes` as `version` of `job_id`, published by `super_node`.
  //   InvalidArgument: empty job_id, or version < 1.
  //   DataLoss: `expected_crc32c` is set and differs from the CRC-32C of
  //     `bytes` ("job-1 version 3: CRC-32C of the 1024 bytes is 0x...,
  //     expected 0x..."); nothing is stored.
  //   OK (no-op): the version is still kept, with the same super node and
  //     identical bytes.
  //   AlreadyExists: the version is still kept with other bytes or from
  //     another super node.
  //   FailedPrecondition: the version is not newer than the newest stored
  //     ("job-1: version 3 is not newer than the newest stored version 5").
  absl::Status Put(const std::string& job_id, int64_t version,
                   const std::string& super_node, std::string bytes,
                   std::optional<uint32_t> expected_crc32c = std::nullopt);

  // The stored `version` of `job_id`, or the newest one when version == 0.
  //   InvalidArgument: version < 0.
  //   NotFound: "job-9 has no weights" (nothing stored, or removed), or
  //     "job-1 has no version 2; kept: 4, 5, 6" (never published, or
  //     evicted).
  absl::StatusOr<WeightVersion> Get(const std::string& job_id,
                                    int64_t version) const;

  // The versions kept for `job_id`, oldest first; empty for an unknown job.
  std::vector<int64_t> Versions(const std::string& job_id) const;

  // Every job with stored weights, in byte order of the id.
  std::vector<std::string> Jobs() const;

  // Forgets every version of `job_id` (the job ended). Readers holding its
  // versions keep their bytes. NotFound ("job-9 has no weights") if none.
  absl::Status RemoveJob(const std::string& job_id);

  // Sum of the payload sizes of every kept version of every job.
  int64_t total_bytes() const;
  int keep_versions_per_job() const { return keep_versions_per_job_; }
  Stats stats() const;
  // Payload bytes of `job_id`'s versions stored (Put) plus those handed out
  // (Get) since construction: the job's weight bytes that went through
  // this store (0 for a job it never saw; kept after RemoveJob).
  int64_t job_bytes(const std::string& job_id) const;

  // One line per job, in job order, e.g.
  // "job-1 kept=4,5,6 newest=6 super_node=sn-a bytes=3072 crc32c=0x1a2b3c4d
  //  age=2.5s"; "" when empty. `bytes` is over the kept versions, `crc32c`
  // and `age` are the newest version's.
  std::string DebugString() const;

 private:
  // One job's kept versions, keyed by version (so iteration is oldest first).
  using VersionMap = std::map<int64_t, WeightVersion>;

  // "kept: 4, 5, 6".
  static std::string KeptList(const VersionMap& versions);

  const Clock& clock_;
  const int keep_versions_per_job_;

  mutable absl::Mutex mu_;
  // Jobs with at least one kept version; a job with none is erased.
  std::map<std::string, VersionMap> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  mutable Stats stats_ ABSL_GUARDED_BY(mu_);
  mutable std::map<std::string, int64_t> job_bytes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_WEIGHT_STORE_H_
