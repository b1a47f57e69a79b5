#include "fusionrl/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/hf_config.h"

namespace fusionrl {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------
// Field rules. Each field is bound once, with its rule, in VisitJob(); the
// reader and the emitter ignore the rules, the validator applies them.

// The interval a number must lie in; the bounds are inclusive unless open.
struct NumRule {
  double lo = -kInf;
  double hi = kInf;
  bool lo_open = false;
  bool hi_open = false;
};

NumRule AtLeast(double lo) { return {lo, kInf, false, false}; }
NumRule Above(double lo) { return {lo, kInf, true, false}; }
NumRule Closed(double lo, double hi) { return {lo, hi, false, false}; }
NumRule ClosedOpen(double lo, double hi) { return {lo, hi, false, true}; }
NumRule OpenClosed(double lo, double hi) { return {lo, hi, true, false}; }

struct StrRule {
  bool non_empty = false;
  bool device = false;         // ^(cpu|cuda(:[0-9]+)?|mps)$
  bool existing_file = false;  // must name an existing path when non-empty
  absl::Span<const absl::string_view> one_of;  // empty = anything
};

StrRule AnyString() { return {}; }
StrRule NonEmpty() { return {true, false, false, {}}; }
StrRule Device() { return {true, true, false, {}}; }
StrRule ExistingFile() { return {false, false, true, {}}; }
StrRule OneOf(absl::Span<const absl::string_view> values) {
  return {false, false, false, values};
}

constexpr absl::string_view kAdvEstimators[] = {"grpo", "rloo", "reinforce_pp"};
constexpr absl::string_view kLossAggModes[] = {
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
    "seq-mean-token-sum-norm"};
constexpr absl::string_view kKlEstimators[] = {"k1", "k2", "k3"};
constexpr absl::string_view kKlModes[] = {"loss", "reward"};
constexpr absl::string_view kBehaviourWeightLevels[] = {"token", "sequence"};
constexpr absl::string_view kPlacementModes[] = {"colocated-sync",
                                                 "disaggregated", "fused"};
constexpr absl::string_view kOverStalePolicies[] = {"regenerate", "drop"};
constexpr absl::string_view kOffloadPolicies[] = {"never", "auto"};
// 2^40 MiB = 1 EiB: any real budget, and its bytes still fit in int64.
constexpr double kMaxCardBudgetMib = 1099511627776.0;

// ---------------------------------------------------------------------------
// The schema: every key of JobConfig, in file order. `V` is one of Reader,
// Emitter, Validator below. Sections call v.Section(key, body).

template <class V>
void VisitActivations(ActivationConfig& a, V& v) {
  static constexpr absl::string_view kPolicies[] = {"keep", "recompute", "swap",
                                                    "auto"};
  v.String("policy", &a.policy, OneOf(kPolicies));
  // "" or an action; checked with a clear message in CheckCrossField.
  v.String("attention", &a.attention, AnyString());
  v.String("mlp", &a.mlp, AnyString());
  v.String("norm", &a.norm, AnyString());
  v.String("layers", &a.layers, AnyString());
  v.Double("budget_mib", &a.budget_mib, AtLeast(0));
}

template <class V>
void VisitRopeScaling(RopeScalingConfig& r, V& v) {
  static constexpr absl::string_view kTypes[] = {"none", "linear", "llama3"};
  v.String("type", &r.type, OneOf(kTypes));
  v.Double("factor", &r.factor, Above(0));
  v.Double("low_freq_factor", &r.low_freq_factor, Above(0));
  v.Double("high_freq_factor", &r.high_freq_factor, Above(0));
  v.Int("original_max_position_embeddings", &r.original_max_position_embeddings,
        AtLeast(1));
}

template <class V>
void VisitModel(ModelConfig& m, V& v) {
  static constexpr absl::string_view kArchitectures[] = {
      "", "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
      "MistralForCausalLM"};
  static constexpr absl::string_view kDtypes[] = {"float32", "bfloat16"};
  v.String("hf_path", &m.hf_path, ExistingFile());
  v.String("architecture", &m.architecture, OneOf(kArchitectures));
  v.String("tokenizer", &m.tokenizer, ExistingFile());
  v.String("dtype", &m.dtype, OneOf(kDtypes));
  v.Int("vocab_size", &m.vocab_size, AtLeast(0));
  v.Int("d_model", &m.d_model, AtLeast(8));
  v.Int("n_layers", &m.n_layers, AtLeast(1));
  v.Int("n_heads", &m.n_heads, AtLeast(1));
  v.Int("n_kv_heads", &m.n_kv_heads, AtLeast(0));
  v.Int("head_dim", &m.head_dim, AtLeast(0));
  v.Int("d_ff", &m.d_ff, AtLeast(1));
  v.Int("max_seq_len", &m.max_seq_len, AtLeast(2));
  v.Double("rope_theta", &m.rope_theta, Above(0));
  v.Section("rope_scaling", [&] { VisitRopeScaling(m.rope_scaling, v); });
  v.Double("norm_eps", &m.norm_eps, Above(0));
  v.Bool("qkv_bias", &m.qkv_bias);
  v.Bool("qk_norm", &m.qk_norm);
  v.Bool("tie_embeddings", &m.tie_embeddings);
  v.Double("init_std", &m.init_std, Above(0));
  v.Int("moe_experts", &m.moe_experts, Closed(0, 64));
  v.Int("moe_top_k", &m.moe_top_k, Closed(1, 2));
  v.Double("moe_capacity_factor", &m.moe_capacity_factor, AtLeast(0));
  v.Double("moe_aux_loss_coef", &m.moe_aux_loss_coef, AtLeast(0));
  v.Double("moe_z_loss_coef", &m.moe_z_loss_coef, AtLeast(0));
  v.Bool("moe_shared_expert", &m.moe_shared_expert);
  v.Int("moe_d_ff", &m.moe_d_ff, AtLeast(0));
  v.Section("activations", [&] { VisitActivations(m.activations, v); });
}

template <class V>
void VisitTask(TaskConfig& t, V& v) {
  v.String("name", &t.name, NonEmpty());
  v.Int64("seed", &t.seed, NumRule());
  v.Int("eval_size", &t.eval_size, AtLeast(1));
  v.Int("min_digits", &t.min_digits, Closed(1, 18));
  v.Int("max_digits", &t.max_digits, Closed(1, 18));
  v.Int("num_operands", &t.num_operands, Closed(2, 6));
  v.Int("max_operand", &t.max_operand, Closed(1, 1000));
  v.Double("long_fraction", &t.long_fraction, Closed(0, 1));
  v.Int("long_max", &t.long_max, Closed(1, 500));
  v.String("train_path", &t.train_path, ExistingFile());
  v.String("eval_path", &t.eval_path, ExistingFile());
  v.String("reward", &t.reward, AnyString());
  // "" (auto) or a format; checked with a clear message in CheckCrossField.
  v.String("chat_template", &t.chat_template, AnyString());
  v.String("system_prompt", &t.system_prompt, AnyString());
}

template <class V>
void VisitRollout(RolloutConfig& r, V& v) {
  v.Int("prompts_per_step", &r.prompts_per_step, AtLeast(1));
  v.Int("group_size", &r.group_size, AtLeast(1));
  v.Int("max_new_tokens", &r.max_new_tokens, AtLeast(1));
  v.Double("temperature", &r.temperature, AtLeast(0));
  v.Int("top_k", &r.top_k, AtLeast(0));
  v.Double("top_p", &r.top_p, OpenClosed(0, 1));
}

template <class V>
void VisitAlgorithm(AlgorithmConfig& a, V& v) {
  v.String("adv_estimator", &a.adv_estimator, OneOf(kAdvEstimators));
  v.Bool("norm_adv_by_std", &a.norm_adv_by_std);
  v.Double("gamma", &a.gamma, Closed(0, 1));
  v.Double("clip_ratio_low", &a.clip_ratio_low, ClosedOpen(0, 1));
  v.Double("clip_ratio_high", &a.clip_ratio_high, AtLeast(0));
  v.Double("clip_ratio_c", &a.clip_ratio_c, AtLeast(0));
  v.String("loss_agg_mode", &a.loss_agg_mode, OneOf(kLossAggModes));
  v.Double("kl_coef", &a.kl_coef, AtLeast(0));
  v.String("kl_estimator", &a.kl_estimator, OneOf(kKlEstimators));
  v.String("kl_mode", &a.kl_mode, OneOf(kKlModes));
  v.Double("entropy_coef", &a.entropy_coef, AtLeast(0));
  v.Int("ppo_epochs", &a.ppo_epochs, AtLeast(1));
  v.Bool("decoupled_loss", &a.decoupled_loss);
  v.Double("behaviour_weight_cap", &a.behaviour_weight_cap, AtLeast(1));
  v.String("behaviour_weight_level", &a.behaviour_weight_level,
           OneOf(kBehaviourWeightLevels));
}

template <class V>
void VisitOptim(OptimConfig& o, V& v) {
  v.Double("lr", &o.lr, Above(0));
  v.Double("weight_decay", &o.weight_decay, AtLeast(0));
  v.Double("beta1", &o.beta1, ClosedOpen(0, 1));
  v.Double("beta2", &o.beta2, ClosedOpen(0, 1));
  v.Double("eps", &o.eps, Above(0));
  v.Double("grad_clip", &o.grad_clip, AtLeast(0));
  v.Int("warmup_steps", &o.warmup_steps, AtLeast(0));
  v.Int("mini_batch_size", &o.mini_batch_size, AtLeast(0));
  v.Int("micro_batch_size", &o.micro_batch_size, AtLeast(1));
  v.Int("logits_chunk_tokens", &o.logits_chunk_tokens, AtLeast(0));
}

template <class V>
void VisitRun(RunConfig& r, V& v) {
  v.Int("total_steps", &r.total_steps, AtLeast(1));
  v.Int("eval_every", &r.eval_every, AtLeast(0));
  v.Int("checkpoint_every", &r.checkpoint_every, AtLeast(0));
  v.Int("log_every", &r.log_every, AtLeast(1));
  v.Double("collective_timeout_seconds", &r.collective_timeout_seconds,
           Above(0));
  static constexpr absl::string_view kExportDtypes[] = {"float32", "bfloat16"};
  v.Bool("export_final", &r.export_final);
  v.String("export_dtype", &r.export_dtype, OneOf(kExportDtypes));
}

template <class V>
void VisitSft(SftConfig& s, V& v) {
  v.Int("steps", &s.steps, AtLeast(0));
  v.Int("batch_size", &s.batch_size, AtLeast(1));
  v.Double("lr", &s.lr, Above(0));
  v.Int("warmup_steps", &s.warmup_steps, AtLeast(0));
  v.Int("eval_every", &s.eval_every, AtLeast(0));
}

template <class V>
void VisitPlacement(PlacementConfig& p, V& v) {
  v.String("mode", &p.mode, OneOf(kPlacementModes));
  v.Int("super_nodes", &p.super_nodes, Closed(1, 4096));
  v.Int("cards_per_super_node", &p.cards_per_super_node, Closed(1, 4096));
  v.Int("rollout_cards_per_super_node", &p.rollout_cards_per_super_node,
        AtLeast(0));
  v.Int("fused_train_threads", &p.fused_train_threads, Closed(0, 1024));
  v.Int("fused_rollout_threads", &p.fused_rollout_threads, Closed(0, 1024));
  v.Bool("fused_share_idle_threads", &p.fused_share_idle_threads);
  v.Bool("fail_if_unplaceable", &p.fail_if_unplaceable);
}

template <class V>
void VisitStaleSync(StaleSyncConfig& c, V& v) {
  v.Int("max_policy_lag", &c.max_policy_lag, Closed(0, 1024));
  v.String("over_stale", &c.over_stale, OneOf(kOverStalePolicies));
  v.Int("max_clock_skew", &c.max_clock_skew, Closed(0, 1024));
}

template <class V>
void VisitMemory(MemoryConfig& m, V& v) {
  v.Double("card_budget_mib", &m.card_budget_mib, Closed(0, kMaxCardBudgetMib));
  v.String("offload_optimizer", &m.offload_optimizer, OneOf(kOffloadPolicies));
}

template <class V>
void VisitCluster(ClusterConfig& c, V& v) {
  v.String("auth_token_file", &c.auth_token_file, AnyString());
  v.String("auth_token_env", &c.auth_token_env, AnyString());
}

// `source_path` is deliberately not a key.
template <class V>
void VisitJob(JobConfig& c, V& v) {
  v.String("name", &c.name, NonEmpty());
  v.Int64("seed", &c.seed, AtLeast(0));
  v.String("device", &c.device, Device());
  v.Int("num_threads", &c.num_threads, Closed(1, 1024));
  v.String("output_dir", &c.output_dir, NonEmpty());
  v.String("init_checkpoint", &c.init_checkpoint, ExistingFile());
  v.Section("model", [&] { VisitModel(c.model, v); });
  v.Section("task", [&] { VisitTask(c.task, v); });
  v.Section("rollout", [&] { VisitRollout(c.rollout, v); });
  v.Section("algorithm", [&] { VisitAlgorithm(c.algorithm, v); });
  v.Section("optim", [&] { VisitOptim(c.optim, v); });
  v.Section("run", [&] { VisitRun(c.run, v); });
  v.Section("sft", [&] { VisitSft(c.sft, v); });
  v.Section("placement", [&] { VisitPlacement(c.placement, v); });
  v.Section("stalesync", [&] { VisitStaleSync(c.stalesync, v); });
  v.Section("memory", [&] { VisitMemory(c.memory, v); });
  v.Section("cluster", [&] { VisitCluster(c.cluster, v); });
}

// ---------------------------------------------------------------------------
// Helpers.

// The first error found; formatted into a one-line status by FormatError.
struct FieldError {
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  std::string path;    // "rollout.top_p"; "" = the whole document
  std::string reason;  // "must be in (0, 1], got 1.5"
};

FieldError Invalid(std::string path, std::string reason) {
  return {absl::StatusCode::kInvalidArgument, std::move(path),
          std::move(reason)};
}

absl::Status FormatError(absl::string_view source, const FieldError& e) {
  std::vector<absl::string_view> parts;
  for (absl::string_view p : {source, absl::string_view(e.path)}) {
    if (!p.empty()) parts.push_back(p);
  }
  parts.push_back(e.reason);
  return absl::Status(e.code, absl::StrJoin(parts, ": "));
}

// Shortest text that parses back to exactly `v` (0.2 -> "0.2").
std::string FormatDouble(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return absl::StrCat(v);
  return std::string(buf, end);
}

// Optimal string alignment distance (Levenshtein plus adjacent swaps).
int EditDistance(absl::string_view a, absl::string_view b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string UnknownKeyReason(absl::string_view key,
                             const std::vector<std::string>& known) {
  const std::string* best = nullptr;
  int best_distance = std::numeric_limits<int>::max();
  for (const std::string& k : known) {
    const int distance = EditDistance(key, k);
    if (distance < best_distance) {
      best = &k;
      best_distance = distance;
    }
  }
  // A suggestion that rewrites the whole key is noise ("foo" -> "eps").
  if (best != nullptr && best_distance <= 3 &&
      best_distance < static_cast<int>(key.size())) {
    return absl::StrCat("unknown key (did you mean '", *best, "'?)");
  }
  return absl::StrCat("unknown key (known keys: ", absl::StrJoin(known, ", "),
                      ")");
}

// What a node is, for "expected X, got Y" messages.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return absl::StrCat("'", node.Scalar(), "'");
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "an empty value";
  }
}

