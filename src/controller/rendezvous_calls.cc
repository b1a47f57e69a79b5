// The c10d data plane's rendezvous, as the controller serves it: store
// operations of a job's nodes on the job's current rendezvous generation
// (controller/rendezvous_store.h). Only addresses and counters go through here;
// the tensors go between the cards.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "controller/job_manager.h"
#include "controller/job_state.h"
#include "core/status_macros.h"

namespace fusionrl {

absl::StatusOr<StoreReply> JobManager::Store(const StoreCall& call,
                                             absl::Duration timeout) {
  if (call.keys.empty()) {
    return absl::InvalidArgumentError("store: no key");
  }
  if (call.keys.size() > 1 && call.op != StoreOp::kCheck &&
      call.op != StoreOp::kWait) {
    return absl::InvalidArgumentError(
        absl::StrCat("store: ", call.keys.size(),
                     " keys given; only check and wait take several"));
  }
  std::string scope;
  absl::Time deadline;
  {
    absl::MutexLock lock(&mu_);
    FUSIONRL_ASSIGN_OR_RETURN(Job * job,
                              JobForNodeLocked(call.job_id, call.node_id));
    const bool job_scope = call.generation == kJobRendezvousScope;
    if (Terminal(*job) ||
        (!job_scope && call.generation != job->rendezvous_generation)) {
      return absl::AbortedError(absl::StrCat(
          "rendezvous generation ", call.generation, " of ", job->id,
          " is not current (now ", job->rendezvous_generation,
          Terminal(*job) ? ", the job ended" : "",
          "); re-form the group at the generation of the next plan"));
    }
    scope = job_scope ? JobRendezvousScope(*job)
                      : RendezvousScope(*job, call.generation);
    deadline =
        clock_.Now() +
        std::min(timeout,
                 absl::Seconds(job->config.run.collective_timeout_seconds));
  }
  // Outside mu_: a waiting Get must not hold up the rest of the controller.
  // A generation that ends meanwhile is closed in the store, which wakes
  // the wait with Aborted.
  StoreReply reply;
  const std::string& key = call.keys.front();
  switch (call.op) {
    case StoreOp::kSet:
      FUSIONRL_RETURN_IF_ERROR(rendezvous_.Set(scope, key, call.value));
      break;
    case StoreOp::kCompareSet: {
      FUSIONRL_ASSIGN_OR_RETURN(
          reply.value,
          rendezvous_.CompareSet(scope, key, call.expected, call.value));
      break;
    }
    case StoreOp::kGet: {
      FUSIONRL_ASSIGN_OR_RETURN(reply.value,
                                rendezvous_.Get(scope, key, deadline));
      break;
    }
    case StoreOp::kAdd: {
      FUSIONRL_ASSIGN_OR_RETURN(reply.number,
                                rendezvous_.Add(scope, key, call.delta));
      break;
    }
    case StoreOp::kCheck: {
      FUSIONRL_ASSIGN_OR_RETURN(reply.flag,
                                rendezvous_.Check(scope, call.keys));
      break;
    }
    case StoreOp::kWait:
      FUSIONRL_RETURN_IF_ERROR(rendezvous_.Wait(scope, call.keys, deadline));
      break;
    case StoreOp::kDelete: {
      FUSIONRL_ASSIGN_OR_RETURN(reply.flag, rendezvous_.Delete(scope, key));
      break;
    }
  }
  return reply;
}

void JobManager::SetWeightBytesSource(
    std::function<int64_t(const std::string&)> source) {
  absl::MutexLock lock(&mu_);
  weight_bytes_ = std::move(source);
}

int64_t JobManager::ControllerBytesLocked(const Job& job) const {
  return job.tensor_bytes + (weight_bytes_ ? weight_bytes_(job.id) : 0);
}

int64_t JobManager::tensor_bytes() const {
  absl::MutexLock lock(&mu_);
  return tensor_bytes_;
}

}  // namespace fusionrl
