#include "controller/job_manager.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/checkpoint_meta.h"
#include "core/crc32c.h"
#include "core/group_ledger.h"
#include "core/job_summary.h"
#include "core/metrics.h"
#include "core/scheduler.h"
#include "core/stalesync.h"
#include "core/status_macros.h"
#include "fusionrl/config.h"
#include "fusionrl/job.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace fusionrl {
namespace {

constexpr size_t kMaxEvents = 1000;
constexpr int kMaxWaitMs = 60000;

// Keeps the metrics records of steps <= `last_step` (a resumed job rewrites
// the steps after its checkpoint).
absl::Status TruncateMetrics(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= last_step) {
      kept += line + "\n";
    }
  }
  return WriteFileAtomic(path, kept);
}

absl::Status CheckWait(int32_t wait_ms, const char* field) {
  if (wait_ms < 0 || wait_ms > kMaxWaitMs) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be in 0..", kMaxWaitMs, ", got ", wait_ms));
  }
  return absl::OkStatus();
}

}  // namespace

// One collective round of an attempt: each participant's payload, summed in
// participant order once all are in.
struct Round {
  std::vector<std::optional<std::string>> parts;
  int received = 0;
  int fetched = 0;
  v1::ReduceDtype dtype = v1::REDUCE_DTYPE_UNSPECIFIED;
  bool done = false;
  std::string sum;
};

struct JobManager::Attempt {
  int64_t step = 0;
  int attempt = 0;
  bool aborted = false;
  bool committed = false;
  // Participants (indices into Job::parts), in rank order.
  std::vector<int> members;
  std::vector<int> first_rank;                // per member
  std::vector<std::vector<uint64_t>> groups;  // per member, ledger indices
  int world = 0;
  std::vector<bool> finished;  // per member
  std::map<int64_t, Round> rounds;
  // From the lead's FinishStep.
  v1::FinishStepRequest lead_report;
  bool have_lead_report = false;
  // Skewed jobs: every member's FinishStep (tokens are per super node).
  std::vector<v1::FinishStepRequest> reports;

  // Position of part `part` in `members`, or -1.
  int Member(int part) const {
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] == part) return static_cast<int>(i);
    }
    return -1;
  }
};

struct JobManager::Job {
  std::string id;
  JobConfig config;
  v1::SubmitJobRequest request;
  v1::JobPhase phase = v1::JOB_PHASE_PENDING;
  std::string message;
  absl::Time submitted, started, updated;
  uint64_t update = 0;
  std::vector<v1::JobEvent> events;

  struct Part {
    std::string node_id;
    std::string super_node;
    std::vector<int> cards;  // card indices on that node
    bool lost = false;
    bool assigned = false;  // GetAssignment delivered
    int64_t clock = 0;      // skewed jobs: the last step it finished
    int rollout_cards = 0;  // disaggregated: the first cards only sample
    int train_cards() const {
      return static_cast<int>(cards.size()) - rollout_cards;
    }
  };
  std::vector<Part> parts;

  // Index of `node_id` in `parts`, or -1.
  int PartIndex(const std::string& node_id) const {
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].node_id == node_id) return static_cast<int>(i);
    }
    return -1;
  }

  // Steps first_step..total_steps; ledger index i is data index
  // base_cursor + i; step s owns ledger indices [(s-first)*P, (s-first+1)*P).
  int64_t first_step = 1;
  uint64_t base_cursor = 0;
  std::string resume_dir;
  std::unique_ptr<GroupLedger> ledger;
  std::unique_ptr<Attempt> current;
  int64_t last_committed = 0;

  // Ending: the lead writes the last checkpoint, then the job is over.
  bool stop_requested = false;
  std::string stop_reason;
  const std::atomic<bool>* stop_flag = nullptr;
  bool ending = false;
  std::string end_checkpoint;  // "final" | "step_<n>"

  // Totals.
  std::unique_ptr<MetricsLog> metrics;
  JobSummary summary;
  double last_eval = 0;
  double reward_mean = 0, train_accuracy = 0;
  int64_t policy_version = 0;
  double loop_seconds = 0;
  std::string checkpoint_dir;
  std::string summary_json;       // summary.json's text once written
  std::string last_metrics_json;  // the last committed step's record
  int error_code = 0;             // FAILED: absl/gRPC canonical code

  // StaleSync across super nodes (stalesync.max_clock_skew > 0 and several
  // nodes): each node runs ahead of the slowest by at most k steps (the
  // gate), steps are planned as nodes reach them (`ahead`: planned steps
  // after `current`, which stays the oldest uncommitted one), and gradient
  // updates travel through ExchangeUpdates.
  bool skewed = false;
  std::unique_ptr<ClockSkewGate> skew_gate;
  std::map<int64_t, std::unique_ptr<Attempt>> ahead;
  using Key = std::pair<int64_t, int64_t>;  // (step, round)
  struct Update {
    Key key;
    std::string payload;
    uint32_t crc32c = 0;
  };
  std::vector<std::deque<Update>> outbox;       // per part, increasing keys
  std::vector<Key> handed_in;                   // per part: its last key
  std::vector<std::vector<Key>> delivered;      // [receiver][sender]: last key
  std::map<std::string, uint32_t> weights_crc;  // super node -> last sync
};

JobManager::JobManager(NodeRegistry& registry, const Clock& clock)
    : registry_(registry), clock_(clock) {}

JobManager::~JobManager() = default;

bool JobManager::Terminal(const Job& job) {
  return job.phase == v1::JOB_PHASE_SUCCEEDED ||
         job.phase == v1::JOB_PHASE_FAILED ||
         job.phase == v1::JOB_PHASE_CANCELLED;
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
  v1::JobEvent e;
  e.set_time_us(absl::ToUnixMicros(clock_.Now()));
  e.set_text(text);
  if (job.events.size() >= kMaxEvents) job.events.erase(job.events.begin());
  job.events.push_back(std::move(e));
  job.updated = clock_.Now();
  ++job.update;
  spdlog::info("[{}] {}: {}", job.config.name, job.id, text);
  changed_.SignalAll();
}

