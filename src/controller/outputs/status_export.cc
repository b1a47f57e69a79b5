#include "controller/outputs/status_export.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Label values escape backslash, double quote and newline (exposition
// format 0.0.4).
std::string Escape(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.17g", v);
}

// One family: HELP and TYPE once, then its samples, appended to `out` as a
// block when the family goes out of scope (so families filled side by side
// never interleave).
class Family {
 public:
  Family(std::string& out, const std::string& name, const char* type,
         const std::string& help)
      : out_(out), name_(name) {
    absl::StrAppend(&body_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                    type, "\n");
  }
  ~Family() { out_ += body_; }
  void Add(const Labels& labels, double value, const char* suffix = "") {
    absl::StrAppend(&body_, name_, suffix);
    if (!labels.empty()) {
      body_ += '{';
      for (size_t i = 0; i < labels.size(); ++i) {
        if (i > 0) body_ += ',';
        absl::StrAppend(&body_, labels[i].first, "=\"",
                        Escape(labels[i].second), "\"");
      }
      body_ += '}';
    }
    absl::StrAppend(&body_, " ", Number(value), "\n");
  }

 private:
  std::string& out_;
  std::string name_;
  std::string body_;
};

constexpr const char* kPhases[] = {"pending", "waiting_for_capacity",
                                   "running", "succeeded",
                                   "failed",  "cancelled"};

// A card's memory books (core/memory_manager.h's snapshot): bytes in use
// by category, the peak of each ("peak_<category>", "peak_total"), the sum
// in use ("in_use") and the budget ("budget").
struct CardMemory {
  std::map<std::string, int64_t> current, peak;
  int64_t in_use = -1, budget = -1;
};

CardMemory SplitMemory(const v1::CardState& card) {
  CardMemory m;
  for (const auto& [key, bytes] : card.memory_bytes()) {
    if (key == "in_use") {
      m.in_use = bytes;
    } else if (key == "budget") {
      m.budget = bytes;
    } else if (key == "peak_total") {
      m.peak["total"] = bytes;
    } else if (absl::StartsWith(key, "peak_")) {
      m.peak[key.substr(5)] = bytes;
    } else {
      m.current[key] = bytes;
    }
  }
  return m;
}

double LastMetric(const v1::JobStatus& job, const char* key) {
  if (job.last_metrics_json().empty()) return NAN;
  nlohmann::json j = nlohmann::json::parse(job.last_metrics_json(), nullptr,
                                           /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return NAN;
  return j[key].get<double>();
}

}  // namespace

const char* CardRoleLabel(int role) {
  switch (role) {
    case v1::CARD_ROLE_COLOCATED:
      return "colocated";
    case v1::CARD_ROLE_FUSED:
      return "fused";
    case v1::CARD_ROLE_ROLLOUT:
      return "rollout";
    case v1::CARD_ROLE_TRAIN:
      return "train";
    default:
      return "idle";
  }
}

const char* JobPhaseLabel(int phase) {
  if (phase >= v1::JOB_PHASE_PENDING && phase <= v1::JOB_PHASE_CANCELLED) {
    return kPhases[phase - 1];
  }
  return "unspecified";
}