bool IsDevice(absl::string_view s) {
  if (s == "cpu" || s == "mps" || s == "cuda") return true;
  if (!absl::ConsumePrefix(&s, "cuda:") || s.empty()) return false;
  return std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
}

// ---------------------------------------------------------------------------
// Reader: copies the keys present in a YAML map tree into a JobConfig,
// leaving the other fields untouched, and reports the first type error,
// unknown key or duplicate key.

class Reader {
 public:
  // REQUIRES: `root` is a map.
  explicit Reader(const YAML::Node& root) { Enter(root, ""); }

  // Checks the root map for unknown keys; call after VisitJob.
  void Finish() { Leave(); }

  const std::optional<FieldError>& error() const { return error_; }

  void Int(const char* key, int* out, const NumRule&) {
    int64_t v;
    if (ReadInteger(key, &v)) {
      if (v < std::numeric_limits<int>::min() ||
          v > std::numeric_limits<int>::max()) {
        Fail(key, absl::StrCat("integer out of range, got ", v));
        return;
      }
      *out = static_cast<int>(v);
    }
  }

  void Int64(const char* key, int64_t* out, const NumRule&) {
    ReadInteger(key, out);
  }

  void Double(const char* key, double* out, const NumRule&) {
    const YAML::Node* node = Find(key);
    if (node == nullptr) return;
    double v;
    const std::string lower = absl::AsciiStrToLower(node->Scalar());
    if (lower == ".inf" || lower == "+.inf" || lower == "-.inf" ||
        lower == ".nan") {  // YAML spellings
      v = std::numeric_limits<double>::quiet_NaN();
    } else if (!node->IsScalar() || !absl::SimpleAtod(node->Scalar(), &v)) {
      Fail(key, absl::StrCat("expected a number, got ", Describe(*node)));
      return;
    }
    if (!std::isfinite(v)) {
      Fail(key,
           absl::StrCat("expected a finite number, got ", Describe(*node)));
    } else {
      *out = v;
    }
  }

