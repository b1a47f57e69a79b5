// Loading a BpeTokenizer: tokenizer.json (model, added tokens, normalizer,
// pre-tokenizer, decoder; refusing what is not supported by name) and
// tokenizer_config.json (bos / eos / pad). See bpe_tokenizer.h.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "tokenizer/bpe_json_reader.h"
#include "tokenizer/bpe_text.h"
#include "tokenizer/bpe_tokenizer.h"

namespace fusionrl {
namespace {

using nlohmann::json;

// A JSON value in an error message: strings quoted, the rest as JSON.
std::string Show(const json& value) {
  if (value.is_string())
    return absl::StrCat("'", value.get<std::string>(), "'");
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

absl::Status Refuse(const std::string& file, absl::string_view field,
                    const json& value, absl::string_view supported) {
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": ", field, ": ", Show(value), " is not supported (",
                   supported, ")"));
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
    return Malformed(
        file, absl::StrCat(field, ".", key),
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

// decoder: ByteLevel only.
absl::Status CheckDecoder(const json& doc, const std::string& file) {
  const json* decoder = Get(doc, "decoder");
  if (decoder == nullptr) return Refuse(file, "decoder", nullptr, "ByteLevel");
  auto decoder_type = TypeOf(*decoder, file, "decoder");
  if (!decoder_type.ok()) return decoder_type.status();
  if (*decoder_type != "ByteLevel") {
    return Refuse(file, "decoder.type", *decoder_type, "ByteLevel only");
  }
  return absl::OkStatus();
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
  FUSIONRL_RETURN_IF_ERROR(
      tokenizer->ParseTokenizerJson(tokenizer_json, tokenizer_name));
  if (!config_json.empty()) {
    FUSIONRL_RETURN_IF_ERROR(
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
  int max_id = -1;  // the largest id of the vocabulary and added tokens
  FUSIONRL_RETURN_IF_ERROR(ReadModel(*read, file, &max_id));
  FUSIONRL_RETURN_IF_ERROR(ReadAddedTokens(*read, file, &max_id));
  FUSIONRL_RETURN_IF_ERROR(ReadNormalizer(*read, file));
  FUSIONRL_RETURN_IF_ERROR(ReadPreTokenizer(*read, file));
  FUSIONRL_RETURN_IF_ERROR(CheckDecoder(doc, file));
  BuildIdTables(max_id);
  return absl::OkStatus();
}

// model: byte-level BPE without dropout or affixes; its vocabulary and
// merges (each merge's tokens must be in the vocabulary).
absl::Status BpeTokenizer::ReadModel(bpe::TokenizerJson& read,
                                     const std::string& file, int* max_id) {
  const json& doc = read.doc;
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

  if (!read.has_vocab) {
    return Malformed(file, "model.vocab", "missing or not an object");
  }
  vocab_.reserve(read.vocab.size());
  for (auto& [token, id] : read.vocab) {
    *max_id = std::max(*max_id, id);
    vocab_.insert_or_assign(std::move(token), id);
  }

  if (!read.has_merges) {
    return Malformed(file, "model.merges", "missing or not an array");
  }
  merges_.reserve(read.merges.size());
  std::string merged;
  for (size_t rank = 0; rank < read.merges.size(); ++rank) {
    const auto& [left, right] = read.merges[rank];
    merged.assign(left);
    merged.append(right);
    int ids[3];
    const std::string* parts[3] = {&left, &right, &merged};
    for (int k = 0; k < 3; ++k) {
      auto it = vocab_.find(*parts[k]);
      if (it == vocab_.end()) {
        return Malformed(
            file, absl::StrCat("model.merges[", rank, "]"),
            absl::StrCat("token '", *parts[k], "' is not in model.vocab"));
      }
      ids[k] = it->second;
    }
    merges_.insert_or_assign(PairKey(ids[0], ids[1]),
                             Merge{static_cast<int>(rank), ids[2]});
  }
  return absl::OkStatus();
}

// added_tokens: each with an id and content; lstrip, rstrip and
// single_word false.
absl::Status BpeTokenizer::ReadAddedTokens(const bpe::TokenizerJson& read,
                                           const std::string& file,
                                           int* max_id) {
  const json& doc = read.doc;
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
          !content->is_string() ||
          content->get_ref<const std::string&>().empty()) {
        return Malformed(file, field,
                         "expected {\"id\": <id>, \"content\": \"...\", ...}");
      }
      AddedToken token;
      token.content = content->get<std::string>();
      token.id = id->get<int>();
      const std::string named = absl::StrCat(field, " ('", token.content, "')");
      for (const char* key : {"lstrip", "rstrip", "single_word"}) {
        auto flag = GetBool(entry, key, false, file, named);
        if (!flag.ok()) return flag.status();
        if (*flag)
          return Refuse(file, absl::StrCat(named, ".", key), true,
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
      *max_id = std::max(*max_id, token.id);
      added_ids_.insert_or_assign(token.content, token.id);
      added_.push_back(std::move(token));
    }
  }
  return absl::OkStatus();
}

// normalizer: none, NFC, or a Sequence of NFC.
absl::Status BpeTokenizer::ReadNormalizer(const bpe::TokenizerJson& read,
                                          const std::string& file) {
  const json& doc = read.doc;
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
        const std::string field =
            absl::StrCat("normalizer.normalizers[", i, "]");
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
  return absl::OkStatus();
}

// pre_tokenizer: Split steps (regex or literal, Isolated) ending in ByteLevel.
absl::Status BpeTokenizer::ReadPreTokenizer(const bpe::TokenizerJson& read,
                                            const std::string& file) {
  const json& doc = read.doc;
  constexpr absl::string_view kPreSupported =
      "a Sequence of Split ending in ByteLevel, or ByteLevel";
  const json* pre = Get(doc, "pre_tokenizer");
  if (pre == nullptr)
    return Refuse(file, "pre_tokenizer", nullptr, kPreSupported);
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
      FUSIONRL_RETURN_IF_ERROR(ReadSplitStep(*step, field, file));
    } else if (*type == "ByteLevel") {
      FUSIONRL_RETURN_IF_ERROR(ReadByteLevelStep(*step, field, file));
      byte_level = true;
    } else {
      return Refuse(file, absl::StrCat(field, ".type"), *type, kPreSupported);
    }
  }
  if (!byte_level) {
    return Refuse(file, "pre_tokenizer", *pre, kPreSupported);
  }
  return absl::OkStatus();
}

// One Split step of the pre-tokenizer, at `field`.
absl::Status BpeTokenizer::ReadSplitStep(const json& step_json,
                                         const std::string& field,
                                         const std::string& file) {
  const json* step = &step_json;
  const json* pattern = Get(*step, "pattern");
  const json* regex =
      pattern && pattern->is_object() ? Get(*pattern, "Regex") : nullptr;
  const json* literal =
      pattern && pattern->is_object() ? Get(*pattern, "String") : nullptr;
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
  return absl::OkStatus();
}

// The ByteLevel step of the pre-tokenizer, at `field`: no prefix space;
// GPT-2's split unless use_regex is false.
absl::Status BpeTokenizer::ReadByteLevelStep(const json& step_json,
                                             const std::string& field,
                                             const std::string& file) {
  const json* step = &step_json;
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
  return absl::OkStatus();
}

// The tables by id (bytes, special, known) and by byte, and the added
// tokens' index, from the vocabulary and added tokens read.
void BpeTokenizer::BuildIdTables(int max_id) {
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
  if (!config.is_object())
    return Malformed(file, "(top level)", "not an object");
  auto lookup = [&](const char* key) -> absl::StatusOr<int> {
    auto token = ConfigToken(config, key, file);
    if (!token.ok()) return token.status();
    if (!token->has_value()) return -1;
    const int id = TokenToId(**token);
    if (id < 0) {
      return Malformed(
          file, key,
          absl::StrCat("'", **token, "' is not a token of tokenizer.json"));
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

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& dir) {
  auto tokenizer = BpeTokenizer::Load(dir);
  if (!tokenizer.ok()) return tokenizer.status();
  return std::unique_ptr<Tokenizer>(*std::move(tokenizer));
}

}  // namespace fusionrl
