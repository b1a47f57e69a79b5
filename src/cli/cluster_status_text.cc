// The readable text of a job's and the cluster's status (see
// cluster_status_text.h).
#include "cli/cluster_status_text.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/memory_manager.h"
#include "nlohmann/json.hpp"

namespace fusionrl::cli {

bool Terminal(v1::JobPhase phase) {
  return phase == v1::JOB_PHASE_SUCCEEDED || phase == v1::JOB_PHASE_FAILED ||
         phase == v1::JOB_PHASE_CANCELLED;
}

std::string PhaseName(v1::JobPhase phase) {
  std::string name = v1::JobPhase_Name(phase);
  const std::string prefix = "JOB_PHASE_";
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

std::string RoleName(v1::CardRole role) {
  std::string name = v1::CardRole_Name(role);
  const std::string prefix = "CARD_ROLE_";
  name = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
  for (char& c : name) c = static_cast<char>(std::tolower(c));
  return name;
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options)
           .ok()) {
    return "{}";
  }
  return out;
}

namespace {

// The job's phase and progress, its message, and its learning figures.
std::string JobHeadLines(const v1::JobStatus& s) {
  std::string out = absl::StrFormat(
      "%s  %s  %s  step %d/%d  version %d\n", s.job_id(), s.name(),
      PhaseName(s.phase()), s.step(), s.total_steps(), s.policy_version());
  if (!s.message().empty()) absl::StrAppend(&out, "  ", s.message(), "\n");
  absl::StrAppendFormat(
      &out,
      "  reward %.3f  train acc %.3f  eval %.3f (start %.3f)  %.0f tok/s\n",
      s.reward_mean(), s.train_accuracy(), s.eval_accuracy(),
      s.initial_eval_accuracy(), s.tokens_per_second());
  absl::StrAppendFormat(&out,
                        "  prompt groups: %d submitted, %d trained, %d "
                        "re-queued\n",
                        s.groups_submitted(), s.groups_trained(),
                        s.groups_requeued());
  return out;
}

// A MoE policy: the router's balance at the last step.
std::string MoeRouterLine(const nlohmann::json& rec) {
  std::string load;
  for (int i = 0; rec.contains(absl::StrCat("moe_load_", i)); ++i) {
    absl::StrAppendFormat(&load, "%s%.2f", i == 0 ? "" : " ",
                          rec[absl::StrCat("moe_load_", i)].get<double>());
  }
  std::string groups;
  for (int g = 0; rec.contains(absl::StrCat("moe_group_load_", g)); ++g) {
    absl::StrAppendFormat(
        &groups, "%s%.3f", g == 0 ? "  group load " : " ",
        rec[absl::StrCat("moe_group_load_", g)].get<double>());
  }
  std::string disagreement;
  if (rec.contains("moe_route_disagreement")) {
    disagreement =
        absl::StrFormat("  routing differs from rollout on %.1f%% of tokens",
                        100 * rec["moe_route_disagreement"].get<double>());
  }
  return absl::StrFormat(
      "  MoE router: expert load %s%s  dropped %.1f%%  aux loss %.4f%s\n", load,
      groups, 100 * rec.value("moe_dropped_frac", 0.0),
      rec.value("moe_aux_loss", 0.0), disagreement);
}

// Expert parallelism: the lead card's token exchanges at the last step.
std::string ExpertParallelLine(const nlohmann::json& rec) {
  std::string out = absl::StrFormat(
      "  MoE experts: %.0f cards per expert group; all-to-all %.1f MiB "
      "in %.3f s, gather %.3f s",
      rec.value("expert_parallel", 0.0),
      rec.value("expert_alltoall_bytes", 0.0) / 1048576.0,
      rec.value("expert_alltoall_seconds", 0.0),
      rec.value("expert_gather_seconds", 0.0));
  if (rec.contains("expert_sampling_alltoall_bytes")) {
    // expert_sampling shard: the rollout's exchanges since the previous
    // step's record.
    absl::StrAppendFormat(
        &out, "; sampling all-to-all %.1f MiB in %.3f s",
        rec.value("expert_sampling_alltoall_bytes", 0.0) / 1048576.0,
        rec.value("expert_sampling_alltoall_seconds", 0.0));
  }
  return out + "\n";
}

// The lines drawn from the last step's metrics record (MoE, LoRA,
// multi-turn episodes), each when the record has its fields.
std::string LastStepLines(const std::string& metrics_json) {
  if (metrics_json.empty()) return "";
  auto rec = nlohmann::json::parse(metrics_json, nullptr,
                                   /*allow_exceptions=*/false);
  if (!rec.is_object()) return "";
  std::string out;
  if (rec.contains("moe_dropped_frac")) out += MoeRouterLine(rec);
  if (rec.contains("expert_parallel")) out += ExpertParallelLine(rec);
  if (rec.contains("lora_rank")) {
    // What the optimizer holds and a weight publish moves.
    const double n = rec.value("lora_trainable_parameters", 0.0);
    absl::StrAppendFormat(
        &out,
        "  LoRA: rank %.0f, %.2f M trainable parameters (%.1f MiB a weight "
        "publish)\n",
        rec.value("lora_rank", 0.0), n / 1e6, 4 * n / 1048576.0);
  }
  if (rec.contains("env_turns_mean")) {
    // Multi-turn episodes at the last step.
    absl::StrAppendFormat(
        &out,
        "  episodes: %.2f turns  %.2f tool calls  %.2f tool errors  "
        "%.3fs in the environment  %.0f failed by it\n",
        rec.value("env_turns_mean", 0.0), rec.value("env_tool_calls_mean", 0.0),
        rec.value("env_tool_errors_mean", 0.0),
        rec.value("env_seconds_mean", 0.0),
        rec.value("env_failed_episodes", 0.0));
  }
  return out;
}

// The StaleSync clocks (skewed jobs) and the tensor bytes through the
// controller (several nodes).
std::string ClusterLines(const v1::JobStatus& s) {
  std::string out;
  if (s.max_clock_skew() > 0) {
    std::string clocks;
    for (const v1::NodeStatus& n : s.nodes()) {
      absl::StrAppend(&clocks, " ", n.super_node(), "=", n.clock());
    }
    absl::StrAppendFormat(&out,
                          "  StaleSync clocks:%s  (max_clock_skew %d, largest "
                          "skew seen %d)\n",
                          clocks, s.max_clock_skew(), s.max_clock_skew_seen());
  }
  if (s.nodes_size() > 1) {
    // 0 on the c10d data plane: the nodes sum among themselves.
    absl::StrAppendFormat(&out, "  tensors through the controller: %.1f MiB\n",
                          s.controller_tensor_bytes() / 1048576.0);
  }
  return out;
}

// One node's row of the job's node table, then what each of its cards is
// doing and its memory books.
std::string JobNodeLines(const v1::NodeStatus& n) {
  std::string cards;
  for (const v1::CardState& c : n.cards()) {
    absl::StrAppendFormat(&cards, "%s%d:%s %.0f%%", cards.empty() ? "" : "  ",
                          c.index(), RoleName(c.role()),
                          100 * c.busy_fraction());
  }
  std::string out = absl::StrFormat(
      "  %-10s %-12s %-16s %-6s %-10s %s\n", n.node_id(), n.super_node(),
      n.host(), n.state(), absl::StrFormat("%.1fs", n.heartbeat_age_ms() / 1e3),
      cards);
  // What each card is doing, and for how long.
  for (const v1::CardState& c : n.cards()) {
    if (c.activity().empty()) continue;
    absl::StrAppendFormat(&out, "    card %s/%d: %s for %.0f s\n", n.node_id(),
                          c.index(), c.activity(), c.activity_seconds());
  }
  // One memory line per card that reports its books (CardState's proto
  // map has no order; FormatCardMemory fixes one).
  for (const v1::CardState& c : n.cards()) {
    if (c.memory_bytes().empty()) continue;
    const std::map<std::string, int64_t> memory(c.memory_bytes().begin(),
                                                c.memory_bytes().end());
    absl::StrAppend(&out, "    ", FormatCardMemory(c.index(), memory), "\n");
  }
  return out;
}

// The job's node table ("" without nodes).
std::string JobNodeTable(const v1::JobStatus& s) {
  if (s.nodes_size() == 0) return "";
  std::string out = absl::StrFormat("  %-10s %-12s %-16s %-6s %-10s %s\n",
                                    "NODE", "SUPER NODE", "HOST", "STATE",
                                    "HEARTBEAT", "CARDS (role busy%)");
  for (const v1::NodeStatus& n : s.nodes()) out += JobNodeLines(n);
  return out;
}

// The last 8 events, with their local time of day.
std::string RecentEvents(const v1::JobStatus& s) {
  std::string out;
  const int shown = std::min(8, s.events_size());
  if (shown > 0) absl::StrAppend(&out, "  recent events:\n");
  for (int i = s.events_size() - shown; i < s.events_size(); ++i) {
    const v1::JobEvent& e = s.events(i);
    absl::StrAppend(
        &out, "    ",
        absl::FormatTime("%H:%M:%S", absl::FromUnixMicros(e.time_us()),
                         absl::LocalTimeZone()),
        " ", e.text(), "\n");
  }
  return out;
}

}  // namespace

