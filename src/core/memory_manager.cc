#include "core/memory_manager.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace fusionrl {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
// 2^40 MiB: the largest budget (its bytes still fit in int64).
constexpr double kMaxBudgetMib = 1099511627776.0;

constexpr MemoryCategory kDeviceCategories[] = {
    MemoryCategory::kWeights,     MemoryCategory::kSnapshot,
    MemoryCategory::kOptimizer,   MemoryCategory::kGradients,
    MemoryCategory::kActivations, MemoryCategory::kKvCache};

std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.1f", static_cast<double>(bytes) / kMiB);
}

// What a request is called in messages.
absl::string_view RequestName(MemoryCategory category) {
  return category == MemoryCategory::kKvCache ? "KV cache" : "activations";
}

}  // namespace

absl::string_view MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kWeights:
      return "weights";
    case MemoryCategory::kSnapshot:
      return "snapshot";
    case MemoryCategory::kOptimizer:
      return "optimizer";
    case MemoryCategory::kGradients:
      return "gradients";
    case MemoryCategory::kActivations:
      return "activations";
    case MemoryCategory::kKvCache:
      return "kv_cache";
    case MemoryCategory::kOptimizerHost:
      return "optimizer_host";
  }
  return "unknown";
}

bool IsDeviceMemory(MemoryCategory category) {
  return category != MemoryCategory::kOptimizerHost;
}

absl::StatusOr<std::unique_ptr<CardMemoryManager>> CardMemoryManager::Create(
    int card_index, const MemoryConfig& config) {
  if (card_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("card index must be >= 0, got ", card_index));
  }
  const double mib = config.card_budget_mib;
  if (!(mib >= 0 && mib <= kMaxBudgetMib)) {  // written so that NaN fails
    return absl::InvalidArgumentError(absl::StrCat(
        "memory.card_budget_mib: must be in [0, 2^40], got ", mib));
  }
  return std::make_unique<CardMemoryManager>(
      card_index, static_cast<int64_t>(std::llround(mib * kMiB)),
      config.offload_optimizer);
}

CardMemoryManager::CardMemoryManager(int card_index, int64_t budget_bytes,
                                     OffloadPolicy policy)
    : card_index_(card_index),
      budget_bytes_(std::max<int64_t>(0, budget_bytes)),
      policy_(policy) {}

void CardMemoryManager::Set(MemoryCategory category, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  At(category) = std::max<int64_t>(0, bytes);
  NoteLocked();
}

MemoryDecision CardMemoryManager::RequestKvCache(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  return RequestLocked(MemoryCategory::kKvCache, bytes);
}

MemoryDecision CardMemoryManager::RequestActivations(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  return RequestLocked(MemoryCategory::kActivations, bytes);
}

MemoryDecision CardMemoryManager::RequestLocked(MemoryCategory category,
                                                int64_t bytes) {
  bytes = std::max<int64_t>(0, bytes);
  MemoryDecision decision;
  const int64_t current = At(category);
  const int64_t others = InUseLocked() - current;
  if (budget_bytes_ == 0 || bytes <= current ||
      others + bytes <= budget_bytes_) {
    At(category) = bytes;
    NoteLocked();
    return decision;
  }
  const int64_t optimizer = At(MemoryCategory::kOptimizer);
  const bool in_flight = offload_in_flight_ >= 0 || restore_in_flight_ >= 0;
  if (policy_ == OffloadPolicy::kAuto && !in_flight && optimizer > 0 &&
      others - optimizer + bytes <= budget_bytes_) {
    At(MemoryCategory::kOptimizer) = 0;
    At(MemoryCategory::kOptimizerHost) += optimizer;
    At(category) = bytes;
    offload_in_flight_ = optimizer;
    NoteLocked();
    decision.outcome = MemoryDecision::Outcome::kGrantedAfterOffload;
    decision.offload_bytes = optimizer;
    return decision;
  }
  std::string why;
  if (policy_ == OffloadPolicy::kNever) {
    why = "optimizer offload is off (memory.offload_optimizer: never)";
  } else if (in_flight) {
    why = "an optimizer offload or restore is in flight";
  } else if (optimizer == 0) {
    why = "no optimizer state on the card to offload";
  } else {
    why = absl::StrCat("offloading the optimizer state (", Mib(optimizer),
                       " MiB) would not be enough");
  }
  decision.outcome = MemoryDecision::Outcome::kRefused;
  decision.message = absl::StrCat(
      "card ", card_index_, ": ", RequestName(category), " needs ",
      Mib(bytes - current), " MiB more; budget ", Mib(budget_bytes_), " MiB, ",
      InUseTextLocked(), "; short by ", Mib(others + bytes - budget_bytes_),
      " MiB; ", why);
  return decision;
}