  void Bool(const char* key, bool* out) {
    const YAML::Node* node = Find(key);
    if (node == nullptr) return;
    const std::string s = node->IsScalar() ? node->Scalar() : "";
    if (s == "true" || s == "True" || s == "TRUE") {
      *out = true;
    } else if (s == "false" || s == "False" || s == "FALSE") {
      *out = false;
    } else {
      Fail(key, absl::StrCat("expected true or false, got ", Describe(*node)));
    }
  }

  void String(const char* key, std::string* out, const StrRule&) {
    const YAML::Node* node = Find(key);
    if (node == nullptr) return;
    if (node->IsScalar()) {
      *out = node->Scalar();
    } else if (node->IsNull()) {  // "key:", "key: ~"
      out->clear();
    } else {
      Fail(key, absl::StrCat("expected a string, got ", Describe(*node)));
    }
  }

  template <class Body>
  void Section(const char* key, Body body) {
    const YAML::Node* node = Find(key);
    if (node == nullptr || node->IsNull()) return;  // "model:" = defaults
    if (!node->IsMap()) {
      Fail(key, absl::StrCat("expected a map, got ", Describe(*node)));
      return;
    }
    Enter(*node, absl::StrCat(frames_.back().prefix, key, "."));
    body();
    Leave();
  }

