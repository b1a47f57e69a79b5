// Byte-level BPE: loading tokenizer.json / tokenizer_config.json, encoding
// (added tokens, normalizer, split, merges) and decoding (see
// bpe_tokenizer.h).
#include "tasks/bpe_tokenizer.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <queue>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tasks/bpe_json_reader.h"
#include "tasks/bpe_text.h"

namespace fusionrl {
namespace {

using nlohmann::json;

// Debian's Abseil has its own string_view type; convert at its API.
absl::string_view Av(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

#define FUSIONRL_BPE_RETURN_IF_ERROR(expr)    \
  do {                                        \
    const absl::Status status_ = (expr);      \
    if (!status_.ok()) return status_;        \
  } while (0)

// Words up to this many bytes are cached; the cache stops growing at
// kCacheCapacity words (the reference keeps 10,000).
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kCacheCapacity = 100000;
// Words with more symbols than this merge through a heap (O(n log n))
// instead of rescanning the pair ranks (O(n^2) on small ints).
constexpr size_t kLongWordSymbols = 48;

uint64_t PairKey(int left, int right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
         static_cast<uint32_t>(right);
}

// A JSON value in an error message: strings quoted, the rest as JSON.
std::string Show(const json& value) {
  if (value.is_string()) return absl::StrCat("'", value.get<std::string>(), "'");
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

absl::Status Refuse(const std::string& file, absl::string_view field,
                    const json& value, absl::string_view supported) {
  return absl::InvalidArgumentError(absl::StrCat(
      file, ": ", field, ": ", Show(value), " is not supported (", supported,
      ")"));
}

absl::Status Malformed(const std::string& file, absl::string_view field,
                       absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": ", field, ": ", what));
}

absl::StatusOr<json> ParseJson(std::string_view text, const std::string& file) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": malformed JSON: ", e.what()));
  }
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": not found"));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return std::move(contents).str();
}