void CardMemoryManager::OptimizerOffloaded(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  bytes = std::max<int64_t>(0, bytes);
  int64_t& host = At(MemoryCategory::kOptimizerHost);
  if (offload_in_flight_ >= 0) {
    host = std::max<int64_t>(0, host - offload_in_flight_ + bytes);
    offload_in_flight_ = -1;
  } else {
    int64_t& device = At(MemoryCategory::kOptimizer);
    const int64_t moved = std::min(bytes, device);
    device -= moved;
    host += moved;
  }
  NoteLocked();
}

bool CardMemoryManager::OptimizerRestoreNeeded() {
  absl::MutexLock lock(&mu_);
  return TryReserveRestoreLocked();
}

bool CardMemoryManager::TryReserveRestoreLocked() {
  const int64_t host = At(MemoryCategory::kOptimizerHost);
  if (host == 0 || offload_in_flight_ >= 0 || restore_in_flight_ >= 0) {
    return false;
  }
  if (budget_bytes_ > 0 && InUseLocked() + host > budget_bytes_) return false;
  At(MemoryCategory::kOptimizerHost) = 0;
  At(MemoryCategory::kOptimizer) += host;
  restore_in_flight_ = host;
  NoteLocked();
  return true;
}

absl::StatusOr<int64_t> CardMemoryManager::WaitOptimizerRestore(
    const Clock& clock, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    // Nothing offloaded, an offload decided but not carried out (the state
    // is still on the card), or a restore already reserved.
    if (At(MemoryCategory::kOptimizerHost) == 0 || offload_in_flight_ >= 0 ||
        restore_in_flight_ >= 0) {
      return 0;
    }
    if (TryReserveRestoreLocked()) return restore_in_flight_;
    if (WaitOnClock(cv_, mu_, clock, deadline)) {  // timed out: a last look
      if (TryReserveRestoreLocked()) return restore_in_flight_;
      return absl::DeadlineExceededError(
          absl::StrCat("card ", card_index_, ": optimizer state (",
                       Mib(At(MemoryCategory::kOptimizerHost)),
                       " MiB) cannot come back: budget ", Mib(budget_bytes_),
                       " MiB, ", InUseTextLocked()));
    }
  }
}

absl::Status CardMemoryManager::WaitOptimizerOffloaded(const Clock& clock,
                                                       absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (offload_in_flight_ >= 0) {
    if (WaitOnClock(cv_, mu_, clock, deadline) && offload_in_flight_ >= 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "card ", card_index_, ": the optimizer state (",
          Mib(offload_in_flight_),
          " MiB) was not offloaded in time; the trainer carries it out "
          "between steps"));
    }
  }
  return absl::OkStatus();
}

void CardMemoryManager::OptimizerRestored(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  bytes = std::max<int64_t>(0, bytes);
  int64_t& device = At(MemoryCategory::kOptimizer);
  if (restore_in_flight_ >= 0) {
    device = std::max<int64_t>(0, device - restore_in_flight_ + bytes);
    restore_in_flight_ = -1;
  } else {
    int64_t& host = At(MemoryCategory::kOptimizerHost);
    const int64_t moved = std::min(bytes, host);
    host -= moved;
    device += moved;
  }
  NoteLocked();
}

int64_t CardMemoryManager::Get(MemoryCategory category) const {
  absl::MutexLock lock(&mu_);
  return bytes_[static_cast<int>(category)];
}

int64_t CardMemoryManager::Peak(MemoryCategory category) const {
  absl::MutexLock lock(&mu_);
  return peak_[static_cast<int>(category)];
}

int64_t CardMemoryManager::InUse() const {
  absl::MutexLock lock(&mu_);
  return InUseLocked();
}

int64_t CardMemoryManager::PeakInUse() const {
  absl::MutexLock lock(&mu_);
  return peak_in_use_;
}

bool CardMemoryManager::offload_in_flight() const {
  absl::MutexLock lock(&mu_);
  return offload_in_flight_ >= 0;
}

bool CardMemoryManager::optimizer_offloaded() const {
  absl::MutexLock lock(&mu_);
  return bytes_[static_cast<int>(MemoryCategory::kOptimizerHost)] > 0 ||
         offload_in_flight_ >= 0;
}

int64_t CardMemoryManager::InUseLocked() const {
  int64_t sum = 0;
  for (MemoryCategory c : kDeviceCategories) sum += bytes_[static_cast<int>(c)];
  return sum;
}

