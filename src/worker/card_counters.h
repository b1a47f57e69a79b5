// CardCounters: what a worker's heartbeats report about one of its cards,
// written by the card threads of the job that runs on it.
#ifndef FUSIONRL_WORKER_CARD_COUNTERS_H_
#define FUSIONRL_WORKER_CARD_COUNTERS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/card_role.h"
#include "core/memory_manager.h"

namespace fusionrl {

struct CardCounters {
  std::atomic<bool> active{false};              // in a job
  std::atomic<CardRole> role{CardRole::kIdle};  // while active
  std::atomic<int64_t> busy_us{0};  // microseconds in rollout + train

  // The card's memory books while it runs a job (heartbeats report them).
  void SetMemory(std::shared_ptr<CardMemoryManager> m) {
    absl::MutexLock lock(&memory_mu);
    memory = std::move(m);
  }
  std::shared_ptr<CardMemoryManager> Memory() {
    absl::MutexLock lock(&memory_mu);
    return memory;
  }

  // What the card does now, since when (heartbeats report it; a card stuck
  // in one activity is what the controller's watchdog names). "" = idle.
  void SetActivity(std::string what) {
    absl::MutexLock lock(&memory_mu);
    if (what == activity) return;
    activity = std::move(what);
    activity_since = absl::Now();
  }
  std::pair<std::string, absl::Duration> Activity() {
    absl::MutexLock lock(&memory_mu);
    return {activity, activity.empty() ? absl::ZeroDuration()
                                       : absl::Now() - activity_since};
  }

 private:
  absl::Mutex memory_mu;
  std::shared_ptr<CardMemoryManager> memory ABSL_GUARDED_BY(memory_mu);
  std::string activity ABSL_GUARDED_BY(memory_mu);
  absl::Time activity_since ABSL_GUARDED_BY(memory_mu);
};

}  // namespace fusionrl

#endif  // FUSIONRL_WORKER_CARD_COUNTERS_H_