 private:
  struct Frame {
    std::string prefix;  // "" or "model."
    std::vector<std::pair<std::string, YAML::Node>> entries;
    std::vector<bool> used;
    std::vector<std::string> known;  // keys the schema asked for
  };

  void Enter(const YAML::Node& map, std::string prefix) {
    Frame frame;
    frame.prefix = std::move(prefix);
    for (auto it = map.begin(); it != map.end() && !error_; ++it) {
      if (!it->first.IsScalar()) {
        absl::string_view path = frame.prefix;
        absl::ConsumeSuffix(&path, ".");
        error_ = Invalid(
            std::string(path),
            absl::StrCat("keys must be strings, got ", Describe(it->first)));
        break;
      }
      const std::string& key = it->first.Scalar();
      for (const auto& entry : frame.entries) {
        if (entry.first == key) {
          error_ = Invalid(absl::StrCat(frame.prefix, key), "duplicate key");
        }
      }
      frame.entries.emplace_back(key, it->second);
    }
    frame.used.assign(frame.entries.size(), false);
    frames_.push_back(std::move(frame));
  }

  void Leave() {
    const Frame& frame = frames_.back();
    for (size_t i = 0; i < frame.entries.size() && !error_; ++i) {
      if (!frame.used[i]) {
        Fail(frame.entries[i].first,
             UnknownKeyReason(frame.entries[i].first, frame.known));
      }
    }
    frames_.pop_back();
  }

  // The value of `key` in the current map, or null if absent (or if an error
  // was already found). Records `key` as known.
  const YAML::Node* Find(const char* key) {
    Frame& frame = frames_.back();
    frame.known.emplace_back(key);
    if (error_) return nullptr;
    for (size_t i = 0; i < frame.entries.size(); ++i) {
      if (frame.entries[i].first == key) {
        frame.used[i] = true;
        return &frame.entries[i].second;
      }
    }
    return nullptr;
  }

  bool ReadInteger(const char* key, int64_t* out) {
    const YAML::Node* node = Find(key);
    if (node == nullptr) return false;
    if (!node->IsScalar() || !absl::SimpleAtoi(node->Scalar(), out)) {
      Fail(key, absl::StrCat("expected an integer, got ", Describe(*node)));
      return false;
    }
    return true;
  }

  void Fail(absl::string_view key, std::string reason) {
    if (!error_) {
      error_ =
          Invalid(absl::StrCat(frames_.back().prefix, key), std::move(reason));
    }
  }

  std::vector<Frame> frames_;
  std::optional<FieldError> error_;
};

// ---------------------------------------------------------------------------
// Emitter: writes every key as YAML.

class Emitter {
 public:
  Emitter() { out_ << YAML::BeginMap; }

  std::string Finish() {
    out_ << YAML::EndMap;
    return absl::StrCat(out_.c_str(), "\n");
  }