void CardMemoryManager::NoteLocked() {
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    peak_[i] = std::max(peak_[i], bytes_[i]);
  }
  peak_in_use_ = std::max(peak_in_use_, InUseLocked());
  cv_.SignalAll();
}

std::string CardMemoryManager::InUseTextLocked() const {
  std::vector<std::string> parts;
  for (MemoryCategory c : kDeviceCategories) {
    const int64_t bytes = bytes_[static_cast<int>(c)];
    if (bytes > 0) {
      parts.push_back(absl::StrCat(MemoryCategoryName(c), " ", Mib(bytes)));
    }
  }
  if (parts.empty()) parts.push_back("nothing");
  return absl::StrCat("in use ", Mib(InUseLocked()),
                      " MiB: ", absl::StrJoin(parts, ", "));
}

std::map<std::string, int64_t> CardMemoryManager::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, int64_t> out;
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    const std::string name(MemoryCategoryName(static_cast<MemoryCategory>(i)));
    out[name] = bytes_[i];
    out["peak_" + name] = peak_[i];
  }
  out["in_use"] = InUseLocked();
  out["peak_total"] = peak_in_use_;
  out["budget"] = budget_bytes_;
  return out;
}

std::string CardMemoryManager::DebugString() const {
  absl::MutexLock lock(&mu_);
  std::string out = absl::StrCat("card ", card_index_, ": ", InUseTextLocked(),
                                 " MiB; budget ");
  absl::StrAppend(&out, budget_bytes_ == 0
                            ? std::string("unlimited")
                            : absl::StrCat(Mib(budget_bytes_), " MiB"));
  const int64_t host = bytes_[static_cast<int>(MemoryCategory::kOptimizerHost)];
  if (host > 0) absl::StrAppend(&out, ", optimizer_host ", Mib(host), " MiB");
  absl::StrAppend(&out, ", peak ", Mib(peak_in_use_), " MiB, offload ",
                  policy_ == OffloadPolicy::kAuto ? "auto" : "never");
  if (offload_in_flight_ >= 0) absl::StrAppend(&out, " (offload in flight)");
  if (restore_in_flight_ >= 0) absl::StrAppend(&out, " (restore in flight)");
  return out;
}

std::string FormatCardMemory(int card_index,
                             const std::map<std::string, int64_t>& snapshot) {
  if (snapshot.empty()) return "";
  std::set<std::string> used = {"in_use", "peak_total", "budget"};
  std::vector<std::string> parts;
  const auto find = [&](const std::string& key) -> const int64_t* {
    auto it = snapshot.find(key);
    return it == snapshot.end() ? nullptr : &it->second;
  };
  const auto mib = [](int64_t bytes) {
    return absl::StrCat(Mib(bytes), " MiB");
  };
  for (MemoryCategory c :
       {MemoryCategory::kWeights, MemoryCategory::kSnapshot,
        MemoryCategory::kOptimizer, MemoryCategory::kOptimizerHost,
        MemoryCategory::kGradients, MemoryCategory::kActivations,
        MemoryCategory::kKvCache}) {
    const std::string name(MemoryCategoryName(c));
    const std::string peak_name = "peak_" + name;
    used.insert(name);
    used.insert(peak_name);
    const int64_t* value = find(name);
    const int64_t* peak = find(peak_name);
    if (c == MemoryCategory::kOptimizerHost) {
      if (value != nullptr && *value > 0) {
        parts.push_back(absl::StrCat(name, " ", mib(*value)));
      }
    } else if (c == MemoryCategory::kActivations && peak != nullptr) {
      parts.push_back(absl::StrCat(name, " ", mib(*peak), " (peak)"));
    } else if (value != nullptr) {
      parts.push_back(absl::StrCat(name, " ", mib(*value)));
    }
  }
  for (const auto& [key, value] : snapshot) {
    if (used.count(key) == 0)
      parts.push_back(absl::StrCat(key, " ", mib(value)));
  }
  std::string out = absl::StrCat("card ", card_index,
                                 " memory: ", absl::StrJoin(parts, ", "));
  std::vector<std::string> tail;
  if (const int64_t* in_use = find("in_use")) {
    const int64_t* peak = find("peak_total");
    tail.push_back(absl::StrCat(
        "in use ", mib(*in_use),
        peak != nullptr ? absl::StrCat(" (peak ", mib(*peak), ")") : ""));
  }
  if (const int64_t* budget = find("budget")) {
    tail.push_back(*budget == 0 ? std::string("budget unlimited")
                                : absl::StrCat("budget ", mib(*budget)));
  }
  if (!tail.empty()) absl::StrAppend(&out, "; ", absl::StrJoin(tail, ", "));
  return out;
}

}  // namespace fusionrl