void JobCurves::Add(const v1::JobHistory& history, size_t limit) {
  for (const v1::StepRecord& r : history.records()) {
    if (r.seq() <= last_seq) continue;
    last_seq = r.seq();
    if (r.eval_accuracy() >= 0) {
      while (!eval_step.empty() && eval_step.back() >= r.step()) {
        eval_step.pop_back();
        eval_accuracy.pop_back();
      }
      eval_step.push_back(r.step());
      eval_accuracy.push_back(r.eval_accuracy());
    }
    if (r.metrics_json().empty()) continue;
    nlohmann::json j = nlohmann::json::parse(r.metrics_json(), nullptr,
                                             /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    auto num = [&j](const char* key) {
      auto it = j.find(key);
      return it != j.end() && it->is_number() ? it->get<double>() : NAN;
    };
    while (!step.empty() && step.back() >= r.step()) {
      step.pop_back();
      reward_mean.pop_back();
      train_accuracy.pop_back();
      tokens_per_second.pop_back();
      max_staleness.pop_back();
    }
    step.push_back(r.step());
    reward_mean.push_back(num("reward_mean"));
    train_accuracy.push_back(num("train_accuracy"));
    tokens_per_second.push_back(num("tokens_per_second"));
    max_staleness.push_back(num("max_staleness"));
  }
  if (step.size() > limit) {
    const size_t drop = step.size() - limit;
    for (auto* v :
         {&reward_mean, &train_accuracy, &tokens_per_second, &max_staleness}) {
      v->erase(v->begin(), v->begin() + drop);
    }
    step.erase(step.begin(), step.begin() + drop);
  }
}

namespace {

// The controller's build and uptime.
void AppendControllerFamilies(const v1::ClusterStatus& status,
                              std::string& out) {
  Family(out, "fusionrl_build_info", "gauge",
         "FusionRL version of the controller (always 1).")
      .Add({{"version", status.version()}}, 1);
  Family(out, "fusionrl_controller_uptime_seconds", "gauge",
         "Seconds since the controller started.")
      .Add({}, status.uptime_seconds());
}

// Worker nodes by state.
void AppendNodeCounts(const v1::ClusterStatus& status, std::string& out) {
  std::map<std::string, int> by_state = {{"alive", 0}, {"lost", 0}};
  for (const v1::NodeStatus& n : status.nodes()) ++by_state[n.state()];
  Family f(out, "fusionrl_nodes", "gauge", "Worker nodes by state.");
  for (const auto& [state, count] : by_state) f.Add({{"state", state}}, count);
}

// Each node's liveness and heartbeat age, and its StaleSync clock in
// the jobs that keep one.
void AppendNodeFamilies(const v1::ClusterStatus& status, std::string& out) {
  Family up(out, "fusionrl_node_up", "gauge",
            "1 while the node heartbeats, 0 once declared lost.");
  for (const v1::NodeStatus& n : status.nodes()) {
    up.Add({{"node", n.node_id()},
            {"host", n.host()},
            {"super_node", n.super_node()},
            {"version", n.version()}},
           n.state() == "alive" ? 1 : 0);
  }
  Family age(out, "fusionrl_node_heartbeat_age_seconds", "gauge",
             "Seconds since the node's last heartbeat.");
  for (const v1::NodeStatus& n : status.nodes()) {
    age.Add({{"node", n.node_id()}}, n.heartbeat_age_ms() / 1000.0);
  }
  Family clock(out, "fusionrl_node_clock", "gauge",
               "StaleSync across super nodes: the last step the node "
               "finished (jobs with max_clock_skew > 0).");
  for (const v1::JobStatus& job : status.jobs()) {
    if (job.max_clock_skew() <= 0) continue;
    for (const v1::NodeStatus& n : job.nodes()) {
      clock.Add({{"job", job.job_id()},
                 {"node", n.node_id()},
                 {"super_node", n.super_node()}},
                n.clock());
    }
  }
}

// Each live node's cards: busy fraction, memory and activity.
void AppendCardFamilies(const v1::ClusterStatus& status, std::string& out) {
  Family busy(out, "fusionrl_card_busy_fraction", "gauge",
              "Fraction of the last heartbeat interval the card was busy, "
              "labelled with the role it plays.");
  Family mem(out, "fusionrl_card_memory_bytes", "gauge",
             "Bytes in use on the card, by category.");
  Family peak(out, "fusionrl_card_memory_peak_bytes", "gauge",
              "Most bytes the card has held, by category (total: of the "
              "sum).");
  Family budget(out, "fusionrl_card_memory_budget_bytes", "gauge",
                "The card's memory budget (memory.card_budget_mib).");
  Family act(out, "fusionrl_card_activity_seconds", "gauge",
             "How long the card has been doing what it reports doing.");
  for (const v1::NodeStatus& n : status.nodes()) {
    if (n.state() != "alive") continue;
    for (const v1::CardState& c : n.cards()) {
      const std::string card = absl::StrCat(c.index());
      busy.Add({{"node", n.node_id()},
                {"card", card},
                {"role", CardRoleLabel(c.role())}},
               c.busy_fraction());
      const CardMemory m = SplitMemory(c);
      for (const auto& [category, bytes] : m.current) {
        mem.Add({{"node", n.node_id()}, {"card", card}, {"category", category}},
                static_cast<double>(bytes));
      }
      for (const auto& [category, bytes] : m.peak) {
        peak.Add(
            {{"node", n.node_id()}, {"card", card}, {"category", category}},
            static_cast<double>(bytes));
      }
      if (m.budget > 0) {
        budget.Add({{"node", n.node_id()}, {"card", card}},
                   static_cast<double>(m.budget));
      }
      act.Add({{"node", n.node_id()}, {"card", card}}, c.activity_seconds());
    }
  }
}

// Jobs by phase.
void AppendJobCounts(const v1::ClusterStatus& status, std::string& out) {
  std::map<std::string, int> by_phase;
  for (const char* p : kPhases) by_phase[p] = 0;
  for (const v1::JobStatus& j : status.jobs())
    ++by_phase[JobPhaseLabel(j.phase())];
  Family f(out, "fusionrl_jobs", "gauge", "Jobs by phase.");
  for (const auto& [phase, count] : by_phase) f.Add({{"phase", phase}}, count);
}

// Each job's name and placement, and its phase.
void AppendJobPhaseFamilies(const v1::ClusterStatus& status, std::string& out) {
  Family info(out, "fusionrl_job_info", "gauge",
              "A job's name and placement (always 1).");
  for (const v1::JobStatus& j : status.jobs()) {
    info.Add(
        {{"job", j.job_id()}, {"name", j.name()}, {"placement", j.placement()}},
        1);
  }
  Family phase(out, "fusionrl_job_phase", "gauge",
               "1 for the job's current phase, 0 for the others.");
  for (const v1::JobStatus& j : status.jobs()) {
    for (const char* p : kPhases) {
      phase.Add({{"job", j.job_id()}, {"phase", p}},
                JobPhaseLabel(j.phase()) == std::string(p) ? 1 : 0);
    }
  }
}

// One family per job gauge or counter, a sample per job that reports it.
void AppendJobGauges(const v1::ClusterStatus& status, std::string& out) {
  struct Gauge {
    const char* name;
    const char* type;
    const char* help;
    double (*get)(const v1::JobStatus&);
  };
  const Gauge gauges[] = {
      {"fusionrl_job_step", "gauge", "RL steps committed.",
       [](const v1::JobStatus& j) { return double(j.step()); }},
      {"fusionrl_job_total_steps", "gauge", "RL steps planned.",
       [](const v1::JobStatus& j) { return double(j.total_steps()); }},
      {"fusionrl_job_policy_version", "gauge",
       "Policy version of the newest weights.",
       [](const v1::JobStatus& j) { return double(j.policy_version()); }},
      {"fusionrl_job_tokens_per_second", "gauge",
       "Sampled response tokens per second of rollout and training.",
       [](const v1::JobStatus& j) { return j.tokens_per_second(); }},
      {"fusionrl_job_reward_mean", "gauge",
       "Mean reward of the last step's samples.",
       [](const v1::JobStatus& j) { return j.reward_mean(); }},
      {"fusionrl_job_train_accuracy", "gauge",
       "Accuracy of the last step's samples.",
       [](const v1::JobStatus& j) { return j.train_accuracy(); }},
      {"fusionrl_job_eval_accuracy", "gauge",
       "Latest greedy accuracy on the held-out split.",
       [](const v1::JobStatus& j) { return j.eval_accuracy(); }},
      {"fusionrl_job_initial_eval_accuracy", "gauge",
       "Greedy held-out accuracy before step 1.",
       [](const v1::JobStatus& j) { return j.initial_eval_accuracy(); }},
      {"fusionrl_job_max_staleness", "gauge",
       "Largest policy-version lag of a sample trained in the last step.",
       [](const v1::JobStatus& j) { return LastMetric(j, "max_staleness"); }},
      {"fusionrl_job_clock_skew_max_seen", "gauge",
       "StaleSync: largest difference of two super nodes' clocks seen.",
       [](const v1::JobStatus& j) { return double(j.max_clock_skew_seen()); }},
      {"fusionrl_job_clock_skew_limit", "gauge",
       "StaleSync: the job's max_clock_skew (0 = lock-step).",
       [](const v1::JobStatus& j) { return double(j.max_clock_skew()); }},
      {"fusionrl_job_rollout_tokens_total", "counter",
       "Response tokens sampled for training.",
       [](const v1::JobStatus& j) { return double(j.rollout_tokens()); }},
      {"fusionrl_job_groups_submitted_total", "counter",
       "Prompt groups handed out.",
       [](const v1::JobStatus& j) { return double(j.groups_submitted()); }},
      {"fusionrl_job_groups_trained_total", "counter",
       "Prompt groups trained on.",
       [](const v1::JobStatus& j) { return double(j.groups_trained()); }},
      {"fusionrl_job_groups_requeued_total", "counter",
       "Prompt groups re-queued after a lost node or an aborted step.",
       [](const v1::JobStatus& j) { return double(j.groups_requeued()); }},
      {"fusionrl_job_controller_tensor_bytes_total", "counter",
       "Tensor bytes of the job that went through the controller.",
       [](const v1::JobStatus& j) {
         return double(j.controller_tensor_bytes());
       }},
  };
  for (const Gauge& g : gauges) {
    Family f(out, g.name, g.type, g.help);
    for (const v1::JobStatus& j : status.jobs()) {
      const double v = g.get(j);
      if (std::isnan(v)) continue;  // not reported yet
      f.Add({{"job", j.job_id()}}, v);
    }
  }
}

// The controller's own RPCs: calls by code and the latency histogram.
void AppendRpcFamilies(const RpcStats::Snapshot& rpc, std::string& out) {
  Family calls(out, "fusionrl_rpc_requests_total", "counter",
               "RPCs the controller answered, by method and status code.");
  for (const auto& [method, m] : rpc) {
    for (const auto& [code, n] : m.calls_by_code) {
      calls.Add({{"method", method}, {"code", code}}, double(n));
    }
  }
  Family lat(out, "fusionrl_rpc_latency_seconds", "histogram",
             "Time from a call's arrival to its status, by method (long "
             "polls count their wait).");
  for (const auto& [method, m] : rpc) {
    int64_t cumulative = 0;
    for (size_t b = 0; b < m.buckets.size(); ++b) {
      cumulative += m.buckets[b];
      const std::string le = b < RpcStats::kLatencyBuckets.size()
                                 ? Number(RpcStats::kLatencyBuckets[b])
                                 : "+Inf";
      lat.Add({{"method", method}, {"le", le}}, double(cumulative), "_bucket");
    }
    lat.Add({{"method", method}}, m.latency_sum_seconds, "_sum");
    lat.Add({{"method", method}}, double(m.count), "_count");
  }
}

}  // namespace

std::string PrometheusText(const v1::ClusterStatus& status,
                           const RpcStats::Snapshot& rpc) {
  std::string out;
  AppendControllerFamilies(status, out);
  AppendNodeCounts(status, out);
  AppendNodeFamilies(status, out);
  AppendCardFamilies(status, out);
  AppendJobCounts(status, out);
  AppendJobPhaseFamilies(status, out);
  AppendJobGauges(status, out);
  AppendRpcFamilies(rpc, out);
  return out;
}

std::string StatusJson(const v1::ClusterStatus& status,
                       const std::map<std::string, JobCurves>& curves,
                       const std::string& controller_address) {
  using nlohmann::json;
  // NaN is not JSON: a missing value is null.
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(); };
  auto nums = [&num](const std::vector<double>& v) {
    json a = json::array();
    for (double x : v) a.push_back(num(x));
    return a;
  };
  json out;
  out["controller"] = {{"version", status.version()},
                       {"time_us", status.time_us()},
                       {"uptime_seconds", status.uptime_seconds()},
                       {"address", controller_address}};
  std::map<std::string, json> super_nodes;
  json nodes = json::array();
  for (const v1::NodeStatus& n : status.nodes()) {
    json& sn = super_nodes[n.super_node()];
    if (sn.is_null()) {
      sn = {{"super_node", n.super_node()},
            {"nodes", 0},
            {"cards", 0},
            {"alive", 0}};
    }
    sn["nodes"] = sn["nodes"].get<int>() + 1;
    sn["cards"] = sn["cards"].get<int>() + n.cards_size();
    if (n.state() == "alive") sn["alive"] = sn["alive"].get<int>() + 1;
    json cards = json::array();
    for (int i = 0; i < n.cards_size(); ++i) {
      const v1::CardState& c = n.cards(i);
      const CardMemory m = SplitMemory(c);
      json memory = json::object(), peak = json::object();
      for (const auto& [category, bytes] : m.current) memory[category] = bytes;
      for (const auto& [category, bytes] : m.peak) peak[category] = bytes;
      cards.push_back(
          {{"index", c.index()},
           {"device", i < n.card_specs_size() ? n.card_specs(i).device() : ""},
           {"role", CardRoleLabel(c.role())},
           {"busy_fraction", num(c.busy_fraction())},
           {"memory_bytes", memory},
           {"memory_peak_bytes", peak},
           {"memory_budget_bytes", m.budget > 0 ? json(m.budget) : json()},
           {"activity", c.activity()},
           {"activity_seconds", num(c.activity_seconds())}});
    }
    nodes.push_back({{"node_id", n.node_id()},
                     {"host", n.host()},
                     {"super_node", n.super_node()},
                     {"state", n.state()},
                     {"version", n.version()},
                     {"heartbeat_age_ms", n.heartbeat_age_ms()},
                     {"job_id", n.job_id()},
                     {"cards", cards}});
  }
  out["super_nodes"] = json::array();
  for (auto& [name, sn] : super_nodes) out["super_nodes"].push_back(sn);
  out["nodes"] = nodes;
  json jobs = json::array();
  static const JobCurves kNone;
  for (const v1::JobStatus& j : status.jobs()) {
    auto it = curves.find(j.job_id());
    const JobCurves& c = it == curves.end() ? kNone : it->second;
    json clocks = json::array();
    if (j.max_clock_skew() > 0) {
      for (const v1::NodeStatus& n : j.nodes()) {
        clocks.push_back({{"super_node", n.super_node()},
                          {"node_id", n.node_id()},
                          {"clock", n.clock()}});
      }
    }
    json events = json::array();
    const int first = std::max(0, j.events_size() - 50);
    for (int e = first; e < j.events_size(); ++e) {
      events.push_back(
          {{"time_us", j.events(e).time_us()}, {"text", j.events(e).text()}});
    }
    jobs.push_back({{"job_id", j.job_id()},
                    {"name", j.name()},
                    {"phase", JobPhaseLabel(j.phase())},
                    {"message", j.message()},
                    {"placement", j.placement()},
                    {"step", j.step()},
                    {"total_steps", j.total_steps()},
                    {"policy_version", j.policy_version()},
                    {"reward_mean", num(j.reward_mean())},
                    {"train_accuracy", num(j.train_accuracy())},
                    {"initial_eval_accuracy", num(j.initial_eval_accuracy())},
                    {"eval_accuracy", num(j.eval_accuracy())},
                    {"rollout_tokens", j.rollout_tokens()},
                    {"tokens_per_second", num(j.tokens_per_second())},
                    {"groups_submitted", j.groups_submitted()},
                    {"groups_trained", j.groups_trained()},
                    {"groups_requeued", j.groups_requeued()},
                    {"max_clock_skew", j.max_clock_skew()},
                    {"max_clock_skew_seen", j.max_clock_skew_seen()},
                    {"submitted_at_us", j.submitted_at_us()},
                    {"updated_at_us", j.updated_at_us()},
                    {"clocks", clocks},
                    {"history",
                     {{"step", c.step},
                      {"reward_mean", nums(c.reward_mean)},
                      {"train_accuracy", nums(c.train_accuracy)},
                      {"tokens_per_second", nums(c.tokens_per_second)},
                      {"max_staleness", nums(c.max_staleness)},
                      {"eval_step", c.eval_step},
                      {"eval_accuracy", nums(c.eval_accuracy)}}},
                    {"events", events}});
  }
  out["jobs"] = jobs;
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace fusionrl
