#include "core/weight_store.h"

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/crc32c.h"

namespace fusionrl {
namespace {

std::string Hex32(uint32_t v) { return absl::StrFormat("0x%08x", v); }

std::string NoWeights(const std::string& job_id) {
  return absl::StrCat(job_id, " has no weights");
}

}  // namespace

WeightStore::WeightStore(const Clock& clock, int keep_versions_per_job)
    : clock_(clock), keep_versions_per_job_(keep_versions_per_job) {
  if (keep_versions_per_job < 1) {  // a broken invariant
    std::fprintf(stderr,
                 "WeightStore: keep_versions_per_job must be >= 1, got %d\n",
                 keep_versions_per_job);
    std::abort();
  }
}

std::string WeightStore::KeptList(const VersionMap& versions) {
  std::vector<int64_t> kept;
  kept.reserve(versions.size());
  for (const auto& [v, unused] : versions) kept.push_back(v);
  return absl::StrCat("kept: ", absl::StrJoin(kept, ", "));
}

absl::Status WeightStore::Put(const std::string& job_id, int64_t version,
                              const std::string& super_node, std::string bytes,
                              std::optional<uint32_t> expected_crc32c) {
  auto reject = [this](absl::Status status) {
    absl::MutexLock lock(&mu_);
    ++stats_.rejected_puts;
    return status;
  };
  if (job_id.empty()) {
    return reject(absl::InvalidArgumentError("job_id: must not be empty"));
  }
  if (version < 1) {
    return reject(absl::InvalidArgumentError(
        absl::StrCat(job_id, ": version must be >= 1, got ", version)));
  }
  // Hash outside the lock: a 1 GiB payload takes a while.
  const uint32_t crc = Crc32c(bytes);
  if (expected_crc32c.has_value() && *expected_crc32c != crc) {
    return reject(absl::DataLossError(absl::StrCat(
        job_id, " version ", version, ": CRC-32C of the ", bytes.size(),
        " bytes is ", Hex32(crc), ", expected ", Hex32(*expected_crc32c))));
  }
  const absl::Time now = clock_.Now();
  const auto size = static_cast<int64_t>(bytes.size());

  WeightVersion existing;  // set when `version` is already kept
  {
    absl::MutexLock lock(&mu_);
    VersionMap& versions = jobs_[job_id];
    if (auto it = versions.find(version); it != versions.end()) {
      existing = it->second;
    } else if (!versions.empty() && version < versions.rbegin()->first) {
      const int64_t newest = versions.rbegin()->first;
      ++stats_.rejected_puts;
      return absl::FailedPreconditionError(absl::StrCat(
          job_id, ": version ", version,
          " is not newer than the newest stored version ", newest));
    } else {
      WeightVersion& stored = versions[version];
      stored.job_id = job_id;
      stored.version = version;
      stored.super_node = super_node;
      stored.bytes = std::make_shared<const std::string>(std::move(bytes));
      stored.crc32c = crc;
      stored.published = now;
      total_bytes_ += size;
      ++stats_.puts;
      stats_.bytes_in += size;
      job_bytes_[job_id] += size;
      while (versions.size() > static_cast<size_t>(keep_versions_per_job_)) {
        total_bytes_ -=
            static_cast<int64_t>(versions.begin()->second.bytes->size());
        versions.erase(versions.begin());
        ++stats_.evictions;
      }
      return absl::OkStatus();
    }
  }

  // A re-publish of a kept version: compare outside the lock (stored bytes
  // are immutable, and `existing` keeps them alive).
  const bool same = existing.super_node == super_node &&
                    existing.crc32c == crc && *existing.bytes == bytes;
  absl::MutexLock lock(&mu_);
  if (same) {
    ++stats_.duplicate_puts;
    return absl::OkStatus();
  }
  ++stats_.rejected_puts;
  return absl::AlreadyExistsError(absl::StrCat(
      job_id, " version ", version, " is already stored with ",
      existing.super_node == super_node ? "different bytes"
                                        : "another super node",
      " (stored: ", existing.bytes->size(), " bytes, crc32c ",
      Hex32(existing.crc32c), ", from super node '", existing.super_node,
      "'; offered: ", bytes.size(), " bytes, crc32c ", Hex32(crc),
      ", from super node '", super_node, "')"));
}

absl::StatusOr<WeightVersion> WeightStore::Get(const std::string& job_id,
                                               int64_t version) const {
  if (version < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        job_id, ": version must be >= 0 (0 = newest), got ", version));
  }
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end() || job->second.empty()) {
    ++stats_.misses;
    return absl::NotFoundError(NoWeights(job_id));
  }
  const VersionMap& versions = job->second;
  auto it = version == 0 ? std::prev(versions.end()) : versions.find(version);
  if (it == versions.end()) {
    ++stats_.misses;
    return absl::NotFoundError(absl::StrCat(job_id, " has no version ", version,
                                            "; ", KeptList(versions)));
  }
  ++stats_.gets;
  stats_.bytes_out += static_cast<int64_t>(it->second.bytes->size());
  job_bytes_[job_id] += static_cast<int64_t>(it->second.bytes->size());
  return it->second;
}

int64_t WeightStore::job_bytes(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = job_bytes_.find(job_id);
  return it == job_bytes_.end() ? 0 : it->second;
}

std::vector<int64_t> WeightStore::Versions(const std::string& job_id) const {
  std::vector<int64_t> out;
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return out;
  out.reserve(job->second.size());
  for (const auto& [v, unused] : job->second) out.push_back(v);
  return out;
}

std::vector<std::string> WeightStore::Jobs() const {
  std::vector<std::string> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [job_id, versions] : jobs_) {
    if (!versions.empty()) out.push_back(job_id);
  }
  return out;
}

absl::Status WeightStore::RemoveJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end() || job->second.empty()) {
    return absl::NotFoundError(NoWeights(job_id));
  }
  for (const auto& [v, stored] : job->second) {
    total_bytes_ -= static_cast<int64_t>(stored.bytes->size());
  }
  jobs_.erase(job);
  return absl::OkStatus();
}

int64_t WeightStore::total_bytes() const {
  absl::MutexLock lock(&mu_);
  return total_bytes_;
}

WeightStore::Stats WeightStore::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::string WeightStore::DebugString() const {
  const absl::Time now = clock_.Now();
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [job_id, versions] : jobs_) {
    if (versions.empty()) continue;
    std::vector<int64_t> kept;
    int64_t bytes = 0;
    for (const auto& [v, stored] : versions) {
      kept.push_back(v);
      bytes += static_cast<int64_t>(stored.bytes->size());
    }
    const WeightVersion& newest = versions.rbegin()->second;
    absl::StrAppend(
        &out, job_id, " kept=", absl::StrJoin(kept, ","),
        " newest=", newest.version, " super_node=", newest.super_node,
        " bytes=", bytes, " crc32c=", Hex32(newest.crc32c),
        " age=", absl::FormatDuration(now - newest.published), "\n");
  }
  return out;
}

}  // namespace fusionrl