  void Int(const char* key, int* v, const NumRule&) { Put(key, *v); }
  void Int64(const char* key, int64_t* v, const NumRule&) { Put(key, *v); }
  void Double(const char* key, double* v, const NumRule&) {
    std::string text = FormatDouble(*v);
    // "1.0", not "1": a reader sees the field is a float.
    if (text.find_first_not_of("-0123456789") == std::string::npos) {
      text += ".0";
    }
    Put(key, text);
  }
  void Bool(const char* key, bool* v) { Put(key, *v); }
  void String(const char* key, std::string* v, const StrRule&) { Put(key, *v); }

  template <class Body>
  void Section(const char* key, Body body) {
    out_ << YAML::Key << key << YAML::Value << YAML::BeginMap;
    body();
    out_ << YAML::EndMap;
  }

 private:
  template <class T>
  void Put(const char* key, const T& value) {
    out_ << YAML::Key << key << YAML::Value << value;
  }

  YAML::Emitter out_;
};

// ---------------------------------------------------------------------------
// Validator: applies the per-field rules, stopping at the first error.

class Validator {
 public:
  const std::optional<FieldError>& error() const { return error_; }

  void Int(const char* key, int* v, const NumRule& r) {
    CheckNumber(key, *v, absl::StrCat(*v), r);
  }
  void Int64(const char* key, int64_t* v, const NumRule& r) {
    CheckNumber(key, static_cast<double>(*v), absl::StrCat(*v), r);
  }
  void Double(const char* key, double* v, const NumRule& r) {
    CheckNumber(key, *v, FormatDouble(*v), r);
  }
  void Bool(const char*, bool*) {}

  void String(const char* key, std::string* v, const StrRule& r) {
    if (error_) return;
    if (r.non_empty && v->empty()) {
      Fail(key, "must not be empty");
    } else if (r.device && !IsDevice(*v)) {
      Fail(key, absl::StrCat("must be cpu, cuda, cuda:<index> or mps; got '",
                             *v, "'"));
    } else if (!r.one_of.empty() && std::find(r.one_of.begin(), r.one_of.end(),
                                              *v) == r.one_of.end()) {
      Fail(key, absl::StrCat("must be one of ", absl::StrJoin(r.one_of, ", "),
                             "; got '", *v, "'"));
    } else if (r.existing_file && !v->empty()) {
      std::error_code ec;
      if (!std::filesystem::exists(*v, ec)) {
        Fail(key, absl::StrCat("file not found: '", *v, "'"));
        error_->code = absl::StatusCode::kNotFound;
      }
    }
  }

  template <class Body>
  void Section(const char* key, Body body) {
    const std::string saved = prefix_;
    prefix_ = absl::StrCat(prefix_, key, ".");
    body();
    prefix_ = saved;
  }

 private:
  void CheckNumber(const char* key, double v, const std::string& text,
                   const NumRule& r) {
    if (error_) return;
    // Written so that NaN fails.
    const bool ok = (r.lo_open ? v > r.lo : v >= r.lo) &&
                    (r.hi_open ? v < r.hi : v <= r.hi);
    if (ok) return;
    std::string want;
    if (r.hi == kInf) {
      want = absl::StrCat(r.lo_open ? "> " : ">= ", FormatDouble(r.lo));
    } else {
      want = absl::StrCat("in ", r.lo_open ? "(" : "[", FormatDouble(r.lo),
                          ", ", FormatDouble(r.hi), r.hi_open ? ")" : "]");
    }
    Fail(key, absl::StrCat("must be ", want, ", got ", text));
  }

  void Fail(const char* key, std::string reason) {
    error_ = Invalid(absl::StrCat(prefix_, key), std::move(reason));
  }

  std::string prefix_;
  std::optional<FieldError> error_;
};

