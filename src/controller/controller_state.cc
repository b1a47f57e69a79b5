#include "controller/controller_state.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace fusionrl {

v1::NodeState ControllerState::NodeStateOf(const std::string& node_id) const {
  v1::NodeState n;
  n.set_number(NodeRegistry::NumberOf(node_id).value_or(0));
  std::optional<NodeView> view = registry_.Get(node_id);
  if (!view) {
    n.set_gone(true);
    return n;
  }
  n.set_host(view->spec.host);
  n.set_super_node(view->spec.super_node);
  for (const CardSpec& c : view->spec.cards) {
    v1::NodeState::Card* card = n.add_cards();
    card->set_index(c.index);
    card->set_device(c.device);
    card->set_memory_bytes(c.memory_bytes);
  }
  n.set_host_memory_bytes(view->spec.host_memory_bytes);
  n.set_lost(view->state == NodeState::kLost);
  n.set_registered_us(absl::ToUnixMicros(view->registered));
  return n;
}

absl::StatusOr<std::unique_ptr<ControllerState>> ControllerState::Open(
    const std::string& dir, NodeRegistry& registry, JobManager& jobs) {
  StateJournal::Loaded loaded;
  FUSIONRL_ASSIGN_OR_RETURN(std::unique_ptr<StateJournal> journal,
                            StateJournal::Open(dir, &loaded));
  if (!loaded.warning.empty()) spdlog::warn("controller: {}", loaded.warning);
  // The snapshot, then the newer records: the last state of each node and
  // job wins.
  v1::StateSnapshot snapshot;
  if (loaded.has_snapshot && !snapshot.ParseFromString(loaded.snapshot)) {
    return absl::DataLossError(
        absl::StrCat("--state-dir ", dir,
                     ": the snapshot does not parse (written by "
                     "another version?)"));
  }
  std::map<uint64_t, v1::NodeState> nodes;
  std::map<std::string, v1::JobState> states;
  for (const v1::NodeState& n : snapshot.nodes()) nodes[n.number()] = n;
  for (const v1::JobState& j : snapshot.jobs()) states[j.id()] = j;
  uint64_t seq = snapshot.seq();
  uint64_t next_node = snapshot.next_node_number();
  uint64_t next_job = static_cast<uint64_t>(snapshot.next_job_number());
  int replayed = 0;
  for (size_t i = 0; i < loaded.records.size(); ++i) {
    v1::StateRecord r;
    if (!r.ParseFromString(loaded.records[i])) {
      return absl::DataLossError(absl::StrCat(
          "--state-dir ", dir, ": journal record ", i,
          " passes its checksum but does not parse (written by another "
          "version?)"));
    }
    if (r.seq() <= snapshot.seq()) continue;  // already in the snapshot
    seq = std::max(seq, r.seq());
    next_node = std::max(next_node, r.next_node_number());
    next_job = std::max(next_job, static_cast<uint64_t>(r.next_job_number()));
    if (r.has_node()) {
      if (r.node().gone()) {
        nodes.erase(r.node().number());
      } else {
        nodes[r.node().number()] = r.node();
      }
    } else if (r.has_job()) {
      states[r.job().id()] = r.job();
    }
    ++replayed;
  }
  for (const auto& [number, n] : nodes) {
    NodeSpec spec;
    spec.host = n.host();
    spec.super_node = n.super_node();
    for (const v1::NodeState::Card& c : n.cards()) {
      spec.cards.push_back(CardSpec{c.index(), c.device(), c.memory_bytes()});
    }
    spec.host_memory_bytes = n.host_memory_bytes();
    absl::Status s =
        registry.Restore(number, spec, n.lost(),
                         absl::FromUnixMicros(n.registered_us()), next_node);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--state-dir ", dir, ": node-",
                                                 number, ": ", s.message()));
    }
  }
  std::vector<v1::JobState> job_list;
  for (auto& [id, j] : states) job_list.push_back(std::move(j));
  // Job ids in submission order ("job-2" before "job-10").
  std::sort(job_list.begin(), job_list.end(),
            [](const v1::JobState& a, const v1::JobState& b) {
              return a.id().size() != b.id().size()
                         ? a.id().size() < b.id().size()
                         : a.id() < b.id();
            });
  if (absl::Status s = jobs.Restore(job_list, next_job); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("--state-dir ", dir, ": ", s.message()));
  }
  std::unique_ptr<ControllerState> state(
      new ControllerState(std::move(journal), registry, jobs));
  state->restored_nodes_ = static_cast<int>(nodes.size());
  state->restored_jobs_ = static_cast<int>(job_list.size());
  {
    absl::MutexLock lock(&state->mu_);
    state->seq_ = seq;
    // What the restore itself changed is in this snapshot.
    FUSIONRL_RETURN_IF_ERROR(state->CompactLocked());
  }
  ControllerState* self = state.get();
  jobs.SetStateSink([self](std::vector<v1::JobState> changed) {
    return self->WriteJobs(std::move(changed));
  });
  if (loaded.has_snapshot || replayed > 0) {
    spdlog::info(
        "controller: restored {} node(s) and {} job(s) from {} (snapshot + "
        "{} journal record(s))",
        nodes.size(), job_list.size(), dir, replayed);
  }
  return state;
}

ControllerState::~ControllerState() { jobs_.SetStateSink(nullptr); }

void ControllerState::NodeChanged(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  v1::StateRecord r;
  *r.mutable_node() = NodeStateOf(node_id);
  if (absl::Status s = WriteLocked({std::move(r)}, /*may_compact=*/false);
      !s.ok()) {
    spdlog::error("controller state: {} (node {} not on disk)",
                  std::string(s.message()), node_id);
  }
}

absl::Status ControllerState::WriteJobs(std::vector<v1::JobState> changed) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::StateRecord> records;
  records.reserve(changed.size());
  for (v1::JobState& j : changed) {
    v1::StateRecord r;
    *r.mutable_job() = std::move(j);
    records.push_back(std::move(r));
  }
  return WriteLocked(std::move(records), /*may_compact=*/true);
}

absl::Status ControllerState::WriteLocked(std::vector<v1::StateRecord> records,
                                          bool may_compact) {
  std::vector<std::string> bytes;
  bytes.reserve(records.size());
  const uint64_t next_node = registry_.next_number();
  for (v1::StateRecord& r : records) {
    r.set_seq(++seq_);
    r.set_next_node_number(next_node);
    bytes.push_back(r.SerializeAsString());
  }
  FUSIONRL_RETURN_IF_ERROR(journal_->Append(bytes));
  if (may_compact && journal_->journal_bytes() > kCompactBytes) {
    return CompactLocked();
  }
  return absl::OkStatus();
}

absl::Status ControllerState::CompactLocked() {
  v1::StateSnapshot snapshot;
  snapshot.set_seq(seq_);
  for (const NodeView& v : registry_.List()) {
    *snapshot.add_nodes() = NodeStateOf(v.id);
  }
  snapshot.set_next_node_number(registry_.next_number());
  uint64_t next_job = 0;
  for (v1::JobState& j : jobs_.SaveAll(&next_job)) {
    *snapshot.add_jobs() = std::move(j);
  }
  snapshot.set_next_job_number(static_cast<int64_t>(next_job));
  return journal_->Compact(snapshot.SerializeAsString());
}

}  // namespace fusionrl
