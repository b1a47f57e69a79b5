// JobManager's hall: lookups, events, the output queue's results,
// assignments and lost nodes. The other rooms are listed in job_manager.h.
#include "controller/job_manager.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/job_state.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace fusionrl {
namespace {

constexpr size_t kMaxEvents = 1000;

}  // namespace

absl::Status CheckPollWait(absl::Duration wait) {
  if (wait < absl::ZeroDuration() || wait > kMaxPollWait) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wait: must be in 0s..", absl::FormatDuration(kMaxPollWait), ", got ",
        absl::FormatDuration(wait)));
  }
  return absl::OkStatus();
}

JobManager::JobManager(NodeRegistry& registry, const Clock& clock)
    : registry_(registry), clock_(clock), rendezvous_(clock) {}

JobManager::~JobManager() = default;

bool JobManager::Terminal(const Job& job) { return job.over; }

bool JobManager::Settled(const Job& job) {
  return JobPhaseIsTerminal(job.phase);
}

JobManager::Job* JobManager::FindLocked(const std::string& id) const {
  uint64_t n = 0;
  if (!absl::StartsWith(id, "job-") || !absl::SimpleAtoi(id.substr(4), &n)) {
    return nullptr;
  }
  auto it = jobs_.find(n);
  return it == jobs_.end() ? nullptr : it->second.get();
}

void JobManager::EventLocked(Job& job, const std::string& text) {
  JobEvent e{clock_.Now(), text};
  if (job.events.size() >= kMaxEvents) job.events.erase(job.events.begin());
  job.events.push_back(std::move(e));
  job.updated = clock_.Now();
  ++job.update;
  spdlog::info("[{}] {}: {}", job.config.name, job.id, text);
  changed_.SignalAll();
}

void JobManager::FlushOutputs() {
  outputs_.Flush([this](const JobOutputs::Result& result) {
    absl::MutexLock lock(&mu_);
    ApplyOutputResultLocked(result);
  });
  JournalChanges();
}

void JobManager::ApplyOutputResultLocked(const JobOutputs::Result& result) {
  Job* job = FindLocked(result.job_id);
  if (job == nullptr) return;
  if (result.kind == JobOutputs::Result::Kind::kClosed) {
    PublishEndLocked(*job, &result);
    return;
  }
  if (result.status.ok()) return;
  // The outputs could not be created: the job fails with that reason.
  const std::string message(result.status.message());
  const int code = static_cast<int>(result.status.code());
  if (!Terminal(*job)) {
    FailLocked(*job, message, code);
  } else if (!Settled(*job)) {
    // It ended before its Open was performed; its Close is still queued.
    job->end_phase = JobPhase::kFailed;
    job->end_message = message;
    job->error_code = code;
  }
}

absl::StatusOr<JobManager::Job*> JobManager::JobForNodeLocked(
    const std::string& job_id, const std::string& node_id) const {
  std::optional<NodeView> node = registry_.Get(node_id);
  if (!node) {
    return absl::NotFoundError(
        absl::StrCat("node_id: unknown node '", node_id, "'"));
  }
  if (node->state == NodeState::kLost) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node_id: ", node_id, " was declared lost; register again"));
  }
  Job* job = FindLocked(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  for (const Job::Part& part : job->parts) {
    if (part.node_id == node_id) {
      if (part.lost) {
        return absl::FailedPreconditionError(
            absl::StrCat(node_id, " was removed from ", job_id, " (lost)"));
      }
      return job;
    }
  }
  return absl::PermissionDeniedError(
      absl::StrCat(node_id, " is not part of ", job_id));
}

absl::StatusOr<Assignment> JobManager::GetAssignment(const std::string& node_id,
                                                     absl::Duration wait) {
  FUSIONRL_RETURN_IF_ERROR(CheckPollWait(wait));
  const absl::Time deadline = clock_.Now() + wait;
  absl::MutexLock lock(&mu_);
  for (;;) {
    std::optional<NodeView> node = registry_.Get(node_id);
    if (!node) {
      return absl::NotFoundError(
          absl::StrCat("node_id: unknown node '", node_id, "'"));
    }
    if (node->state == NodeState::kLost) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node_id: ", node_id, " was declared lost; register again"));
    }
    auto it = node_job_.find(node_id);
    if (it != node_job_.end()) {
      Job* job = FindLocked(it->second);
      int offset = 0;
      for (Job::Part& part : job->parts) {
        if (part.node_id != node_id || part.assigned) {
          offset += part.train_cards();
          continue;
        }
        part.assigned = true;
        Assignment a;
        a.job_id = job->id;
        a.config = std::make_shared<const JobConfig>(job->config);
        a.card_indices = part.cards;
        a.rollout_cards = part.rollout_cards;
        a.train_rank_offset = offset;
        a.resume_checkpoint = job->resume_dir;
        EventLocked(*job, absl::StrCat(part.node_id, " joined with ",
                                       part.cards.size(), " card(s)"));
        return a;
      }
    }
    if (clock_.Now() >= deadline) return Assignment();
    WaitOnClock(changed_, mu_, clock_, deadline);
  }
}