// Checks that involve more than one field. Runs after the per-field rules,
// so single fields are already in range (e.g. n_heads >= 1).
std::optional<FieldError> CheckCrossField(const JobConfig& c) {
  const ModelConfig& m = c.model;
  if (m.head_dim == 0) {
    if (m.d_model % m.n_heads != 0) {
      return Invalid("model.d_model",
                     absl::StrCat("must be divisible by model.n_heads (",
                                  m.n_heads, "), got ", m.d_model));
    }
    if ((m.d_model / m.n_heads) % 2 != 0) {
      return Invalid(
          "model.d_model",
          absl::StrCat("head size model.d_model / model.n_heads must be even "
                       "for rotary embeddings, got ",
                       m.d_model, " / ", m.n_heads, " = ",
                       m.d_model / m.n_heads));
    }
  } else if (m.head_dim % 2 != 0) {
    return Invalid(
        "model.head_dim",
        absl::StrCat("must be even for rotary embeddings, got ", m.head_dim));
  }
  if (m.n_kv_heads > 0 && m.n_heads % m.n_kv_heads != 0) {
    return Invalid(
        "model.n_kv_heads",
        absl::StrCat("model.n_heads (", m.n_heads,
                     ") must be a multiple of it, got ", m.n_kv_heads));
  }
  if (m.rope_scaling.type == "llama3" &&
      m.rope_scaling.high_freq_factor <= m.rope_scaling.low_freq_factor) {
    return Invalid("model.rope_scaling.high_freq_factor",
                   "must be > model.rope_scaling.low_freq_factor");
  }
  {
    const bool qwen2 = m.architecture == "Qwen2ForCausalLM";
    const bool qwen3 = m.architecture == "Qwen3ForCausalLM";
    if (!m.architecture.empty() && m.qkv_bias != qwen2) {
      return Invalid("model.qkv_bias",
                     absl::StrCat("must be ", qwen2 ? "true" : "false",
                                  " for model.architecture ", m.architecture));
    }
    if (!m.architecture.empty() && m.qk_norm != qwen3) {
      return Invalid("model.qk_norm",
                     absl::StrCat("must be ", qwen3 ? "true" : "false",
                                  " for model.architecture ", m.architecture));
    }
  }
  if (!m.hf_path.empty() && m.moe_experts > 0) {
    return Invalid("model.moe_experts",
                   "must be 0 with model.hf_path (imported models are "
                   "dense)");
  }
  if (m.moe_experts > 0 && m.moe_top_k > m.moe_experts) {
    return Invalid("model.moe_top_k",
                   absl::StrCat("must be <= model.moe_experts (", m.moe_experts,
                                "), got ", m.moe_top_k));
  }
  if (m.moe_experts == 1) {
    return Invalid("model.moe_experts",
                   "must be 0 (dense) or in [2, 64], got 1");
  }
  const ActivationConfig& act = m.activations;
  if (act.policy == "auto" && act.budget_mib <= 0) {
    return Invalid("model.activations.budget_mib",
                   "must be > 0 when model.activations.policy is auto");
  }
  for (const auto& [key, value] :
       {std::pair<const char*, const std::string*>{"attention", &act.attention},
        {"mlp", &act.mlp},
        {"norm", &act.norm}}) {
    if (!value->empty() && *value != "keep" && *value != "recompute" &&
        *value != "swap") {
      return Invalid(absl::StrCat("model.activations.", key),
                     absl::StrCat("must be keep, recompute or swap (empty = "
                                  "model.activations.policy); got '",
                                  *value, "'"));
    }
  }
  if (act.policy == "auto" && !(act.attention.empty() && act.mlp.empty() &&
                                act.norm.empty() && act.layers.empty())) {
    return Invalid("model.activations",
                   "under policy auto the planner chooses every sub-block: "
                   "leave attention, mlp, norm and layers unset");
  }
  if (act.policy != "auto") {
    auto plan = ResolveActivationPlan(act, m.n_layers);
    if (!plan.ok()) {
      return Invalid("model.activations.layers",
                     std::string(plan.status().message()));
    }
  }
  if (c.task.max_digits < c.task.min_digits) {
    return Invalid(
        "task.max_digits",
        absl::StrCat("must be >= task.min_digits (", c.task.min_digits,
                     "), got ", c.task.max_digits));
  }
  if ((c.task.name == "jsonl" || c.task.name == "math") &&
      c.task.train_path.empty()) {
    return Invalid("task.train_path",
                   absl::StrCat("required when task.name is ", c.task.name));
  }
  {
    const std::string& t = c.task.chat_template;
    if (!t.empty() && t != "chatml" && t != "llama3" && t != "none") {
      return Invalid("task.chat_template",
                     absl::StrCat("must be chatml, llama3 or none (empty = "
                                  "auto, from the model's "
                                  "tokenizer_config.json); got '",
                                  t, "'"));
    }
  }
  if (c.algorithm.adv_estimator == "rloo" && c.rollout.group_size < 2) {
    return Invalid("rollout.group_size",
                   absl::StrCat("must be >= 2 when algorithm.adv_estimator is "
                                "rloo, got ",
                                c.rollout.group_size));
  }
  if (c.rollout.max_new_tokens >= m.max_seq_len) {
    return Invalid("rollout.max_new_tokens",
                   absl::StrCat("must be < model.max_seq_len (", m.max_seq_len,
                                "), got ", c.rollout.max_new_tokens));
  }
  const PlacementConfig& p = c.placement;
  if (p.mode == "disaggregated") {
    if (p.cards_per_super_node < 2) {
      return Invalid(
          "placement.cards_per_super_node",
          absl::StrCat("must be >= 2 when placement.mode is disaggregated "
                       "(at least one rollout and one train card), got ",
                       p.cards_per_super_node));
    }
    if (p.rollout_cards_per_super_node < 1 ||
        p.rollout_cards_per_super_node > p.cards_per_super_node - 1) {
      return Invalid(
          "placement.rollout_cards_per_super_node",
          absl::StrCat("disaggregated needs 1..cards_per_super_node-1 "
                       "rollout cards, got ",
                       p.rollout_cards_per_super_node));
    }
  } else if (p.rollout_cards_per_super_node != 0) {
    return Invalid("placement.rollout_cards_per_super_node",
                   absl::StrCat("must be 0 unless placement.mode is "
                                "disaggregated, got ",
                                p.rollout_cards_per_super_node));
  }
  return std::nullopt;
}

std::optional<FieldError> Validate(const JobConfig& config) {
  JobConfig copy = config;
  Validator validator;
  VisitJob(copy, validator);
  if (validator.error()) return validator.error();
  return CheckCrossField(config);
}

// Reads the keys present in `root` (a map) into `config`.
std::optional<FieldError> ReadInto(const YAML::Node& root, JobConfig& config) {
  Reader reader(root);
  VisitJob(config, reader);
  reader.Finish();
  return reader.error();
}

struct Override {
  std::string text;  // as given, for messages
  std::string path;  // "rollout.temperature"
  YAML::Node tree;   // {rollout: {temperature: 0.7}}
};