// `obj[key]` when present and not null.
const json* Get(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// Optional boolean `obj[key]`; `fallback` when absent or null.
absl::StatusOr<bool> GetBool(const json& obj, const char* key, bool fallback,
                             const std::string& file,
                             const std::string& field) {
  const json* value = Get(obj, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) {
    return Malformed(file, absl::StrCat(field, ".", key),
                     absl::StrCat("expected true or false, got ", Show(*value)));
  }
  return value->get<bool>();
}

// The `type` of a component object.
absl::StatusOr<std::string> TypeOf(const json& component,
                                   const std::string& file,
                                   const std::string& field) {
  if (!component.is_object()) {
    return Malformed(file, field,
                     absl::StrCat("expected an object, got ", Show(component)));
  }
  const json* type = Get(component, "type");
  if (type == nullptr || !type->is_string()) {
    return Malformed(file, absl::StrCat(field, ".type"),
                     "missing or not a string");
  }
  return type->get<std::string>();
}

// bos_token / eos_token / pad_token of tokenizer_config.json: a string, an
// object with "content", or null/absent (nullopt).
absl::StatusOr<std::optional<std::string>> ConfigToken(
    const json& config, const char* key, const std::string& file) {
  const json* value = Get(config, key);
  if (value == nullptr) return std::nullopt;
  if (value->is_string()) return value->get<std::string>();
  if (value->is_object()) {
    const json* content = Get(*value, "content");
    if (content != nullptr && content->is_string()) {
      return content->get<std::string>();
    }
  }
  return Malformed(file, key,
                   absl::StrCat("expected a string, {\"content\": ...} or "
                                "null, got ",
                                Show(*value)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Load(
    const std::string& dir) {
  const std::string tokenizer_path = absl::StrCat(dir, "/tokenizer.json");
  auto tokenizer_json = ReadFile(tokenizer_path);
  if (!tokenizer_json.ok()) return tokenizer_json.status();
  const std::string config_path = absl::StrCat(dir, "/tokenizer_config.json");
  std::string config_json;
  if (std::ifstream(config_path).good()) {
    auto config = ReadFile(config_path);
    if (!config.ok()) return config.status();
    config_json = *std::move(config);
  }
  return FromJson(*tokenizer_json, config_json, tokenizer_path, config_path);
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(
    std::string_view tokenizer_json, std::string_view config_json,
    const std::string& tokenizer_name, const std::string& config_name) {
  std::unique_ptr<BpeTokenizer> tokenizer(new BpeTokenizer);
  FUSIONRL_BPE_RETURN_IF_ERROR(
      tokenizer->ParseTokenizerJson(tokenizer_json, tokenizer_name));
  if (!config_json.empty()) {
    FUSIONRL_BPE_RETURN_IF_ERROR(
        tokenizer->ParseConfigJson(config_json, config_name));
  }
  return tokenizer;
}

absl::Status BpeTokenizer::ParseTokenizerJson(std::string_view text,
                                              const std::string& file) {
  auto read = bpe::ReadTokenizerJson(text, file);
  if (!read.ok()) return read.status();
  const json& doc = read->doc;
  if (!doc.is_object()) return Malformed(file, "(top level)", "not an object");

  // --- model -------------------------------------------------------------
  const json* model = Get(doc, "model");
  if (model == nullptr) return Malformed(file, "model", "missing");
  auto model_type = TypeOf(*model, file, "model");
  if (!model_type.ok()) return model_type.status();
  if (*model_type != "BPE") {
    return Refuse(file, "model.type", *model_type, "byte-level BPE only");
  }
  auto byte_fallback = GetBool(*model, "byte_fallback", false, file, "model");
  if (!byte_fallback.ok()) return byte_fallback.status();
  if (*byte_fallback) {
    return Refuse(file, "model.byte_fallback", true,
                  "byte-level BPE needs no byte fallback");
  }
  if (const json* dropout = Get(*model, "dropout");
      dropout != nullptr && !(dropout->is_number() && *dropout == 0)) {
    return Refuse(file, "model.dropout", *dropout, "null only");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json* affix = Get(*model, key);
        affix != nullptr && *affix != "") {
      return Refuse(file, absl::StrCat("model.", key), *affix,
                    "null or \"\" only");
    }
  }
  auto ignore_merges = GetBool(*model, "ignore_merges", false, file, "model");
  if (!ignore_merges.ok()) return ignore_merges.status();
  ignore_merges_ = *ignore_merges;

  if (!read->has_vocab) {
    return Malformed(file, "model.vocab", "missing or not an object");
  }
  int max_id = -1;
  vocab_.reserve(read->vocab.size());
  for (auto& [token, id] : read->vocab) {
    max_id = std::max(max_id, id);
    vocab_.insert_or_assign(std::move(token), id);
  }

  if (!read->has_merges) {
    return Malformed(file, "model.merges", "missing or not an array");
  }
  merges_.reserve(read->merges.size());
  std::string merged;
  for (size_t rank = 0; rank < read->merges.size(); ++rank) {
    const auto& [left, right] = read->merges[rank];
    merged.assign(left);
    merged.append(right);
    int ids[3];
    const std::string* parts[3] = {&left, &right, &merged};
    for (int k = 0; k < 3; ++k) {
      auto it = vocab_.find(*parts[k]);
      if (it == vocab_.end()) {
        return Malformed(file, absl::StrCat("model.merges[", rank, "]"),
                         absl::StrCat("token '", *parts[k],
                                      "' is not in model.vocab"));
      }
      ids[k] = it->second;
    }
    merges_.insert_or_assign(PairKey(ids[0], ids[1]),
                             Merge{static_cast<int>(rank), ids[2]});
  }

  // --- added tokens ------------------------------------------------------
  if (const json* added = Get(doc, "added_tokens"); added != nullptr) {
    if (!added->is_array()) {
      return Malformed(file, "added_tokens", "not an array");
    }
    for (size_t i = 0; i < added->size(); ++i) {
      const json& entry = (*added)[i];
      const std::string field = absl::StrCat("added_tokens[", i, "]");
      const json* id = entry.is_object() ? Get(entry, "id") : nullptr;
      const json* content = entry.is_object() ? Get(entry, "content") : nullptr;
      if (id == nullptr || !id->is_number_integer() || id->get<int64_t>() < 0 ||
          id->get<int64_t>() >= (int64_t{1} << 30) || content == nullptr ||
          !content->is_string() || content->get_ref<const std::string&>().empty()) {
        return Malformed(file, field,
                         "expected {\"id\": <id>, \"content\": \"...\", ...}");
      }
      AddedToken token;
      token.content = content->get<std::string>();
      token.id = id->get<int>();
      const std::string named =
          absl::StrCat(field, " ('", token.content, "')");
      for (const char* key : {"lstrip", "rstrip", "single_word"}) {
        auto flag = GetBool(entry, key, false, file, named);
        if (!flag.ok()) return flag.status();
        if (*flag) return Refuse(file, absl::StrCat(named, ".", key), true,
                                 "false only");
      }
      auto special = GetBool(entry, "special", false, file, named);
      if (!special.ok()) return special.status();
      token.special = *special;
      // The reference's default: special tokens are not normalized.
      auto normalized =
          GetBool(entry, "normalized", !token.special, file, named);
      if (!normalized.ok()) return normalized.status();
      token.normalized = *normalized;
      max_id = std::max(max_id, token.id);
      added_ids_.insert_or_assign(token.content, token.id);
      added_.push_back(std::move(token));
    }
  }

  // --- normalizer --------------------------------------------------------
  if (const json* normalizer = Get(doc, "normalizer"); normalizer != nullptr) {
    auto type = TypeOf(*normalizer, file, "normalizer");
    if (!type.ok()) return type.status();
    constexpr absl::string_view kSupported = "null, NFC, or a Sequence of NFC";
    if (*type == "NFC") {
      nfc_ = true;
    } else if (*type == "Sequence") {
      const json* list = Get(*normalizer, "normalizers");
      if (list == nullptr || !list->is_array()) {
        return Malformed(file, "normalizer.normalizers", "missing");
      }
      for (size_t i = 0; i < list->size(); ++i) {
        const std::string field = absl::StrCat("normalizer.normalizers[", i, "]");
        auto inner = TypeOf((*list)[i], file, field);
        if (!inner.ok()) return inner.status();
        if (*inner != "NFC") {
          return Refuse(file, absl::StrCat(field, ".type"), *inner, kSupported);
        }
        nfc_ = true;
      }
    } else {
      return Refuse(file, "normalizer.type", *type, kSupported);
    }
  }

  // --- pre-tokenizer -----------------------------------------------------
  constexpr absl::string_view kPreSupported =
      "a Sequence of Split ending in ByteLevel, or ByteLevel";
  const json* pre = Get(doc, "pre_tokenizer");
  if (pre == nullptr) return Refuse(file, "pre_tokenizer", nullptr, kPreSupported);
  auto pre_type = TypeOf(*pre, file, "pre_tokenizer");
  if (!pre_type.ok()) return pre_type.status();
  std::vector<std::pair<const json*, std::string>> steps;  // (step, field)
  if (*pre_type == "Sequence") {
    const json* list = Get(*pre, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return Malformed(file, "pre_tokenizer.pretokenizers", "missing");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      steps.emplace_back(&(*list)[i],
                         absl::StrCat("pre_tokenizer.pretokenizers[", i, "]"));
    }
  } else {
    steps.emplace_back(pre, "pre_tokenizer");
  }
  bool byte_level = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& [step, field] = steps[i];
    auto type = TypeOf(*step, file, field);
    if (!type.ok()) return type.status();
    if (byte_level) {
      return Refuse(file, absl::StrCat(field, ".type"), *type,
                    "ByteLevel must come last");
    }
    if (*type == "Split") {
      const json* pattern = Get(*step, "pattern");
      const json* regex = pattern && pattern->is_object()
                              ? Get(*pattern, "Regex") : nullptr;
      const json* literal = pattern && pattern->is_object()
                                ? Get(*pattern, "String") : nullptr;
      const json* source = regex != nullptr ? regex : literal;
      if (source == nullptr || !source->is_string()) {
        return Malformed(file, absl::StrCat(field, ".pattern"),
                         "expected {\"Regex\": ...} or {\"String\": ...}");
      }
      const json* behavior = Get(*step, "behavior");
      if (behavior == nullptr || *behavior != "Isolated") {
        return Refuse(file, absl::StrCat(field, ".behavior"),
                      behavior ? *behavior : json(nullptr), "Isolated only");
      }
      auto invert = GetBool(*step, "invert", false, file, field);
      if (!invert.ok()) return invert.status();
      if (*invert) {
        return Refuse(file, absl::StrCat(field, ".invert"), true, "false only");
      }
      auto splitter = bpe::RegexSplitter::Create(
          source->get_ref<const std::string&>(), regex == nullptr);
      if (!splitter.ok()) {
        return Malformed(file, absl::StrCat(field, ".pattern"),
                         splitter.status().message());
      }
      splitters_.push_back(*std::move(splitter));
    } else if (*type == "ByteLevel") {
      auto prefix = GetBool(*step, "add_prefix_space", false, file, field);
      if (!prefix.ok()) return prefix.status();
      if (*prefix) {
        return Refuse(file, absl::StrCat(field, ".add_prefix_space"), true,
                      "false only");
      }
      auto use_regex = GetBool(*step, "use_regex", true, file, field);
      if (!use_regex.ok()) return use_regex.status();
      if (*use_regex) {
        auto splitter = bpe::RegexSplitter::Create(bpe::kGpt2Pattern, false);
        if (!splitter.ok()) return splitter.status();
        splitters_.push_back(*std::move(splitter));
      }
      byte_level = true;
    } else {
      return Refuse(file, absl::StrCat(field, ".type"), *type, kPreSupported);
    }
  }
  if (!byte_level) {
    return Refuse(file, "pre_tokenizer", *pre, kPreSupported);
  }

  // --- decoder -----------------------------------------------------------
  const json* decoder = Get(doc, "decoder");
  if (decoder == nullptr) return Refuse(file, "decoder", nullptr, "ByteLevel");
  auto decoder_type = TypeOf(*decoder, file, "decoder");
  if (!decoder_type.ok()) return decoder_type.status();
  if (*decoder_type != "ByteLevel") {
    return Refuse(file, "decoder.type", *decoder_type, "ByteLevel only");
  }

  // --- derived tables ----------------------------------------------------
  vocab_size_ = max_id + 1;
  id_bytes_.assign(vocab_size_, std::string());
  id_special_.assign(vocab_size_, 0);
  id_known_.assign(vocab_size_, 0);
  // The ByteLevel decoder: a token whose characters are all in the byte
  // table becomes those bytes, any other token its own UTF-8.
  auto set_bytes = [this](int id, std::string_view token) {
    std::string& bytes = id_bytes_[id];
    bytes.clear();
    if (!bpe::UnicodeToBytes(token, &bytes)) bytes.assign(token);
    id_known_[id] = 1;
  };
  for (const auto& [token, id] : vocab_) set_bytes(id, token);
  for (const AddedToken& token : added_) {
    set_bytes(token.id, token.content);
    id_special_[token.id] = token.special ? 1 : 0;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(bpe::ByteToUnicode(static_cast<unsigned char>(b)));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  BuildAddedTokenIndex();
  return absl::OkStatus();
}

void BpeTokenizer::BuildAddedTokenIndex() {
  for (int k = 0; k < static_cast<int>(added_.size()); ++k) {
    const auto first = static_cast<unsigned char>(added_[k].content[0]);
    if (added_[k].normalized) {
      normalized_by_first_byte_[first].push_back(k);
      has_normalized_added_ = true;
    } else {
      raw_by_first_byte_[first].push_back(k);
      has_raw_added_ = true;
    }
  }
  // Longest first, so the first candidate that matches is the longest.
  for (auto* index : {&raw_by_first_byte_, &normalized_by_first_byte_}) {
    for (auto& candidates : *index) {
      std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) {
        return added_[a].content.size() > added_[b].content.size();
      });
    }
  }
}

absl::Status BpeTokenizer::ParseConfigJson(std::string_view text,
                                           const std::string& file) {
  auto parsed = ParseJson(text, file);
  if (!parsed.ok()) return parsed.status();
  const json& config = *parsed;
  if (!config.is_object()) return Malformed(file, "(top level)", "not an object");
  auto lookup = [&](const char* key) -> absl::StatusOr<int> {
    auto token = ConfigToken(config, key, file);
    if (!token.ok()) return token.status();
    if (!token->has_value()) return -1;
    const int id = TokenToId(**token);
    if (id < 0) {
      return Malformed(file, key,
                       absl::StrCat("'", **token,
                                    "' is not a token of tokenizer.json"));
    }
    return id;
  };
  auto bos = lookup("bos_token");
  if (!bos.ok()) return bos.status();
  auto eos = lookup("eos_token");
  if (!eos.ok()) return eos.status();
  auto pad = lookup("pad_token");
  if (!pad.ok()) return pad.status();
  auto add_bos = GetBool(config, "add_bos_token", true, file, "(top level)");
  if (!add_bos.ok()) return add_bos.status();
  bos_id_ = *add_bos ? *bos : -1;
  eos_id_ = *eos;
  pad_id_ = *pad >= 0 ? *pad : *eos;
  return absl::OkStatus();
}

int BpeTokenizer::TokenToId(std::string_view token) const {
  if (auto it = added_ids_.find(Av(token)); it != added_ids_.end()) {
    return it->second;
  }
  if (auto it = vocab_.find(Av(token)); it != vocab_.end()) return it->second;
  return -1;
}

bool BpeTokenizer::regex_jit() const {
  for (const auto& splitter : splitters_) {
    if (!splitter->jit()) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Encoding.

absl::StatusOr<std::vector<int>> BpeTokenizer::Encode(
    std::string_view text) const {
  if (const size_t bad = bpe::FindInvalidUtf8(text);
      bad != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "invalid UTF-8 at byte offset %d (byte 0x%02X)", bad,
        static_cast<unsigned char>(text[bad])));
  }
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 4);
  FUSIONRL_BPE_RETURN_IF_ERROR(SplitOnAddedTokens(
      text, /*normalized=*/false, &ids,
      [&](std::string_view section) { return EncodeSection(section, &ids); }));
  return ids;
}

template <typename OnText>
absl::Status BpeTokenizer::SplitOnAddedTokens(std::string_view text,
                                              bool normalized,
                                              std::vector<int>* ids,
                                              OnText on_text) const {
  if (!(normalized ? has_normalized_added_ : has_raw_added_)) {
    return on_text(text);
  }
  const auto& index =
      normalized ? normalized_by_first_byte_ : raw_by_first_byte_;
  size_t last = 0;
  size_t i = 0;
  while (i < text.size()) {
    const auto& candidates = index[static_cast<unsigned char>(text[i])];
    const AddedToken* found = nullptr;
    for (int k : candidates) {
      const std::string& content = added_[k].content;
      if (text.substr(i, content.size()) == content) {
        found = &added_[k];
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    if (i > last) {
      FUSIONRL_BPE_RETURN_IF_ERROR(on_text(text.substr(last, i - last)));
    }
    ids->push_back(found->id);
    i += found->content.size();
    last = i;
  }
  if (last < text.size()) return on_text(text.substr(last));
  return absl::OkStatus();
}

absl::Status BpeTokenizer::EncodeSection(std::string_view text,
                                         std::vector<int>* ids) const {
  std::string normalized;
  if (nfc_) {
    auto changed = bpe::NfcNormalize(text, &normalized);
    if (!changed.ok()) return changed.status();
    if (*changed) text = normalized;
  }
  return SplitOnAddedTokens(
      text, /*normalized=*/true, ids,
      [&](std::string_view stretch) { return EncodeNormalized(stretch, ids); });
}

absl::Status BpeTokenizer::EncodeNormalized(std::string_view text,
                                            std::vector<int>* ids) const {
  std::vector<std::string_view> pieces = {text};
  std::vector<std::string_view> next;
  for (const auto& splitter : splitters_) {
    next.clear();
    for (std::string_view piece : pieces) {
      FUSIONRL_BPE_RETURN_IF_ERROR(splitter->Split(piece, &next));
    }
    pieces.swap(next);
  }
  for (std::string_view word : pieces) {
    FUSIONRL_BPE_RETURN_IF_ERROR(EncodeWord(word, ids));
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::EncodeWord(std::string_view word,
                                      std::vector<int>* ids) const {
  if (word.empty()) return absl::OkStatus();
  if (ignore_merges_) {
    std::string mapped;
    for (char c : word) mapped += bpe::ByteToUnicode(c);
    if (auto it = vocab_.find(mapped); it != vocab_.end()) {
      ids->push_back(it->second);
      return absl::OkStatus();
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu_);
    if (auto it = cache_.find(Av(word)); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }
  std::vector<int> symbols;
  symbols.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const int id = byte_ids_[static_cast<unsigned char>(word[i])];
    if (id < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the vocabulary has no token for byte 0x%02X (byte %d of the "
          "pre-tokenized word '%s')",
          static_cast<unsigned char>(word[i]), i, Av(word)));
    }
    symbols.push_back(id);
  }
  if (symbols.size() > kLongWordSymbols) {
    MergeSymbolsLong(&symbols);
  } else {
    MergeSymbols(&symbols);
  }
  ids->insert(ids->end(), symbols.begin(), symbols.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() < kCacheCapacity) cache_.try_emplace(std::string(word), symbols);
  }
  return absl::OkStatus();
}

void BpeTokenizer::MergeSymbols(std::vector<int>* symbols) const {
  std::vector<int>& sym = *symbols;
  if (sym.size() < 2) return;
  // rank[i], merged[i]: the merge of (sym[i], sym[i + 1]), INT_MAX if none.
  std::vector<int> rank(sym.size() - 1);
  std::vector<int> merged(sym.size() - 1);
  auto look_up = [&](size_t i) {
    auto it = merges_.find(PairKey(sym[i], sym[i + 1]));
    rank[i] = it == merges_.end() ? INT_MAX : it->second.rank;
    merged[i] = it == merges_.end() ? -1 : it->second.new_id;
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i) look_up(i);
  while (!rank.empty()) {
    const auto best = std::min_element(rank.begin(), rank.end());  // leftmost
    if (*best == INT_MAX) break;
    const size_t i = best - rank.begin();
    sym[i] = merged[i];
    sym.erase(sym.begin() + i + 1);
    rank.erase(rank.begin() + i);
    merged.erase(merged.begin() + i);
    if (i > 0) look_up(i - 1);
    if (i < rank.size()) look_up(i);
  }
}

void BpeTokenizer::MergeSymbolsLong(std::vector<int>* symbols) const {
  struct Symbol {
    int id;
    int prev;
    int next;
    bool alive;
  };
  struct Candidate {
    int rank;
    int pos;
    int left_id;
    int right_id;
    int new_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  const int n = static_cast<int>(symbols->size());
  std::vector<Symbol> sym(n);
  for (int i = 0; i < n; ++i) {
    sym[i] = {(*symbols)[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push_pair = [&](int pos) {
    const int next = sym[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(sym[pos].id, sym[next].id));
    if (it != merges_.end()) {
      heap.push({it->second.rank, pos, sym[pos].id, sym[next].id,
                 it->second.new_id});
    }
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Skip candidates made stale by an earlier merge of either symbol.
    if (left.id != top.left_id || sym[left.next].id != top.right_id) continue;
    const int right = left.next;
    left.id = top.new_id;
    sym[right].alive = false;
    left.next = sym[right].next;
    if (left.next >= 0) sym[left.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  symbols->clear();
  for (int i = 0; i >= 0; i = sym[i].next) symbols->push_back(sym[i].id);
}

// ---------------------------------------------------------------------------
// Decoding.

std::string BpeTokenizer::DecodeImpl(const std::vector<int>& ids,
                                     bool skip_special) const {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string bytes;
  for (int id : ids) {
    if (id < 0 || id >= vocab_size_ || !id_known_[id]) {
      bytes.append(kReplacement);
    } else if (!(skip_special && id_special_[id])) {
      bytes.append(id_bytes_[id]);
    }
  }
  if (bpe::FindInvalidUtf8(bytes) == std::string_view::npos) return bytes;
  std::string text;
  bpe::AppendUtf8Lossy(bytes, &text);
  return text;
}

std::string BpeTokenizer::Decode(const std::vector<int>& ids) const {
  return DecodeImpl(ids, /*skip_special=*/true);
}

std::string BpeTokenizer::DecodeWithSpecial(const std::vector<int>& ids) const {
  return DecodeImpl(ids, /*skip_special=*/false);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& dir) {
  auto tokenizer = BpeTokenizer::Load(dir);
  if (!tokenizer.ok()) return tokenizer.status();
  return std::unique_ptr<Tokenizer>(*std::move(tokenizer));
}

}  // namespace fusionrl
