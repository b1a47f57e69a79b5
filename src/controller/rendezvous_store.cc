#include "controller/rendezvous_store.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusionrl {

RendezvousStore::RendezvousStore(const Clock& clock) : clock_(clock) {}

absl::Status RendezvousStore::CheckKey(const std::string& scope,
                                       const std::string& key) {
  if (scope.empty()) {
    return absl::InvalidArgumentError("rendezvous store: empty scope");
  }
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous store: a key must have 1 to ", kMaxKeyBytes,
                     " bytes, got ", key.size()));
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::ClosedError(const std::string& scope) {
  return absl::AbortedError(
      absl::StrCat("rendezvous generation ", scope,
                   " is over (a node was lost or the attempt was aborted); "
                   "re-form the group at the new generation"));
}

absl::StatusOr<RendezvousStore::Scope*> RendezvousStore::MutableScopeLocked(
    const std::string& scope) {
  auto it = scopes_.find(scope);
  if (it != scopes_.end()) {
    if (it->second.closed) return ClosedError(scope);
    return &it->second;
  }
  if (open_ >= kMaxScopes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous store: already ", kMaxScopes, " open generations"));
  }
  ++open_;
  return &scopes_[scope];
}

absl::Status RendezvousStore::CheckRoomLocked(const Scope& s,
                                              const std::string& key,
                                              size_t value_bytes) const {
  if (value_bytes > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous store: value of ", key, " has ", value_bytes,
                     " bytes, more than ", kMaxValueBytes));
  }
  if (s.keys.size() >= kMaxKeysPerScope && s.keys.count(key) == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous store: the generation already holds ",
                     kMaxKeysPerScope, " keys"));
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::Set(const std::string& scope,
                                  const std::string& key, std::string value) {
  if (absl::Status s = CheckKey(scope, key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Scope*> s = MutableScopeLocked(scope);
  if (!s.ok()) return s.status();
  if (absl::Status room = CheckRoomLocked(**s, key, value.size()); !room.ok()) {
    return room;
  }
  (*s)->keys[key] = std::move(value);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::CompareSet(
    const std::string& scope, const std::string& key,
    const std::string& expected, std::string desired) {
  if (absl::Status s = CheckKey(scope, key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Scope*> s = MutableScopeLocked(scope);
  if (!s.ok()) return s.status();
  std::map<std::string, std::string>& keys = (*s)->keys;
  auto it = keys.find(key);
  const bool absent = it == keys.end();
  if ((absent && !expected.empty()) || (!absent && it->second != expected)) {
    return absent ? expected : it->second;
  }
  if (absl::Status room = CheckRoomLocked(**s, key, desired.size());
      !room.ok()) {
    return room;
  }
  keys[key] = desired;
  changed_.SignalAll();
  return desired;
}

bool RendezvousStore::AllSet(const Scope& s,
                             const std::vector<std::string>& keys) {
  for (const std::string& k : keys) {
    if (s.keys.count(k) == 0) return false;
  }
  return true;
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& scope,
                                                 const std::string& key,
                                                 absl::Time deadline) {
  if (absl::Status s = CheckKey(scope, key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = WaitLocked(scope, {key}, deadline); !s.ok()) return s;
  return scopes_.at(scope).keys.at(key);
}

absl::StatusOr<int64_t> RendezvousStore::Add(const std::string& scope,
                                             const std::string& key,
                                             int64_t delta) {
  if (absl::Status s = CheckKey(scope, key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Scope*> s = MutableScopeLocked(scope);
  if (!s.ok()) return s.status();
  std::map<std::string, std::string>& keys = (*s)->keys;
  int64_t value = 0;
  auto it = keys.find(key);
  if (it != keys.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rendezvous store: ", key, " does not hold an integer, cannot add"));
  }
  if (absl::Status room = CheckRoomLocked(**s, key, 0); !room.ok()) {
    return room;
  }
  value += delta;
  keys[key] = absl::StrCat(value);
  changed_.SignalAll();
  return value;
}

absl::StatusOr<bool> RendezvousStore::Check(
    const std::string& scope, const std::vector<std::string>& keys) {
  for (const std::string& k : keys) {
    if (absl::Status s = CheckKey(scope, k); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Scope*> s = MutableScopeLocked(scope);
  if (!s.ok()) return s.status();
  return AllSet(**s, keys);
}

absl::Status RendezvousStore::Wait(const std::string& scope,
                                   const std::vector<std::string>& keys,
                                   absl::Time deadline) {
  for (const std::string& k : keys) {
    if (absl::Status s = CheckKey(scope, k); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  return WaitLocked(scope, keys, deadline);
}

absl::Status RendezvousStore::WaitLocked(const std::string& scope,
                                         const std::vector<std::string>& keys,
                                         absl::Time deadline) {
  for (bool passed = false;;) {
    absl::StatusOr<Scope*> s = MutableScopeLocked(scope);
    if (!s.ok()) return s.status();
    if (AllSet(**s, keys)) return absl::OkStatus();
    if (passed) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous store: waited for ", absl::StrJoin(keys, ", "),
          " of generation ", scope,
          " until the deadline; a card of the group never set them"));
    }
    passed = WaitOnClock(changed_, mu_, clock_, deadline);
  }
}

absl::StatusOr<bool> RendezvousStore::Delete(const std::string& scope,
                                             const std::string& key) {
  if (absl::Status s = CheckKey(scope, key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Scope*> s = MutableScopeLocked(scope);
  if (!s.ok()) return s.status();
  return (*s)->keys.erase(key) > 0;
}

int64_t RendezvousStore::NumKeys(const std::string& scope) const {
  absl::MutexLock lock(&mu_);
  auto it = scopes_.find(scope);
  return it == scopes_.end() ? 0 : static_cast<int64_t>(it->second.keys.size());
}

void RendezvousStore::CloseScope(const std::string& scope) {
  absl::MutexLock lock(&mu_);
  auto [it, created] = scopes_.try_emplace(scope);
  if (it->second.closed) return;
  if (!created) --open_;
  it->second.keys.clear();
  it->second.closed = true;
  closed_order_.push_back(scope);
  while (closed_order_.size() > kMaxClosedScopes) {
    scopes_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
  changed_.SignalAll();
}

int64_t RendezvousStore::open_scopes() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(open_);
}

}  // namespace fusionrl