absl::StatusOr<Override> ParseOverride(const std::string& text) {
  const std::string source = absl::StrCat("--set ", text);
  const size_t eq = text.find('=');
  Override o;
  o.text = text;
  o.path = std::string(
      absl::StripAsciiWhitespace(absl::string_view(text).substr(0, eq)));
  const std::vector<std::string> parts = absl::StrSplit(o.path, '.');
  if (eq == std::string::npos ||
      std::any_of(parts.begin(), parts.end(),
                  [](const std::string& p) { return p.empty(); })) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected key.path=value"));
  }
  try {
    o.tree = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid YAML value: ", e.msg));
  }
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    YAML::Node map(YAML::NodeType::Map);
    map[*it] = o.tree;
    o.tree.reset(map);
  }
  return o;
}

// With model.hf_path: the [arch] keys come from the directory's
// config.json. A key still at its default takes the imported value; a key
// set to the imported value is fine (a resolved config.yaml reads back); any
// other value is an error naming both.
std::optional<FieldError> ApplyHfArchitecture(ModelConfig& m) {
  // A missing directory is reported by the field rule (NotFound).
  if (m.hf_path.empty() || !std::filesystem::exists(m.hf_path)) {
    return std::nullopt;
  }
  absl::StatusOr<HfModelInfo> info = ReadHfModelConfig(m.hf_path);
  if (!info.ok()) {
    FieldError e =
        Invalid("model.hf_path", std::string(info.status().message()));
    e.code = info.status().code() == absl::StatusCode::kNotFound
                 ? absl::StatusCode::kNotFound
                 : absl::StatusCode::kInvalidArgument;
    return e;
  }
  const ModelConfig& hf = info->model;
  const ModelConfig def;
  std::optional<FieldError> error;
  auto take = [&](const char* key, auto ModelConfig::*field) {
    if (error) return;
    if (m.*field != def.*field && m.*field != hf.*field) {
      std::ostringstream set, imported;
      set << m.*field;
      imported << hf.*field;
      error = Invalid(absl::StrCat("model.", key),
                      absl::StrCat("is ", set.str(),
                                   " but model.hf_path's config.json "
                                   "gives ",
                                   imported.str(),
                                   "; leave the architecture keys unset with "
                                   "model.hf_path"));
      return;
    }
    m.*field = hf.*field;
  };
  take("architecture", &ModelConfig::architecture);
  take("vocab_size", &ModelConfig::vocab_size);
  take("d_model", &ModelConfig::d_model);
  take("n_layers", &ModelConfig::n_layers);
  take("n_heads", &ModelConfig::n_heads);
  take("n_kv_heads", &ModelConfig::n_kv_heads);
  take("head_dim", &ModelConfig::head_dim);
  take("d_ff", &ModelConfig::d_ff);
  take("rope_theta", &ModelConfig::rope_theta);
  take("norm_eps", &ModelConfig::norm_eps);
  take("qkv_bias", &ModelConfig::qkv_bias);
  take("qk_norm", &ModelConfig::qk_norm);
  take("tie_embeddings", &ModelConfig::tie_embeddings);
  if (error) return error;
  const RopeScalingConfig& r = m.rope_scaling;
  const RopeScalingConfig rdef;
  const bool rope_default = r.type == rdef.type && r.factor == rdef.factor &&
                            r.low_freq_factor == rdef.low_freq_factor &&
                            r.high_freq_factor == rdef.high_freq_factor &&
                            r.original_max_position_embeddings ==
                                rdef.original_max_position_embeddings;
  const RopeScalingConfig& h = hf.rope_scaling;
  const bool rope_same =
      r.type == h.type && r.factor == h.factor &&
      r.low_freq_factor == h.low_freq_factor &&
      r.high_freq_factor == h.high_freq_factor &&
      r.original_max_position_embeddings == h.original_max_position_embeddings;
  if (!rope_default && !rope_same) {
    return Invalid("model.rope_scaling",
                   "differs from model.hf_path's config.json; leave the "
                   "architecture keys unset with model.hf_path");
  }
  m.rope_scaling = h;
  return std::nullopt;
}

absl::StatusOr<JobConfig> ParseImpl(const std::string& yaml_text,
                                    const std::string& source,
                                    const std::vector<std::string>& overrides) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(yaml_text);
  } catch (const YAML::ParserException& e) {
    const std::string where = e.mark.is_null()
                                  ? source
                                  : absl::StrCat(source, ":", e.mark.line + 1,
                                                 ":", e.mark.column + 1);
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": invalid YAML: ", e.msg));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid YAML: ", e.msg));
  }
  if (docs.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": expected one YAML document, got ", docs.size()));
  }
  const YAML::Node root = docs.empty() ? YAML::Node() : docs[0];
  if (!root.IsNull() && !root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": expected a map at the top level, got ", Describe(root)));
  }

  JobConfig config;
  config.source_path = source;
  // Overrides are read onto the config after the file, in order; a field
  // set last wins, just as if each were merged into the tree. Reading them
  // one by one lets every error name the override that caused it.
  std::vector<Override> parsed;
  try {
    if (root.IsMap()) {
      if (auto error = ReadInto(root, config)) {
        return FormatError(source, *error);
      }
    }
    for (const std::string& text : overrides) {
      absl::StatusOr<Override> o = ParseOverride(text);
      if (!o.ok()) return o.status();
      if (auto error = ReadInto(o->tree, config)) {
        if (error->path == o->path) error->path.clear();  // said already
        return FormatError(absl::StrCat("--set ", text), *error);
      }
      parsed.push_back(*std::move(o));
    }
  } catch (const YAML::Exception& e) {  // not expected; never let one escape
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid YAML: ", e.msg));
  }

  std::optional<FieldError> error = ApplyHfArchitecture(config.model);
  if (!error) error = Validate(config);
  if (error) {
    // Blame the last override that set the offending key, if any.
    for (auto it = parsed.rbegin(); it != parsed.rend(); ++it) {
      if (it->path == error->path) {
        error->path.clear();
        return FormatError(absl::StrCat("--set ", it->text), *error);
      }
    }
    return FormatError(source, *error);
  }
  return config;
}

}  // namespace

