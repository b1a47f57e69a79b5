#include "worker/fake_work_client.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fusionrl {
namespace {

template <typename T>
std::string Doubled(const std::string& payload) {
  std::string out = payload;
  for (size_t at = 0; at + sizeof(T) <= out.size(); at += sizeof(T)) {
    T v;
    std::memcpy(&v, out.data() + at, sizeof(T));
    v = v + v;
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  return out;
}

}  // namespace

bool FakeWorkClient::TwinLocked() const {
  return (step_ == abort_step_ && attempt_ == 1) ||
         step_ == fail_reduce_step_ || skew_sync_every_ > 0;
}

bool FakeWorkClient::SyncStepLocked(int64_t step) const {
  return skew_sync_every_ > 0 &&
         (step % skew_sync_every_ == 0 || step == total_steps_);
}

absl::StatusOr<Assignment> FakeWorkClient::GetAssignment(const std::string&,
                                                         absl::Duration) {
  return Assignment{};
}

absl::StatusOr<StepPlan> FakeWorkClient::GetStepPlan(const std::string&,
                                                     const std::string&,
                                                     int local_rank, int64_t,
                                                     absl::Duration) {
  absl::MutexLock l(&mu_);
  StepPlan plan;
  if (waits_left_ > 0) {
    --waits_left_;
    return plan;  // kWait
  }
  if (local_rank != 0) {
    return absl::InvalidArgumentError("the fake plans one card");
  }
  if (step_ > total_steps_) {
    plan.kind = PlanKind::kEnd;
    plan.step = step_;
    plan.checkpoint_name = "final";
    plan.data_cursor_after = static_cast<uint64_t>(total_steps_) *
                             static_cast<uint64_t>(prompts_per_step_);
    return plan;
  }
  plan.kind = PlanKind::kTrain;
  plan.step = step_;
  plan.attempt = attempt_;
  const bool twin = TwinLocked();
  plan.nodes = twin ? 2 : 1;
  plan.world_size = twin ? 2 : 1;
  const uint64_t first = static_cast<uint64_t>(step_ - 1) *
                         static_cast<uint64_t>(prompts_per_step_);
  for (int i = 0; i < prompts_per_step_; ++i) plan.groups.push_back(first + i);
  plan.data_cursor_after = first + prompts_per_step_;
  if (skew_sync_every_ > 0) {
    plan.exchange_updates = true;
    plan.sync_weights = SyncStepLocked(step_);
    plan.updates_due_step = plan.sync_weights ? step_ : step_ - 1;
    plan.rollback_to_step = rollback_to_;
  }
  return plan;
}

absl::StatusOr<std::string> FakeWorkClient::Reduce(ReduceCall call,
                                                   absl::Duration) {
  absl::MutexLock l(&mu_);
  ++reduce_calls_;
  if (call.step != step_ || call.attempt != attempt_) {
    return absl::AbortedError(absl::StrCat("step ", call.step, " attempt ",
                                           call.attempt, " is not current"));
  }
  if (step_ == abort_step_ && attempt_ == 1 && abort_at_first_round_) {
    ++attempt_;  // the twin is lost: replanned alone
    return absl::AbortedError("the twin node was lost");
  }
  if (step_ == fail_reduce_step_ && !reduce_error_.ok()) {
    absl::Status error = reduce_error_;
    reduce_error_ = absl::OkStatus();
    return error;
  }
  return call.dtype == ReduceDtype::kFloat64 ? Doubled<double>(call.payload)
                                             : Doubled<float>(call.payload);
}

absl::StatusOr<bool> FakeWorkClient::FinishStep(const StepReport& report,
                                                absl::Duration) {
  absl::MutexLock l(&mu_);
  reports_.push_back(report);
  if (!report.error.ok() || ended_) return false;
  if (report.step > total_steps_) {
    ended_ = true;  // the END report
    return true;
  }
  if (report.step != step_ || report.attempt != attempt_) return false;
  if (step_ == abort_step_ && attempt_ == 1) {
    ++attempt_;  // the twin was lost during the step: not committed
    return false;
  }
  committed_.push_back({step_, attempt_});
  if (skew_sync_every_ > 0) {
    if (SyncStepLocked(step_)) last_sync_ = step_;
    if (step_ == restart_after_ && attempt_ == 1) {
      // Killed after the commit was journaled, before the answer left: the
      // restarted controller rolls back to the last sync (a new epoch), and
      // the retried report belongs to the old one.
      step_ = last_sync_ + 1;
      attempt_ = 2;
      rollback_to_ = last_sync_;
      return false;
    }
    ++step_;
    return true;
  }
  ++step_;
  attempt_ = 1;
  return true;
}

absl::StatusOr<std::vector<ReceivedUpdate>> FakeWorkClient::ExchangeUpdates(
    UpdateCall call, absl::Duration) {
  absl::MutexLock l(&mu_);
  if (skew_sync_every_ <= 0) {
    return absl::UnimplementedError("the fake plans no StaleSync skew");
  }
  if (call.step != step_ || call.attempt != attempt_) {
    return absl::AbortedError(absl::StrCat("step ", call.step, " attempt ",
                                           call.attempt, " is not current"));
  }
  // The twin super node's update equals ours.
  ReceivedUpdate twin;
  twin.step = call.step;
  twin.payload = std::move(call.payload);
  twin.node_id = "twin";
  twin.round = call.round;
  return std::vector<ReceivedUpdate>{std::move(twin)};
}

absl::Status FakeWorkClient::PublishWeights(const std::string& key,
                                            int64_t step, const std::string&,
                                            const std::string& blob,
                                            absl::Duration) {
  absl::MutexLock l(&mu_);
  weights_[absl::StrCat(key, "@", step)] = blob;
  return absl::OkStatus();
}

absl::StatusOr<std::string> FakeWorkClient::FetchWeights(const std::string& key,
                                                         int64_t step,
                                                         absl::Duration) {
  absl::MutexLock l(&mu_);
  auto it = weights_.find(absl::StrCat(key, "@", step));
  if (it == weights_.end()) return absl::NotFoundError("no such version");
  return it->second;
}

absl::StatusOr<StoreReply> FakeWorkClient::Store(const StoreCall&,
                                                 absl::Duration) {
  // Its plans never ask for the c10d data plane.
  return absl::UnimplementedError("FakeWorkClient has no rendezvous store");
}

}  // namespace fusionrl