absl::StatusOr<std::string> JobManager::Submit(
    const v1::SubmitJobRequest& request) {
  if (request.config_yaml().empty()) {
    return absl::InvalidArgumentError("config_yaml: empty job description");
  }
  if (request.config_yaml().size() > (4 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config_yaml: ", request.config_yaml().size(),
                     " bytes; a job description is at most 4 MiB"));
  }
  const std::string source =
      request.source_name().empty() ? "<submitted>" : request.source_name();
  std::vector<std::string> overrides(request.overrides().begin(),
                                     request.overrides().end());
  FUSIONRL_ASSIGN_OR_RETURN(
      JobConfig config,
      ParseJobConfig(request.config_yaml(), source, overrides));
  const PlacementConfig& p = config.placement;
  // Cards that train (disaggregated: the others only sample).
  const int cards =
      p.super_nodes * (p.cards_per_super_node - p.rollout_cards_per_super_node);
  if (config.rollout.prompts_per_step % cards != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        source, ": rollout.prompts_per_step: must be a multiple of the job's ",
        cards,
        " training cards (placement.super_nodes x (cards_per_super_node - "
        "rollout_cards_per_super_node)) so every card trains on the same "
        "number of prompt groups, got ",
        config.rollout.prompts_per_step));
  }
  std::optional<CheckpointMeta> resume_meta;
  std::string resume_dir;
  if (request.resume()) {
    FUSIONRL_ASSIGN_OR_RETURN(
        resume_dir, FindLatestCheckpoint(config.output_dir + "/checkpoints"));
    FUSIONRL_ASSIGN_OR_RETURN(CheckpointMeta meta,
                              ReadCheckpointMeta(resume_dir));
    if (meta.kind != "rl") {
      return absl::FailedPreconditionError(
          absl::StrCat("resume: '", resume_dir, "' is a ", meta.kind,
                       " checkpoint, not an RL one"));
    }
    resume_meta = meta;
  }
  absl::MutexLock lock(&mu_);
  const uint64_t n = next_job_++;
  auto job = std::make_unique<Job>();
  job->id = absl::StrCat("job-", n);
  job->config = std::move(config);
  job->request = request;
  job->submitted = job->updated = clock_.Now();
  job->summary.kind = "rl";
  job->summary.summary_path = job->config.output_dir + "/summary.json";
  if (resume_meta) {
    job->resume_dir = resume_dir;
    job->first_step = resume_meta->step + 1;
    job->base_cursor = resume_meta->data_cursor;
    job->summary.resumed_from_step = resume_meta->step;
    job->summary.initial_eval_accuracy = resume_meta->initial_eval_accuracy;
    job->summary.rollout_tokens = resume_meta->rollout_tokens;
    job->last_eval = resume_meta->last_eval_accuracy;
    job->loop_seconds = resume_meta->loop_seconds;
    job->policy_version = resume_meta->policy_version;
    job->last_committed = resume_meta->step;
  }
  const int64_t steps =
      std::max<int64_t>(0, job->config.run.total_steps - job->first_step + 1);
  job->ledger = std::make_unique<GroupLedger>(
      static_cast<uint64_t>(steps) * job->config.rollout.prompts_per_step);
  Job& j = *job;
  jobs_[n] = std::move(job);
  EventLocked(
      j, absl::StrCat("submitted (", j.config.run.total_steps, " steps x ",
                      j.config.rollout.prompts_per_step, " prompt groups",
                      resume_meta ? ", resuming from " + resume_dir : "", ")"));
  TryPlaceLocked(j);
  return j.id;
}

void JobManager::Schedule() {
  absl::MutexLock lock(&mu_);
  for (auto& [n, job] : jobs_) {
    if (job->phase == v1::JOB_PHASE_PENDING ||
        job->phase == v1::JOB_PHASE_WAITING_FOR_CAPACITY) {
      TryPlaceLocked(*job);
    }
  }
}

void JobManager::TryPlaceLocked(Job& job) {
  // Jobs run in submission order: a later job waits while an earlier one
  // is still waiting (no starvation of big jobs by small ones).
  for (auto& [n, other] : jobs_) {
    if (other.get() == &job) break;
    if (other->phase == v1::JOB_PHASE_PENDING ||
        other->phase == v1::JOB_PHASE_WAITING_FOR_CAPACITY) {
      if (job.message.empty()) {
        job.phase = v1::JOB_PHASE_PENDING;
        job.message = absl::StrCat("queued behind ", other->id);
        ++job.update;
      }
      return;
    }
  }
  // A node runs one job: every card of a busy node is busy.
  BusyCards busy;
  const std::vector<NodeView> nodes = registry_.List();
  for (const NodeView& node : nodes) {
    if (node_job_.count(node.id) == 0) continue;
    for (const CardSpec& c : node.spec.cards) busy.insert({node.id, c.index});
  }
  absl::StatusOr<Placement> placement =
      Place(job.config.placement, nodes, busy);
  if (!placement.ok()) {
    const std::string reason(placement.status().message());
    if (job.config.placement.fail_if_unplaceable) {
      FailLocked(job, absl::StrCat("cannot be placed: ", reason),
                 static_cast<int>(absl::StatusCode::kFailedPrecondition));
      return;
    }
    if (job.phase != v1::JOB_PHASE_WAITING_FOR_CAPACITY ||
        job.message != reason) {
      job.phase = v1::JOB_PHASE_WAITING_FOR_CAPACITY;
      job.message = reason;
      EventLocked(job, absl::StrCat("waiting for capacity: ", reason));
    }
    return;
  }
  job.parts.clear();
  for (const SuperNodeAssignment& sn : placement->super_nodes) {
    for (const CardAssignment& card : sn.cards) {
      if (job.parts.empty() || job.parts.back().node_id != card.node_id) {
        Job::Part part;
        part.node_id = card.node_id;
        part.super_node = sn.super_node;
        job.parts.push_back(part);
      }
      job.parts.back().cards.push_back(card.card_index);
      if (card.role == CardRole::kRollout) ++job.parts.back().rollout_cards;
    }
  }
  for (const Job::Part& part : job.parts) {
    if (part.rollout_cards > 0 && part.train_cards() == 0) {
      // A super node spread over several workers: the rollout cards must
      // share a worker with the training cards they serve.
      FailLocked(job,
                 absl::StrCat("cannot be placed: disaggregated needs each "
                              "super node's cards on one worker; ",
                              part.node_id, " got only rollout cards"),
                 static_cast<int>(absl::StatusCode::kFailedPrecondition));
      return;
    }
  }
  for (const Job::Part& part : job.parts) node_job_[part.node_id] = job.id;
  EventLocked(job, absl::StrCat("placed: ", PlacementDebugString(*placement)));
  absl::Status started = StartLocked(job);
  if (!started.ok()) {
    FailLocked(job, std::string(started.message()),
               static_cast<int>(started.code()));
  }
}

