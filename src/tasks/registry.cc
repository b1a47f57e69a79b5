#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "fusionrl/task.h"
#include "tasks/builtin_tasks.h"
#include "tasks/jsonl_task.h"
#include "tasks/rewards.h"

namespace fusionrl {
namespace {

absl::Status UnknownNameError(const std::string& key, const std::string& kind,
                              const std::string& name,
                              const std::vector<std::string>& known) {
  return absl::NotFoundError(
      absl::StrCat(key, ": unknown ", kind, " '", name,
                   "' (known: ", absl::StrJoin(known, ", "), ")"));
}

// A locked name -> factory map; the shared body of both registries.
// Thread-safe.
template <typename Factory>
class FactoryMap {
 public:
  absl::Status Register(const std::string& kind, const std::string& name,
                        Factory factory) {
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot register a ", kind, " with an empty name"));
    }
    if (!factory) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot register ", kind, " '", name, "' with an empty factory"));
    }
    absl::MutexLock lock(&mu_);
    if (!factories_.emplace(name, std::move(factory)).second) {
      return absl::AlreadyExistsError(
          absl::StrCat(kind, " '", name, "' is already registered"));
    }
    return absl::OkStatus();
  }

  // The factory for `name`, or NotFound "<key>: unknown <kind> 'name'
  // (known: ...)". Returned by value so it runs without the lock held.
  absl::StatusOr<Factory> Find(const std::string& key, const std::string& kind,
                               const std::string& name) const {
    absl::MutexLock lock(&mu_);
    const auto it = factories_.find(name);
    if (it == factories_.end()) {
      return UnknownNameError(key, kind, name, NamesLocked());
    }
    return it->second;
  }

  std::vector<std::string> Names() const {
    absl::MutexLock lock(&mu_);
    return NamesLocked();
  }

 private:
  std::vector<std::string> NamesLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> names;
    names.reserve(factories_.size());
    for (const auto& [name, factory] : factories_) names.push_back(name);
    return names;  // sorted: std::map
  }

  mutable absl::Mutex mu_;
  std::map<std::string, Factory> factories_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

struct TaskRegistry::Rep {
  FactoryMap<TaskFactory> map;
};

struct RewardRegistry::Rep {
  FactoryMap<RewardFactory> map;
};

TaskRegistry::TaskRegistry() : rep_(std::make_unique<Rep>()) {}
TaskRegistry::~TaskRegistry() = default;

TaskRegistry& TaskRegistry::Global() {
  // Built-ins are registered here rather than by static initializers, which
  // the linker drops from static libraries. Never destroyed.
  static TaskRegistry* const registry = [] {
    auto* r = new TaskRegistry;
    const std::pair<const char*, TaskFactory> builtins[] = {
        {"addition", tasks::MakeAdditionTask},
        {"countdown", tasks::MakeCountdownTask},
        {"jsonl", tasks::MakeJsonlTask},
        {"math", tasks::MakeMathTask},
        {"multiply", tasks::MakeMultiplyTask},
        {"repeat", tasks::MakeRepeatTask},
        {"reverse", tasks::MakeReverseTask},
        {"sort", tasks::MakeSortTask},
    };
    for (const auto& [name, factory] : builtins) {
      const absl::Status status = r->Register(name, factory);
      (void)status;  // cannot fail: distinct names, fresh registry
    }
    return r;
  }();
  return *registry;
}

absl::Status TaskRegistry::Register(const std::string& name,
                                    TaskFactory factory) {
  return rep_->map.Register("task", name, std::move(factory));
}

absl::StatusOr<std::unique_ptr<Task>> TaskRegistry::Create(
    const TaskConfig& config) const {
  absl::StatusOr<TaskFactory> factory =
      rep_->map.Find("task.name", "task", config.name);
  if (!factory.ok()) return factory.status();
  if (!config.reward.empty()) {
    const std::vector<std::string> rewards = RewardRegistry::Global().Names();
    if (std::find(rewards.begin(), rewards.end(), config.reward) ==
        rewards.end()) {
      return UnknownNameError("task.reward", "reward", config.reward, rewards);
    }
  }
  absl::StatusOr<std::unique_ptr<Task>> task = (*factory)(config);
  if (task.ok() && *task == nullptr) {
    return absl::InternalError(
        absl::StrCat("task factory '", config.name, "' returned null"));
  }
  return task;
}

std::vector<std::string> TaskRegistry::Names() const {
  return rep_->map.Names();
}

RewardRegistry::RewardRegistry() : rep_(std::make_unique<Rep>()) {}
RewardRegistry::~RewardRegistry() = default;

RewardRegistry& RewardRegistry::Global() {
  static RewardRegistry* const registry = [] {
    auto* r = new RewardRegistry;
    const std::pair<const char*, RewardFactory> builtins[] = {
        {"char_match", tasks::MakeCharMatchReward},
        {"countdown", tasks::MakeCountdownReward},
        {"exact", tasks::MakeExactReward},
        {"math", tasks::MakeMathReward},
        {"numeric", tasks::MakeNumericReward},
    };
    for (const auto& [name, factory] : builtins) {
      const absl::Status status = r->Register(name, factory);
      (void)status;  // cannot fail: distinct names, fresh registry
    }
    return r;
  }();
  return *registry;
}

absl::Status RewardRegistry::Register(const std::string& name,
                                      RewardFactory factory) {
  return rep_->map.Register("reward", name, std::move(factory));
}

absl::StatusOr<std::unique_ptr<RewardFn>> RewardRegistry::Create(
    const std::string& name) const {
  absl::StatusOr<RewardFactory> factory =
      rep_->map.Find("task.reward", "reward", name);
  if (!factory.ok()) return factory.status();
  std::unique_ptr<RewardFn> reward = (*factory)();
  if (reward == nullptr) {
    return absl::InternalError(
        absl::StrCat("reward factory '", name, "' returned null"));
  }
  return reward;
}

std::vector<std::string> RewardRegistry::Names() const {
  return rep_->map.Names();
}

}  // namespace fusionrl