std::string FormatStatus(const v1::JobStatus& s) {
  return absl::StrCat(JobHeadLines(s), LastStepLines(s.last_metrics_json()),
                      ClusterLines(s), JobNodeTable(s), RecentEvents(s));
}

std::string FormatCluster(const v1::ClusterStatus& c) {
  std::string out = absl::StrFormat(
      "controller %s, up %s, %d node(s)\n", c.version(),
      absl::FormatDuration(absl::Seconds(std::floor(c.uptime_seconds()))),
      c.nodes_size());
  std::map<std::string, std::pair<int, int>> super_nodes;  // nodes, cards
  for (const v1::NodeStatus& n : c.nodes()) {
    if (n.state() != "alive") continue;
    auto& [nodes, cards] = super_nodes[n.super_node()];
    ++nodes;
    cards += n.cards_size();
  }
  if (!super_nodes.empty()) {
    absl::StrAppend(&out, "super nodes:");
    for (const auto& [name, counts] : super_nodes) {
      absl::StrAppendFormat(&out, "  %s (%d node(s), %d card(s))", name,
                            counts.first, counts.second);
    }
    absl::StrAppend(&out, "\n");
  }
  if (c.nodes_size() == 0) {
    absl::StrAppend(&out, "no workers registered\n");
  } else {
    absl::StrAppendFormat(&out, "%-10s %-12s %-16s %-6s %-9s %-8s %s\n", "NODE",
                          "SUPER NODE", "HOST", "STATE", "HEARTBEAT", "JOB",
                          "VERSION");
  }
  for (const v1::NodeStatus& n : c.nodes()) {
    absl::StrAppendFormat(&out, "%-10s %-12s %-16s %-6s %-9s %-8s %s\n",
                          n.node_id(), n.super_node(), n.host(), n.state(),
                          absl::StrFormat("%.1fs", n.heartbeat_age_ms() / 1e3),
                          n.job_id().empty() ? "-" : n.job_id(),
                          n.version().empty() ? "?" : n.version());
    for (int i = 0; i < n.cards_size(); ++i) {
      const v1::CardState& card = n.cards(i);
      const std::string device =
          i < n.card_specs_size() ? n.card_specs(i).device() : "";
      std::string line = absl::StrFormat(
          "  card %d %-5s %-9s busy %3.0f%%", card.index(), device,
          RoleName(card.role()), 100 * card.busy_fraction());
      if (!card.activity().empty()) {
        absl::StrAppendFormat(&line, "  %s for %.0f s", card.activity(),
                              card.activity_seconds());
      }
      absl::StrAppend(&out, line, "\n");
      if (!card.memory_bytes().empty()) {
        const std::map<std::string, int64_t> memory(card.memory_bytes().begin(),
                                                    card.memory_bytes().end());
        absl::StrAppend(&out, "    ", FormatCardMemory(card.index(), memory),
                        "\n");
      }
    }
  }
  if (c.jobs_size() == 0) absl::StrAppend(&out, "no jobs\n");
  for (const v1::JobStatus& j : c.jobs()) {
    if (Terminal(j.phase())) {
      absl::StrAppendFormat(&out, "%s  %s  %s  step %d/%d%s\n", j.job_id(),
                            j.name(), PhaseName(j.phase()), j.step(),
                            j.total_steps(),
                            j.message().empty() ? "" : "  " + j.message());
    } else {
      absl::StrAppend(&out, FormatStatus(j));
    }
  }
  return out;
}

}  // namespace fusionrl::cli