absl::Status JobManager::StartLocked(Job& job) {
  job.phase = v1::JOB_PHASE_RUNNING;
  job.message.clear();
  job.started = clock_.Now();
  const std::string& out = job.config.output_dir;
  std::error_code ec;
  std::filesystem::create_directories(out + "/checkpoints", ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("output_dir: cannot create '", out, "': ", ec.message()));
  }
  FUSIONRL_RETURN_IF_ERROR(
      WriteFileAtomic(out + "/config.yaml", JobConfigToYaml(job.config)));
  const std::string metrics_path = out + "/metrics.jsonl";
  if (!job.resume_dir.empty()) {
    FUSIONRL_RETURN_IF_ERROR(TruncateMetrics(metrics_path, job.first_step - 1));
  }
  FUSIONRL_ASSIGN_OR_RETURN(
      job.metrics,
      MetricsLog::Open(metrics_path, /*truncate=*/job.resume_dir.empty()));
  const int64_t k = job.config.stalesync.max_clock_skew;
  if (k > 0 && job.parts.size() > 1) {
    job.skewed = true;
    std::vector<std::string> names;
    for (Job::Part& part : job.parts) {
      names.push_back(part.node_id);
      part.clock = job.first_step - 1;
    }
    FUSIONRL_ASSIGN_OR_RETURN(
        job.skew_gate, ClockSkewGate::Create(k, names, job.first_step - 1));
    const size_t n = job.parts.size();
    const Job::Key none{job.first_step - 1, -1};
    job.outbox.assign(n, {});
    job.handed_in.assign(n, none);
    job.delivered.assign(n, std::vector<Job::Key>(n, none));
    EventLocked(job, absl::StrCat("StaleSync across ", n,
                                  " super nodes: max_clock_skew ", k));
  }
  if (job.first_step > job.config.run.total_steps) {
    BeginEndLocked(job);
  } else {
    PlanStepLocked(job, job.first_step);
  }
  return absl::OkStatus();
}

void JobManager::PlanStepLocked(Job& job, int64_t step) {
  std::unique_ptr<Attempt> a = MakeAttemptLocked(job, step);
  if (a == nullptr) return;
  job.current = std::move(a);
  ++job.update;
  changed_.SignalAll();
}

std::unique_ptr<JobManager::Attempt> JobManager::MakeAttemptLocked(
    Job& job, int64_t step) {
  const int prompts = job.config.rollout.prompts_per_step;
  auto a = std::make_unique<Attempt>();
  a->step = step;
  a->attempt =
      (job.current && job.current->step == step) ? job.current->attempt + 1 : 1;
  int cards = 0;
  for (size_t i = 0; i < job.parts.size(); ++i) {
    if (job.parts[i].lost) continue;
    a->members.push_back(static_cast<int>(i));
    cards += job.parts[i].train_cards();
  }
  if (cards == 0) {
    FailLocked(job,
               absl::StrCat("no node left to run step ", step,
                            "; resubmit with resume to continue from the last "
                            "checkpoint"),
               static_cast<int>(absl::StatusCode::kUnavailable));
    return nullptr;
  }
  if (prompts % cards != 0) {
    FailLocked(job,
               absl::StrCat("step ", step, ": ", prompts,
                            " prompt groups cannot be split evenly over "
                            "the ",
                            cards,
                            " cards left; resubmit with resume to "
                            "continue from the last checkpoint"),
               static_cast<int>(absl::StatusCode::kFailedPrecondition));
    return nullptr;
  }
  const int per_card = prompts / cards;
  int rank = 0;
  for (int m : a->members) {
    const Job::Part& part = job.parts[m];
    const int want = per_card * part.train_cards();
    std::vector<uint64_t> held;
    if (job.current && job.current->step == step) {
      // Keep the groups this node already holds for the step.
      const int k = job.current->Member(m);
      if (k >= 0) held = job.current->groups[k];
    }
    std::vector<uint64_t> extra =
        job.ledger->Assign(part.node_id, want - static_cast<int>(held.size()));
    held.insert(held.end(), extra.begin(), extra.end());
    std::sort(held.begin(), held.end());
    a->first_rank.push_back(rank);
    rank += part.train_cards();
    a->groups.push_back(std::move(held));
  }
  a->world = cards;
  a->finished.assign(a->members.size(), false);
  a->reports.resize(a->members.size());
  return a;
}

void JobManager::CommitLocked(Job& job) {
  Attempt& a = *job.current;
  a.committed = true;
  for (size_t k = 0; k < a.members.size(); ++k) {
    absl::Status s =
        job.ledger->MarkTrained(job.parts[a.members[k]].node_id, a.groups[k]);
    if (!s.ok()) {
      // The ledger and the attempt disagree: a bug, never data to train on.
      FailLocked(job,
                 absl::StrCat("internal: step ", a.step, ": ", s.message()),
                 static_cast<int>(absl::StatusCode::kInternal));
      return;
    }
  }
  job.last_committed = a.step;
  const v1::FinishStepRequest& r = a.lead_report;
  if (a.have_lead_report) {
    if (r.initial_eval_accuracy() >= 0) {
      job.summary.initial_eval_accuracy = r.initial_eval_accuracy();
      job.last_eval = r.initial_eval_accuracy();
    }
    if (r.eval_accuracy() >= 0) job.last_eval = r.eval_accuracy();
    if (job.skewed) {
      // Each super node reports its own tokens (no cross-node sums).
      for (const v1::FinishStepRequest& m : a.reports) {
        job.summary.rollout_tokens += m.rollout_tokens();
      }
    } else {
      job.summary.rollout_tokens += r.rollout_tokens();
    }
    job.loop_seconds += r.loop_seconds();
    job.reward_mean = r.reward_mean();
    job.train_accuracy = r.train_accuracy();
    job.policy_version = r.policy_version();
    if (!r.checkpoint_dir().empty()) job.checkpoint_dir = r.checkpoint_dir();
    if (!r.metrics_json().empty()) {
      auto rec = nlohmann::ordered_json::parse(r.metrics_json(), nullptr,
                                               /*allow_exceptions=*/false);
      if (rec.is_object()) {
        if (job.skewed) {
          int64_t lo = INT64_MAX, hi = INT64_MIN;
          for (const Job::Part& part : job.parts) {
            if (part.lost) continue;
            lo = std::min(lo, part.clock);
            hi = std::max(hi, part.clock);
          }
          rec["clock_skew"] = hi - lo;
          rec["max_clock_skew_seen"] = job.skew_gate->MaxSkewSeen();
        }
        job.last_metrics_json = rec.dump();
        absl::Status s = job.metrics->AppendLine(job.last_metrics_json);
        if (!s.ok())
          spdlog::warn("[{}] metrics: {}", job.id, std::string(s.message()));
      }
      const int64_t total = job.config.run.total_steps;
      if (a.step % job.config.run.log_every == 0 || a.step == total ||
          r.eval_accuracy() >= 0) {
        const double per_step =
            job.loop_seconds /
            std::max<int64_t>(1, a.step - job.first_step + 1);
        const double tps = job.loop_seconds > 0
                               ? job.summary.rollout_tokens / job.loop_seconds
                               : 0;
        spdlog::info(
            "[{}] step {}/{} | reward {:.3f} | acc {:.3f} | eval {:.3f} | "
            "len {:.1f} | kl {:.4f} | {} tok/s | ETA {}",
            job.config.name, a.step, total, r.reward_mean(), r.train_accuracy(),
            job.last_eval,
            rec.is_object() ? rec.value("response_len_mean", 0.0) : 0.0,
            rec.is_object() ? rec.value("kl", 0.0) : 0.0, FormatCount(tps),
            FormatDuration(per_step * (total - a.step)));
      }
    }
  }
  ++job.update;
  job.updated = clock_.Now();
  if (job.stop_flag != nullptr && job.stop_flag->load() &&
      !job.stop_requested) {
    job.stop_requested = true;
    job.stop_reason = "interrupted";
  }
  // A skewed job stops after the steps its nodes already started.
  const bool stop_now =
      job.stop_requested && (!job.skewed || job.ahead.empty());
  if (a.step >= job.config.run.total_steps || stop_now) {
    BeginEndLocked(job);
  } else if (auto next = job.ahead.find(a.step + 1); next != job.ahead.end()) {
    job.current = std::move(next->second);
    job.ahead.erase(next);
    ++job.update;
  } else {
    PlanStepLocked(job, a.step + 1);
  }
  changed_.SignalAll();
}