absl::StatusOr<JobConfig> LoadJobConfig(
    const std::string& path, const std::vector<std::string>& overrides) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  std::string text;
  int error = file == nullptr ? errno : 0;
  if (file != nullptr) {
    char buf[1 << 14];
    size_t n;
    errno = 0;
    while ((n = std::fread(buf, 1, sizeof(buf), file)) > 0) text.append(buf, n);
    if (std::ferror(file)) error = errno != 0 ? errno : EIO;
    std::fclose(file);
  }
  if (error != 0) {
    return absl::Status(absl::ErrnoToStatusCode(error),
                        absl::StrCat(path, ": cannot open config file (",
                                     std::strerror(error), ")"));
  }
  return ParseImpl(text, path, overrides);
}

absl::StatusOr<JobConfig> ParseJobConfig(
    const std::string& yaml_text, const std::string& source_name,
    const std::vector<std::string>& overrides) {
  return ParseImpl(yaml_text, source_name, overrides);
}

absl::Status ValidateJobConfig(const JobConfig& config) {
  if (auto error = Validate(config)) {
    return FormatError(config.source_path, *error);
  }
  return absl::OkStatus();
}

std::string JobConfigToYaml(const JobConfig& config) {
  JobConfig copy = config;
  Emitter emitter;
  VisitJob(copy, emitter);
  return emitter.Finish();
}

namespace {

std::optional<ActivationAction> ParseAction(absl::string_view s) {
  if (s == "keep") return ActivationAction::kKeep;
  if (s == "recompute") return ActivationAction::kRecompute;
  if (s == "swap") return ActivationAction::kSwap;
  return std::nullopt;
}

}  // namespace

const char* ActivationActionName(ActivationAction action) {
  switch (action) {
    case ActivationAction::kKeep:
      return "keep";
    case ActivationAction::kRecompute:
      return "recompute";
    case ActivationAction::kSwap:
      return "swap";
  }
  return "?";
}

absl::StatusOr<std::vector<LayerActivationPlan>> ResolveActivationPlan(
    const ActivationConfig& config, int n_layers) {
  if (config.policy == "auto") {
    // The planner (engine/activation_planner.h) replaces it by measurement.
    return std::vector<LayerActivationPlan>(std::max(n_layers, 0));
  }
  const auto policy = ParseAction(config.policy);
  if (!policy) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown policy '", config.policy,
                     "' (keep, recompute, swap or auto)"));
  }
  LayerActivationPlan base{*policy, *policy, *policy};
  struct Field {
    const char* name;
    const std::string* value;
    ActivationAction LayerActivationPlan::*member;
  };
  const Field fields[] = {
      {"attention", &config.attention, &LayerActivationPlan::attention},
      {"mlp", &config.mlp, &LayerActivationPlan::mlp},
      {"norm", &config.norm, &LayerActivationPlan::norm}};
  for (const Field& f : fields) {
    if (f.value->empty()) continue;
    const auto action = ParseAction(*f.value);
    if (!action) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown action '", *f.value, "' for ", f.name,
                       " (keep, recompute or swap)"));
    }
    base.*f.member = *action;
  }
  std::vector<LayerActivationPlan> plan(std::max(n_layers, 0), base);
  std::vector<bool> seen(plan.size(), false);
  for (absl::string_view entry :
       absl::StrSplit(config.layers, ';', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> parts =
        absl::StrSplit(entry, absl::MaxSplits(':', 1));
    int layer = -1;
    if (parts.size() != 2 ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[0]), &layer)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad entry '", absl::StripAsciiWhitespace(entry),
                       "': expected '<layer>: <sub-block>=<action>, ...'"));
    }
    if (layer < 0 || layer >= n_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", layer, " out of range: model.n_layers is ", n_layers));
    }
    if (seen[layer]) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " listed twice"));
    }
    seen[layer] = true;
    for (absl::string_view item :
         absl::StrSplit(parts[1], ',', absl::SkipWhitespace())) {
      const std::vector<absl::string_view> kv =
          absl::StrSplit(item, absl::MaxSplits('=', 1));
      const absl::string_view key =
          absl::StripAsciiWhitespace(kv.empty() ? "" : kv[0]);
      const Field* field = nullptr;
      for (const Field& f : fields) {
        if (key == f.name) field = &f;
      }
      if (kv.size() != 2 || field == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", layer, ": bad item '", absl::StripAsciiWhitespace(item),
            "': expected attention|mlp|norm=<action>"));
      }
      const absl::string_view value = absl::StripAsciiWhitespace(kv[1]);
      const auto action = ParseAction(value);
      if (!action) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", layer, ": unknown action '", value, "' for ",
                         key, " (keep, recompute or swap)"));
      }
      plan[layer].*field->member = *action;
    }
  }
  return plan;
}

}  // namespace fusionrl