void JobManager::RecordCardStates(const std::string& node_id,
                                  std::vector<CardReport> cards) {
  absl::MutexLock lock(&mu_);
  card_states_[node_id] = std::move(cards);
}

void JobManager::NodesLost(const std::vector<std::string>& node_ids,
                           const std::string& why) {
  FlushOnExit flush(*this);
  absl::MutexLock lock(&mu_);
  for (const std::string& node_id : node_ids) {
    card_states_.erase(node_id);
    auto it = node_job_.find(node_id);
    if (it == node_job_.end()) continue;
    Job* job = FindLocked(it->second);
    node_job_.erase(it);
    if (job == nullptr || Terminal(*job)) continue;
    const int index = job->PartIndex(node_id);
    if (index < 0 || job->parts[index].lost) continue;
    job->parts[index].lost = true;
    if (job->skew != nullptr && !job->ending) {
      // Its updates of the steps after the last weight sync never reach
      // the others: every live node goes back to that sync.
      job->skew->gate.Remove(node_id);
      if (!job->parts[index].super_node.empty()) {
        bool other_live = false;
        for (const Job::Part& p : job->parts) {
          other_live =
              other_live ||
              (!p.lost && p.super_node == job->parts[index].super_node);
        }
        if (!other_live) {
          job->skew->weights_crc.erase(job->parts[index].super_node);
        }
      }
      RollBackSkewedLocked(*job, absl::StrCat(node_id, " lost (", why, ")"));
      continue;
    }
    const int64_t requeued = job->ledger->Requeue(node_id);
    EventLocked(*job, absl::StrCat(node_id, " lost (", why, "); ", requeued,
                                   " prompt group(s) re-queued"));
    if (job->ending) {
      // The end plan goes to the new lead.
      ++job->update;
      changed_.SignalAll();
      continue;
    }
    if (job->current && !job->current->committed) {
      if (job->current->Member(index) >= 0) {
        job->current->aborted = true;
        EventLocked(*job, absl::StrCat("step ", job->current->step, " attempt ",
                                       job->current->attempt,
                                       " aborted; replanning on the nodes "
                                       "left"));
        PlanStepLocked(*job, job->current->step);
      }
    }
  }
  changed_.SignalAll();
}

void JobManager::CheckStalls(absl::Duration stall_timeout, StallAction action) {
  if (stall_timeout <= absl::ZeroDuration()) return;
  FlushOnExit flush(*this);
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();
  for (auto& [n, job_ptr] : jobs_) {
    Job& job = *job_ptr;
    if (Terminal(job) || job.phase != JobPhase::kRunning ||
        now - job.progress_at < stall_timeout) {
      continue;
    }
    // What every live card of the job is doing, as its heartbeats say.
    std::string cards;
    for (const Job::Part& part : job.parts) {
      if (part.lost) continue;
      auto it = card_states_.find(part.node_id);
      for (int index : part.cards) {
        std::string doing = "no report";
        if (it != card_states_.end()) {
          for (const CardReport& c : it->second) {
            if (c.index != index) continue;
            doing = c.activity.empty()
                        ? std::string("idle")
                        : absl::StrFormat("%s for %.0f s", c.activity,
                                          c.activity_seconds);
          }
        }
        absl::StrAppend(&cards, "; card ", part.node_id, "/", index, ": ",
                        doing);
      }
    }
    const std::string text =
        absl::StrCat("no step committed for ",
                     absl::FormatDuration(
                         absl::Trunc(now - job.progress_at, absl::Seconds(1))),
                     " (step ", job.last_committed + 1, " in flight, watchdog ",
                     absl::FormatDuration(stall_timeout), ")", cards);
    job.progress_at = now;
    // A single node's step keeps no state to restart from (only steps
    // shared with other nodes do): it cannot be replanned.
    const bool single = job.skew == nullptr && job.current != nullptr &&
                        job.current->members.size() == 1;
    if (action == StallAction::kFail || single) {
      FailLocked(job,
                 single && action != StallAction::kFail
                     ? absl::StrCat(text,
                                    "; a single node's step cannot be "
                                    "replanned")
                     : text,
                 static_cast<int>(absl::StatusCode::kDeadlineExceeded));
      continue;
    }
    EventLocked(job, absl::StrCat(text, "; replanning"));
    if (job.ending) continue;  // the end plan is handed out again as it is
    if (job.skew != nullptr) {
      RollBackSkewedLocked(job, "stalled");
    } else if (job.current != nullptr && !job.current->committed) {
      if (++job.data_plane_aborts > kMaxDataPlaneAborts) {
        FailLocked(job,
                   absl::StrCat(text, "; replanned ", kMaxDataPlaneAborts,
                                " times with no progress"),
                   static_cast<int>(absl::StatusCode::kDeadlineExceeded));
        continue;
      }
      const int aborts = job.data_plane_aborts;
      job.current->aborted = true;
      PlanStepLocked(job, job.current->step);
      job.data_plane_aborts = aborts;
    }
  }
  changed_.SignalAll();
}

}  // namespace fusionrl