void JobManager::BeginEndLocked(Job& job) {
  job.ending = true;
  const bool early = job.last_committed < job.config.run.total_steps;
  job.end_checkpoint =
      early ? absl::StrCat("step_", job.last_committed) : std::string("final");
  if (early) {
    EventLocked(job,
                absl::StrCat("stopping after step ", job.last_committed, " (",
                             job.stop_reason, "); writing checkpoint ",
                             job.end_checkpoint));
  }
  ++job.update;
  changed_.SignalAll();
}

void JobManager::FinishJobLocked(Job& job, v1::JobPhase phase,
                                 const std::string& message) {
  job.phase = phase;
  job.message = message;
  for (const Job::Part& part : job.parts) {
    auto it = node_job_.find(part.node_id);
    if (it != node_job_.end() && it->second == job.id) node_job_.erase(it);
  }
  if ((phase == v1::JOB_PHASE_SUCCEEDED || phase == v1::JOB_PHASE_CANCELLED) &&
      job.metrics != nullptr) {
    JobSummary& s = job.summary;
    s.final_eval_accuracy = job.last_eval;
    s.steps = job.last_committed;
    s.policy_version = job.policy_version;
    s.final_train_reward = job.reward_mean;
    s.checkpoint_dir = job.checkpoint_dir;
    s.interrupted = phase == v1::JOB_PHASE_CANCELLED;
    s.tokens_per_second =
        job.loop_seconds > 0 ? s.rollout_tokens / job.loop_seconds : 0;
    s.wall_seconds = absl::ToDoubleSeconds(clock_.Now() - job.started);
    if (job.skewed) {
      s.max_clock_skew_seen = job.skew_gate->MaxSkewSeen();
      s.final_weights_crc32c = job.weights_crc;
    }
    absl::Status w = WriteSummary(s);
    if (!w.ok()) {
      job.phase = v1::JOB_PHASE_FAILED;
      job.message = absl::StrCat("writing summary: ", w.message());
    } else {
      // Kept for status replies (read once, not on every call).
      job.summary_json = ReadTextFile(s.summary_path, "summary").value_or("");
      spdlog::info("[{}] done: eval accuracy {:.3f} -> {:.3f} in {} ({} tok/s)",
                   job.config.name, s.initial_eval_accuracy,
                   s.final_eval_accuracy, FormatDuration(s.wall_seconds),
                   FormatCount(s.tokens_per_second));
    }
  }
  job.metrics.reset();
  job.ahead.clear();
  job.outbox.clear();
  EventLocked(job, absl::StrCat(v1::JobPhase_Name(job.phase),
                                message.empty() ? "" : ": ", message));
  // Let the next queued job in.
  for (auto& [n, other] : jobs_) {
    if (other->phase == v1::JOB_PHASE_PENDING ||
        other->phase == v1::JOB_PHASE_WAITING_FOR_CAPACITY) {
      other->message.clear();
      TryPlaceLocked(*other);
      break;
    }
  }
}

void JobManager::FailLocked(Job& job, const std::string& message, int code) {
  if (Terminal(job)) return;
  job.error_code = code;
  if (job.current) job.current->aborted = true;
  spdlog::error("[{}] {} failed: {}", job.config.name, job.id, message);
  FinishJobLocked(job, v1::JOB_PHASE_FAILED, message);
}

absl::StatusOr<v1::JobStatus> JobManager::Status(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const Job* job = FindLocked(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  return StatusLocked(*job);
}

std::vector<v1::JobStatus> JobManager::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::JobStatus> out;
  for (const auto& [n, job] : jobs_) out.push_back(StatusLocked(*job));
  return out;
}

