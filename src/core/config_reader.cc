// LoadJobConfig / ParseJobConfig: YAML text and --set overrides ->
// JobConfig, through the schema's Reader (config_schema.h), then the
// imported Hugging Face architecture and validation.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
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
#include "absl/strings/strip.h"
#include "core/config_schema.h"
#include "core/hf_config.h"
#include "core/yaml_load.h"
#include "fusionrl/config.h"

namespace fusionrl {
namespace {

using config_internal::FieldError;
using config_internal::FormatDouble;
using config_internal::FormatError;
using config_internal::Invalid;
using config_internal::NumRule;
using config_internal::StrRule;

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

  void String(const char* key, std::string* out, const StrRule& rule) {
    const YAML::Node* node = Find(key);
    if (node == nullptr) return;
    if (node->IsScalar()) {
      *out = node->Scalar();
    } else if (node->IsNull()) {  // "key:", "key: ~"
      out->clear();
    } else if (rule.list && node->IsSequence()) {
      std::vector<std::string> items;
      for (const YAML::Node& item : *node) {
        if (!item.IsScalar()) {
          Fail(key, absl::StrCat("expected a list of strings, got an item ",
                                 Describe(item)));
          return;
        }
        items.push_back(item.Scalar());
      }
      *out = absl::StrJoin(items, ",");
    } else {
      Fail(key, absl::StrCat("expected a string, got ", Describe(*node)));
    }
  }

  // An enum field: its YAML spelling parsed once, here; a bad one is an
  // error naming the valid values.
  template <class E>
  void Enum(const char* key, E* out,
            absl::StatusOr<E> (*parse)(absl::string_view), const char* (*)(E)) {
    const YAML::Node* node = Find(key);
    if (node == nullptr) return;
    if (!node->IsScalar() && !node->IsNull()) {
      Fail(key, absl::StrCat("expected a string, got ", Describe(*node)));
      return;
    }
    // "key:" / "key: ~" reads as "": an enum that has an empty spelling
    // (a sub-block's "take the policy's") takes it, others name their values.
    absl::StatusOr<E> value = parse(node->IsNull() ? "" : node->Scalar());
    if (!value.ok()) {
      Fail(key, std::string(value.status().message()));
    } else {
      *out = *value;
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
        const std::string& key = frame.entries[i].first;
        // A simulator config (configs/simulate.yaml) nests its job under
        // `job:`; say which command reads it rather than list the keys.
        Fail(key, frame.prefix.empty() && key == "job"
                      ? std::string("unknown key: this looks like a "
                                    "`fusionrl simulate` config (the job "
                                    "nested under job:); run fusionrl "
                                    "simulate on it")
                      : UnknownKeyReason(key, frame.known));
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

// Reads the keys present in `root` (a map) into `config`.
std::optional<FieldError> ReadInto(const YAML::Node& root, JobConfig& config) {
  Reader reader(root);
  config_internal::VisitJob(config, reader);
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
    o.tree = LoadYaml(text.substr(eq + 1));
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

// With model.lora_path: model.lora comes from the adapter's
// adapter_config.json. Keys still at their defaults take the adapter's
// values; a rank or targets set otherwise is an error naming both.
std::optional<FieldError> ApplyPeftAdapter(ModelConfig& m) {
  if (m.lora_path.empty() || !std::filesystem::exists(m.lora_path)) {
    return std::nullopt;  // a missing directory: the field rule's error
  }
  absl::StatusOr<PeftAdapterInfo> info = ReadPeftAdapterConfig(m.lora_path);
  if (!info.ok()) {
    return Invalid("model.lora_path", std::string(info.status().message()));
  }
  const LoraConfig& a = info->lora;
  if (m.lora.rank != 0 && m.lora.rank != a.rank) {
    return Invalid("model.lora.rank", absl::StrCat("is ", m.lora.rank,
                                                   " but model.lora_path's "
                                                   "adapter has r = ",
                                                   a.rank));
  }
  if (m.lora.targets != LoraConfig().targets) {
    absl::StatusOr<std::vector<std::string>> mine =
        ParseLoraTargets(m.lora.targets);
    if (mine.ok() && absl::StrJoin(*mine, ",") != a.targets) {
      return Invalid(
          "model.lora.targets",
          absl::StrCat("are ", absl::StrJoin(*mine, ","),
                       " but model.lora_path's adapter targets ", a.targets));
    }
  }
  if (m.lora.alpha != LoraConfig().alpha && m.lora.alpha != a.alpha) {
    return Invalid("model.lora.alpha",
                   absl::StrCat("is ", FormatDouble(m.lora.alpha),
                                " but model.lora_path's adapter has "
                                "lora_alpha = ",
                                FormatDouble(a.alpha)));
  }
  m.lora.rank = a.rank;
  m.lora.alpha = a.alpha;
  m.lora.targets = a.targets;
  if (m.lora.dropout == 0) m.lora.dropout = a.dropout;
  return std::nullopt;
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
  take("moe_experts", &ModelConfig::moe_experts);
  take("moe_top_k", &ModelConfig::moe_top_k);
  take("moe_d_ff", &ModelConfig::moe_d_ff);
  if (error) return error;
  if (m.moe_gates != def.moe_gates && m.moe_gates != hf.moe_gates) {
    return Invalid("model.moe_gates",
                   absl::StrCat("is ", MoeGatesName(m.moe_gates),
                                " but model.hf_path's config.json gives ",
                                MoeGatesName(hf.moe_gates),
                                "; leave the architecture keys unset with "
                                "model.hf_path"));
  }
  m.moe_gates = hf.moe_gates;
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
    docs = LoadAllYaml(yaml_text);
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
  // Zero bytes, only comments or only "---": nothing was configured. Running
  // a default job from it hides the mistake (a wrong path, an unsaved file).
  if (root.IsNull()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source.empty() ? "" : absl::StrCat(source, ": "),
        "the file is empty (no keys); a job needs at least one key (write "
        "'{}' to run every default)"));
  }
  if (!root.IsMap()) {
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
    if (auto error = ReadInto(root, config)) {
      return FormatError(source, *error);
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
  if (!error) error = ApplyPeftAdapter(config.model);
  if (!error) error = config_internal::Validate(config);
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

absl::Status ResolveJobConfig(JobConfig& config) {
  std::optional<FieldError> error = ApplyHfArchitecture(config.model);
  if (!error) error = ApplyPeftAdapter(config.model);
  if (!error) error = config_internal::Validate(config);
  if (error) return FormatError(config.source_path, *error);
  return absl::OkStatus();
}

absl::StatusOr<JobConfig> ParseJobConfig(
    const std::string& yaml_text, const std::string& source_name,
    const std::vector<std::string>& overrides) {
  return ParseImpl(yaml_text, source_name, overrides);
}

}  // namespace fusionrl