absl::StatusOr<v1::JobStatus> JobManager::WaitForUpdate(
    const std::string& job_id, uint64_t seen_update, absl::Time deadline,
    uint64_t* update) const {
  absl::MutexLock lock(&mu_);
  const Job* job = FindLocked(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  while (job->update == seen_update && !Terminal(*job) &&
         absl::Now() < deadline) {
    changed_.WaitWithDeadline(&mu_, deadline);
  }
  *update = job->update;
  return StatusLocked(*job);
}

v1::JobStatus JobManager::StatusLocked(const Job& job) const {
  v1::JobStatus s;
  s.set_job_id(job.id);
  s.set_name(job.config.name);
  s.set_phase(job.phase);
  s.set_message(job.message);
  s.set_step(job.last_committed);
  s.set_total_steps(job.config.run.total_steps);
  s.set_policy_version(job.policy_version);
  s.set_reward_mean(job.reward_mean);
  s.set_train_accuracy(job.train_accuracy);
  s.set_initial_eval_accuracy(job.summary.initial_eval_accuracy);
  s.set_eval_accuracy(job.last_eval);
  s.set_rollout_tokens(job.summary.rollout_tokens);
  s.set_tokens_per_second(
      job.loop_seconds > 0 ? job.summary.rollout_tokens / job.loop_seconds : 0);
  s.set_groups_submitted(static_cast<int64_t>(job.ledger->total()));
  s.set_groups_trained(static_cast<int64_t>(job.ledger->trained()));
  s.set_groups_requeued(static_cast<int64_t>(job.ledger->requeued_total()));
  s.set_submitted_at_us(absl::ToUnixMicros(job.submitted));
  s.set_updated_at_us(absl::ToUnixMicros(job.updated));
  for (const Job::Part& part : job.parts) {
    std::optional<NodeView> view = registry_.Get(part.node_id);
    v1::NodeStatus* n = s.add_nodes();
    n->set_node_id(part.node_id);
    n->set_super_node(part.super_node);
    if (view) {
      n->set_host(view->spec.host);
      n->set_heartbeat_age_ms(absl::ToInt64Milliseconds(view->heartbeat_age));
    }
    n->set_state(part.lost ? "lost" : (view ? "alive" : "gone"));
    if (job.skewed) n->set_clock(part.clock);
    auto it = card_states_.find(part.node_id);
    for (int index : part.cards) {
      v1::CardState state;
      state.set_index(index);
      state.set_role(v1::CARD_ROLE_COLOCATED);
      if (it != card_states_.end()) {
        for (const v1::CardState& c : it->second) {
          if (c.index() == index) state = c;
        }
      }
      if (part.lost) state.set_role(v1::CARD_ROLE_IDLE);
      *n->add_cards() = state;
      v1::CardStatus* cs = s.add_cards();
      cs->set_node_id(part.node_id);
      *cs->mutable_state() = state;
    }
  }
  for (const v1::JobEvent& e : job.events) *s.add_events() = e;
  s.set_error_code(job.error_code);
  s.set_last_metrics_json(job.last_metrics_json);
  if (job.skewed) {
    s.set_max_clock_skew(job.config.stalesync.max_clock_skew);
    s.set_max_clock_skew_seen(job.skew_gate->MaxSkewSeen());
  }
  if (job.phase == v1::JOB_PHASE_SUCCEEDED ||
      job.phase == v1::JOB_PHASE_CANCELLED) {
    s.set_summary_json(job.summary_json);
  }
  return s;
}

absl::Status JobManager::SetStopFlag(const std::string& job_id,
                                     const std::atomic<bool>* flag) {
  absl::MutexLock lock(&mu_);
  Job* job = FindLocked(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  job->stop_flag = flag;
  return absl::OkStatus();
}

absl::StatusOr<v1::JobStatus> JobManager::Cancel(const std::string& job_id,
                                                 const std::string& reason) {
  absl::MutexLock lock(&mu_);
  Job* job = FindLocked(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'"));
  }
  if (Terminal(*job)) {
    return absl::FailedPreconditionError(absl::StrCat(
        job_id, " already ended (", v1::JobPhase_Name(job->phase), ")"));
  }
  const std::string why = reason.empty() ? "cancelled" : reason;
  if (job->phase != v1::JOB_PHASE_RUNNING) {
    FinishJobLocked(*job, v1::JOB_PHASE_CANCELLED, why);
  } else if (!job->stop_requested) {
    job->stop_requested = true;
    job->stop_reason = why;
    EventLocked(*job, absl::StrCat("stop requested: ", why));
  }
  return StatusLocked(*job);
}

void JobManager::StopAll(const std::string& reason) {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [n, job] : jobs_) {
      if (!Terminal(*job)) ids.push_back(job->id);
    }
  }
  for (const std::string& id : ids) Cancel(id, reason).IgnoreError();
}

bool JobManager::Idle() const {
  absl::MutexLock lock(&mu_);
  for (const auto& [n, job] : jobs_) {
    if (!Terminal(*job)) return false;
  }
  return true;
}

bool JobManager::WaitIdle(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto idle = [&] {
    for (const auto& [n, job] : jobs_) {
      if (!Terminal(*job)) return false;
    }
    return true;
  };
  while (!idle() && absl::Now() < deadline) {
    changed_.WaitWithDeadline(&mu_, deadline);
  }
  return idle();
}

void JobManager::RecordCardStates(const std::string& node_id,
                                  const std::vector<v1::CardState>& cards) {
  absl::MutexLock lock(&mu_);
  card_states_[node_id] = cards;
}

void JobManager::NodesLost(const std::vector<std::string>& node_ids,
                           const std::string& why) {
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
    if (job->skewed && !job->ending) {
      FailLocked(*job,
                 absl::StrCat(node_id, " lost (", why,
                              "); a job with stalesync.max_clock_skew > 0 "
                              "does not re-plan its steps: resubmit with "
                              "resume to continue from the last checkpoint"),
                 static_cast<int>(absl::StatusCode::kUnavailable));
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

absl::StatusOr<v1::GetAssignmentResponse> JobManager::GetAssignment(
    const v1::GetAssignmentRequest& request) {
  FUSIONRL_RETURN_IF_ERROR(CheckWait(request.wait_ms(), "wait_ms"));
  const absl::Time deadline =
      absl::Now() + absl::Milliseconds(request.wait_ms());
  absl::MutexLock lock(&mu_);
  for (;;) {
    std::optional<NodeView> node = registry_.Get(request.node_id());
    if (!node) {
      return absl::NotFoundError(
          absl::StrCat("node_id: unknown node '", request.node_id(), "'"));
    }
    if (node->state == NodeState::kLost) {
      return absl::FailedPreconditionError(
          absl::StrCat("node_id: ", request.node_id(),
                       " was declared lost; register again"));
    }
    auto it = node_job_.find(request.node_id());
    if (it != node_job_.end()) {
      Job* job = FindLocked(it->second);
      for (Job::Part& part : job->parts) {
        if (part.node_id != request.node_id() || part.assigned) continue;
        part.assigned = true;
        v1::GetAssignmentResponse r;
        r.set_job_id(job->id);
        r.set_config_yaml(job->request.config_yaml());
        r.set_source_name(job->request.source_name());
        *r.mutable_overrides() = job->request.overrides();
        for (int c : part.cards) r.add_card_indices(c);
        r.set_rollout_cards(part.rollout_cards);
        r.set_resume_checkpoint(job->resume_dir);
        EventLocked(*job, absl::StrCat(part.node_id, " joined with ",
                                       part.cards.size(), " card(s)"));
        return r;
      }
    }
    if (absl::Now() >= deadline) return v1::GetAssignmentResponse();
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

void JobManager::FillTrainPlanLocked(const Job& job, const Attempt& a, int k,
                                     int local_rank, v1::StepPlan* plan) const {
  const int cards = job.parts[a.members[k]].train_cards();
  const int per_card = static_cast<int>(a.groups[k].size()) / cards;
  plan->set_kind(v1::PLAN_KIND_TRAIN);
  plan->set_step(a.step);
  plan->set_attempt(a.attempt);
  plan->set_rank(a.first_rank[k] + local_rank);
  plan->set_world_size(a.world);
  plan->set_nodes(static_cast<int>(a.members.size()));
  for (int g = 0; g < per_card; ++g) {
    plan->add_groups(job.base_cursor + a.groups[k][local_rank * per_card + g]);
  }
  const RunConfig& run = job.config.run;
  const bool checkpoint = run.checkpoint_every > 0 &&
                          a.step % run.checkpoint_every == 0 &&
                          a.step != run.total_steps;
  if (plan->rank() == 0) {
    plan->set_eval_before(a.step == job.first_step && job.resume_dir.empty());
    plan->set_eval_after((run.eval_every > 0 && a.step % run.eval_every == 0) ||
                         a.step == run.total_steps);
    if (checkpoint) plan->set_checkpoint_name(absl::StrCat("step_", a.step));
  }
  if (job.skewed) {
    // Checkpoints and the last step are taken from one set of weights.
    const bool sync = checkpoint || a.step == run.total_steps;
    plan->set_exchange_updates(true);
    plan->set_sync_weights(sync);
    plan->set_updates_due_step(
        sync ? a.step : a.step - job.config.stalesync.max_clock_skew);
  }
  plan->set_rollout_tokens_before(job.summary.rollout_tokens);
  plan->set_loop_seconds_before(job.loop_seconds);
  plan->set_initial_eval_accuracy(job.summary.initial_eval_accuracy);
  plan->set_last_eval_accuracy(job.last_eval);
  plan->set_data_cursor_after(
      job.base_cursor + static_cast<uint64_t>(a.step - job.first_step + 1) *
                            job.config.rollout.prompts_per_step);
}

absl::StatusOr<const JobManager::Attempt*> JobManager::SkewedAttemptLocked(
    Job& job, int index, int64_t want) {
  const Job::Part& part = job.parts[index];
  if (want != part.clock + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step: ", part.node_id, " finished step ", part.clock,
        " and may ask only for step ", part.clock + 1, ", got ", want));
  }
  if (job.current && job.current->step == want) return job.current.get();
  if (auto it = job.ahead.find(want); it != job.ahead.end()) {
    return it->second.get();
  }
  // A new step: only within the run, not after a stop, and only while the
  // node is at most k steps ahead of the slowest.
  if (want > job.config.run.total_steps || job.stop_requested ||
      !job.skew_gate->MayStart(part.node_id)) {
    return nullptr;
  }
  const int64_t planned =
      job.ahead.empty() ? job.current->step : job.ahead.rbegin()->first;
  if (want != planned + 1) {
    return absl::InternalError(absl::StrCat("step ", want, " of ", job.id,
                                            " asked for before step ",
                                            planned + 1, " was planned"));
  }
  std::unique_ptr<Attempt> a = MakeAttemptLocked(job, want);
  if (a == nullptr) return absl::AbortedError(job.message);
  const Attempt* out = a.get();
  job.ahead[want] = std::move(a);
  ++job.update;
  changed_.SignalAll();
  return out;
}

absl::StatusOr<v1::StepPlan> JobManager::GetStepPlan(
    const v1::GetStepPlanRequest& r) {
  FUSIONRL_RETURN_IF_ERROR(CheckWait(r.wait_ms(), "wait_ms"));
  if (r.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: must be >= 0, got ", r.step()));
  }
  const absl::Time deadline = absl::Now() + absl::Milliseconds(r.wait_ms());
  absl::MutexLock lock(&mu_);
  for (;;) {
    FUSIONRL_ASSIGN_OR_RETURN(Job * job,
                              JobForNodeLocked(r.job_id(), r.node_id()));
    const int index = job->PartIndex(r.node_id());
    const int cards = job->parts[index].train_cards();
    if (r.local_rank() < 0 || r.local_rank() >= cards) {
      return absl::InvalidArgumentError(
          absl::StrCat("local_rank: must be in 0..", cards - 1, " for ",
                       r.node_id(), " in ", job->id, ", got ", r.local_rank()));
    }
    v1::StepPlan plan;
    if (Terminal(*job)) {
      plan.set_kind(v1::PLAN_KIND_ABANDON);
      plan.set_message(absl::StrCat(job->id,
                                    " ended: ", v1::JobPhase_Name(job->phase),
                                    " ", job->message));
      return plan;
    }
    if (job->ending) {
      plan.set_kind(v1::PLAN_KIND_END);
      plan.set_step(job->last_committed + 1);
      // The lead is the first card of the first live node.
      int lead = -1;
      for (size_t i = 0; i < job->parts.size() && lead < 0; ++i) {
        if (!job->parts[i].lost) lead = static_cast<int>(i);
      }
      if (index == lead && r.local_rank() == 0) {
        plan.set_checkpoint_name(job->end_checkpoint);
        plan.set_rank(0);
      } else {
        // Not the lead: wait for the end (or to become the lead, if the
        // lead is lost before it has written the last checkpoint).
        plan.set_rank(1);
        if (absl::Now() < deadline) {
          changed_.WaitWithDeadline(&mu_, deadline);
          continue;
        }
      }
      plan.set_rollout_tokens_before(job->summary.rollout_tokens);
      plan.set_loop_seconds_before(job->loop_seconds);
      plan.set_initial_eval_accuracy(job->summary.initial_eval_accuracy);
      plan.set_last_eval_accuracy(job->last_eval);
      plan.set_data_cursor_after(
          job->base_cursor +
          static_cast<uint64_t>(job->last_committed - job->first_step + 1) *
              job->config.rollout.prompts_per_step);
      return plan;
    }
    const int64_t want = r.step() == 0 ? job->first_step : r.step();
    if (job->skewed && job->phase == v1::JOB_PHASE_RUNNING) {
      FUSIONRL_ASSIGN_OR_RETURN(const Attempt* a,
                                SkewedAttemptLocked(*job, index, want));
      if (a != nullptr) {
        FillTrainPlanLocked(*job, *a, a->Member(index), r.local_rank(), &plan);
        return plan;
      }
      if (absl::Now() >= deadline) {
        plan.set_kind(v1::PLAN_KIND_WAIT);
        return plan;
      }
      changed_.WaitWithDeadline(&mu_, deadline);
      continue;
    }
    const Attempt* a = job->current.get();
    if (a != nullptr && job->phase == v1::JOB_PHASE_RUNNING &&
        a->step == want && !a->aborted) {
      const int k = a->Member(index);
      if (k >= 0) {
        FillTrainPlanLocked(*job, *a, k, r.local_rank(), &plan);
        return plan;
      }
    }
    if (a != nullptr && want < a->step - 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step: ", want, " is long over; ", job->id, " is at step ", a->step));
    }
    if (absl::Now() >= deadline) {
      plan.set_kind(v1::PLAN_KIND_WAIT);
      return plan;
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::StatusOr<std::string> JobManager::Reduce(const v1::ReduceRequest& r,
                                               absl::Time deadline) {
  const v1::ReduceDtype dtype = r.dtype();
  if (dtype != v1::REDUCE_DTYPE_FLOAT32 && dtype != v1::REDUCE_DTYPE_FLOAT64) {
    return absl::InvalidArgumentError("dtype: must be FLOAT32 or FLOAT64");
  }
  const size_t width = dtype == v1::REDUCE_DTYPE_FLOAT32 ? 4 : 8;
  if (r.payload().size() % width != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload: ", r.payload().size(), " bytes is not a whole number of ",
        width, "-byte values"));
  }
  if (r.round() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("round: must be >= 0, got ", r.round()));
  }
  absl::MutexLock lock(&mu_);
  FUSIONRL_ASSIGN_OR_RETURN(Job * job,
                            JobForNodeLocked(r.job_id(), r.node_id()));
  deadline = std::min(
      deadline,
      absl::Now() + absl::Seconds(job->config.run.collective_timeout_seconds));
  Attempt* a = job->current.get();
  if (a == nullptr || a->step != r.step() || a->attempt != r.attempt() ||
      a->aborted || Terminal(*job)) {
    return absl::AbortedError(absl::StrCat(
        "step ", r.step(), " attempt ", r.attempt(), " of ", job->id,
        " is no longer current; restore and ask for a new plan"));
  }
  const int k = a->Member(job->PartIndex(r.node_id()));
  if (k < 0) {
    return absl::AbortedError(absl::StrCat(r.node_id(), " is not in step ",
                                           r.step(), " attempt ", r.attempt()));
  }
  Round& round = a->rounds[r.round()];
  if (round.parts.empty()) {
    round.parts.resize(a->members.size());
    round.dtype = dtype;
  }
  if (round.parts[k].has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round: ", r.round(), " was already sent by ", r.node_id()));
  }
  for (const auto& p : round.parts) {
    if (p.has_value() &&
        (p->size() != r.payload().size() || round.dtype != dtype)) {
      const std::string msg =
          absl::StrCat("round ", r.round(), " of step ", r.step(), ": ",
                       r.node_id(), " sent ", r.payload().size(), " bytes of ",
                       v1::ReduceDtype_Name(dtype), ", others ", p->size(),
                       " bytes of ", v1::ReduceDtype_Name(round.dtype),
                       " (the nodes run different code or configs)");
      FailLocked(*job, msg,
                 static_cast<int>(absl::StatusCode::kInvalidArgument));
      return absl::InvalidArgumentError(msg);
    }
  }
  round.parts[k] = r.payload();
  if (++round.received == static_cast<int>(round.parts.size())) {
    // Sum in member order: every node gets the same bytes.
    std::string sum = *round.parts[0];
    const size_t n = sum.size() / width;
    for (size_t m = 1; m < round.parts.size(); ++m) {
      const char* src = round.parts[m]->data();
      char* dst = sum.data();
      if (width == 4) {
        for (size_t i = 0; i < n; ++i) {
          float x, y;
          std::memcpy(&x, dst + 4 * i, 4);
          std::memcpy(&y, src + 4 * i, 4);
          x += y;
          std::memcpy(dst + 4 * i, &x, 4);
        }
      } else {
        for (size_t i = 0; i < n; ++i) {
          double x, y;
          std::memcpy(&x, dst + 8 * i, 8);
          std::memcpy(&y, src + 8 * i, 8);
          x += y;
          std::memcpy(dst + 8 * i, &x, 8);
        }
      }
    }
    round.sum = std::move(sum);
    round.done = true;
    for (auto& p : round.parts) p.reset();
    changed_.SignalAll();
  }
  // `a` stays valid while we hold the lock or while it is job->current;
  // re-find it after every wait.
  const int64_t step = r.step();
  const int attempt = r.attempt();
  for (;;) {
    Attempt* cur = job->current.get();
    if (cur == nullptr || cur->step != step || cur->attempt != attempt ||
        cur->aborted || Terminal(*job)) {
      return absl::AbortedError(
          absl::StrCat("step ", step, " attempt ", attempt, " of ", job->id,
                       " was aborted (a node was lost or the job ended)"));
    }
    Round& rd = cur->rounds[r.round()];
    if (rd.done) {
      std::string out = rd.sum;
      if (++rd.fetched == static_cast<int>(cur->members.size())) {
        cur->rounds.erase(r.round());
      }
      return out;
    }
    if (absl::Now() >= deadline) {
      std::vector<std::string> missing;
      for (size_t i = 0; i < rd.parts.size(); ++i) {
        if (!rd.parts[i].has_value()) {
          missing.push_back(job->parts[cur->members[i]].node_id);
        }
      }
      return absl::DeadlineExceededError(
          absl::StrCat("round ", r.round(), " of step ", step, ": waited for ",
                       absl::StrJoin(missing, ", ")));
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::StatusOr<v1::FinishStepResponse> JobManager::FinishStep(
    const v1::FinishStepRequest& r, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  FUSIONRL_ASSIGN_OR_RETURN(Job * job,
                            JobForNodeLocked(r.job_id(), r.node_id()));
  v1::FinishStepResponse response;
  if (!r.error().empty()) {
    FailLocked(*job, absl::StrCat(r.node_id(), ": ", r.error()),
               r.error_code() != 0
                   ? r.error_code()
                   : static_cast<int>(absl::StatusCode::kUnknown));
    return response;
  }
  if (Terminal(*job)) return response;
  deadline = std::min(
      deadline,
      absl::Now() + absl::Seconds(job->config.run.collective_timeout_seconds));
  if (job->ending) {
    if (r.step() != job->last_committed + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("step: the end of ", job->id, " is reported as step ",
                       job->last_committed + 1, ", got ", r.step()));
    }
    if (!r.checkpoint_dir().empty()) job->checkpoint_dir = r.checkpoint_dir();
    FinishJobLocked(
        *job,
        job->stop_requested && job->last_committed < job->config.run.total_steps
            ? v1::JOB_PHASE_CANCELLED
            : v1::JOB_PHASE_SUCCEEDED,
        job->stop_requested ? job->stop_reason : "");
    response.set_committed(true);
    return response;
  }
  if (job->skewed) return FinishSkewedStepLocked(*job, r);
  Attempt* a = job->current.get();
  if (a == nullptr || a->step != r.step() || a->attempt != r.attempt() ||
      a->aborted) {
    return response;  // not committed: restore and replan
  }
  const int k = a->Member(job->PartIndex(r.node_id()));
  if (k < 0) return response;
  if (k == 0) {
    a->lead_report = r;
    a->have_lead_report = true;
  }
  a->finished[k] = true;
  if (std::all_of(a->finished.begin(), a->finished.end(),
                  [](bool b) { return b; })) {
    CommitLocked(*job);
    response.set_committed(true);
    return response;
  }
  const int64_t step = r.step();
  const int attempt = r.attempt();
  for (;;) {
    // Committed: the job has moved past this attempt without aborting it.
    if (job->last_committed >= step) {
      response.set_committed(true);
      return response;
    }
    Attempt* cur = job->current.get();
    if (Terminal(*job) || cur == nullptr || cur->step != step ||
        cur->attempt != attempt || cur->aborted) {
      return response;
    }
    if (absl::Now() >= deadline) {
      std::vector<std::string> missing;
      for (size_t i = 0; i < cur->finished.size(); ++i) {
        if (!cur->finished[i]) {
          missing.push_back(job->parts[cur->members[i]].node_id);
        }
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "end of step ", step, ": waited for ", absl::StrJoin(missing, ", ")));
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

}  // namespace fusionrl

namespace fusionrl {

absl::StatusOr<v1::FinishStepResponse> JobManager::FinishSkewedStepLocked(
    Job& job, const v1::FinishStepRequest& r) {
  const int index = job.PartIndex(r.node_id());
  Attempt* a = nullptr;
  if (job.current && job.current->step == r.step()) {
    a = job.current.get();
  } else if (auto it = job.ahead.find(r.step()); it != job.ahead.end()) {
    a = it->second.get();
  }
  const int k = a == nullptr ? -1 : a->Member(index);
  if (k < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("step: ", r.step(), " of ", job.id,
                     " is not a step planned for ", r.node_id()));
  }
  v1::FinishStepResponse response;
  response.set_committed(true);
  if (a->finished[k]) return response;  // a retried call
  absl::Status advanced = job.skew_gate->Advance(r.node_id(), r.step());
  if (!advanced.ok()) {
    // The plans are handed out through the gate: a bug, not bad input.
    FailLocked(job, absl::StrCat("internal: ", advanced.message()),
               static_cast<int>(absl::StatusCode::kInternal));
    return advanced;
  }
  a->finished[k] = true;
  a->reports[k] = r;
  if (k == 0) {
    a->lead_report = r;
    a->have_lead_report = true;
  }
  job.parts[index].clock = r.step();
  if (r.has_weights_crc32c()) {
    job.weights_crc[job.parts[index].super_node] = r.weights_crc32c();
  }
  // Commit, in order, every step all its nodes have finished.
  while (!Terminal(job) && !job.ending && job.current &&
         std::all_of(job.current->finished.begin(), job.current->finished.end(),
                     [](bool b) { return b; })) {
    CommitLocked(job);
  }
  ++job.update;
  changed_.SignalAll();
  return response;
}

absl::StatusOr<v1::ExchangeUpdatesResponse> JobManager::ExchangeUpdates(
    const v1::ExchangeUpdatesRequest& r, absl::Time deadline) {
  const v1::GradientUpdate& u = r.update();
  if (u.step() < 1 || u.round() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("update: step must be >= 1 and round >= 0, got step ",
                     u.step(), " round ", u.round()));
  }
  if (u.payload().empty() || u.payload().size() % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("update.payload: ", u.payload().size(),
                     " bytes is not a non-empty whole number of float32"));
  }
  const uint32_t crc = Crc32c(u.payload());
  if (crc != u.crc32c()) {
    return absl::DataLossError(absl::StrFormat(
        "update of %s step %d round %d: CRC-32C of the %d bytes is 0x%08x, "
        "expected 0x%08x",
        u.node_id(), u.step(), u.round(), u.payload().size(), crc, u.crc32c()));
  }
  absl::MutexLock lock(&mu_);
  FUSIONRL_ASSIGN_OR_RETURN(Job * job,
                            JobForNodeLocked(r.job_id(), u.node_id()));
  if (!job->skewed) {
    return absl::FailedPreconditionError(absl::StrCat(
        job->id,
        " does not exchange updates (stalesync.max_clock_skew is 0 or it runs "
        "on one super node); its steps use WorkService.Reduce"));
  }
  if (Terminal(*job)) {
    return absl::AbortedError(absl::StrCat(job->id, " ended"));
  }
  deadline = std::min(
      deadline,
      absl::Now() + absl::Seconds(job->config.run.collective_timeout_seconds));
  const int me = job->PartIndex(u.node_id());
  const Job::Key key{u.step(), u.round()};
  if (key <= job->handed_in[me]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update: (step, round) must grow; ", u.node_id(), " handed in (",
        job->handed_in[me].first, ", ", job->handed_in[me].second,
        ") before, got (", u.step(), ", ", u.round(), ")"));
  }
  for (const auto& box : job->outbox) {
    if (!box.empty() && box.front().payload.size() != u.payload().size()) {
      const std::string msg = absl::StrCat(
          "update of ", u.node_id(), " step ", u.step(), ": ",
          u.payload().size(), " bytes, others ", box.front().payload.size(),
          " (the super nodes run different models or code)");
      FailLocked(*job, msg,
                 static_cast<int>(absl::StatusCode::kInvalidArgument));
      return absl::InvalidArgumentError(msg);
    }
  }
  job->outbox[me].push_back({key, u.payload(), crc});
  job->handed_in[me] = key;
  changed_.SignalAll();

  // Wait for every other live node's update of (due_step, round).
  const Job::Key due{r.due_step(), u.round()};
  for (;;) {
    if (Terminal(*job)) {
      return absl::AbortedError(
          absl::StrCat(job->id, " ended: ", job->message));
    }
    std::vector<std::string> missing;
    for (size_t m = 0; m < job->parts.size(); ++m) {
      if (static_cast<int>(m) == me || job->parts[m].lost) continue;
      if (r.due_step() >= job->first_step && job->handed_in[m] < due) {
        missing.push_back(absl::StrCat(job->parts[m].node_id, " (at step ",
                                       job->handed_in[m].first, " round ",
                                       job->handed_in[m].second, ")"));
      }
    }
    if (missing.empty()) break;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "update exchange of ", u.node_id(), " at step ", u.step(), " round ",
          u.round(), ": waited for step ", r.due_step(), " round ", u.round(),
          " of ", absl::StrJoin(missing, ", ")));
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }

  // Hand over what this node has not received, up to its own key; drop
  // updates every other node has received.
  v1::ExchangeUpdatesResponse response;
  const int n = static_cast<int>(job->parts.size());
  for (int m = 0; m < n; ++m) {
    if (m == me) continue;
    Job::Key& mark = job->delivered[me][m];
    for (const Job::Update& up : job->outbox[m]) {
      if (up.key <= mark) continue;
      if (up.key > key) break;
      v1::GradientUpdate* out = response.add_updates();
      out->set_node_id(job->parts[m].node_id);
      out->set_step(up.key.first);
      out->set_round(up.key.second);
      out->set_payload(up.payload);
      out->set_crc32c(up.crc32c);
      mark = up.key;
    }
    std::deque<Job::Update>& box = job->outbox[m];
    while (!box.empty()) {
      bool everyone = true;
      for (int q = 0; q < n; ++q) {
        if (q != m && !job->parts[q].lost &&
            job->delivered[q][m] < box.front().key) {
          everyone = false;
        }
      }
      if (!everyone) break;
      box.pop_front();
    }
  }
  return response;
}

}  // namespace fusionrl
