// Byte-level BPE loaded from a Hugging Face `tokenizer.json` (+ optional
// `tokenizer_config.json`), giving the same ids as the reference `tokenizers`
// library for the configurations Qwen2/Qwen3 and Llama-3 ship.
//
// Supported (anything else is refused with InvalidArgument naming the field
// and the value; docs/tokenizers.md):
//   model          type "BPE", byte_fallback false, no dropout, merges as
//                  "a b" strings or [a, b] pairs, ignore_merges either way,
//                  empty continuing_subword_prefix / end_of_word_suffix;
//   added_tokens   matched in the text before pre-tokenization (leftmost,
//                  longest first); lstrip / rstrip / single_word false;
//                  normalized true or false;
//   normalizer     null, NFC, or a Sequence of NFC;
//   pre_tokenizer  Sequence of Split (Regex or String pattern, behavior
//                  Isolated, invert false) ending in ByteLevel
//                  (add_prefix_space false), or a ByteLevel alone; ByteLevel
//                  with use_regex true adds GPT-2's split;
//   decoder        ByteLevel;
//   post_processor ignored: Encode() never adds special tokens.
// tokenizer_config.json names bos_token / eos_token / pad_token (strings,
// {"content": ...} objects or null); bos_id() is the bos token when
// add_bos_token is true or absent, else -1; pad falls back to eos.
//
// Encoding: added tokens -> normalizer -> regex split -> bytes -> merges by
// rank (lowest first, leftmost on ties). Decoding: ids -> token strings ->
// bytes through the inverse byte table, invalid UTF-8 replaced by U+FFFD as
// the reference does.
//
// Thread safety: immutable after loading except for a word cache guarded by
// a mutex; Encode/Decode may be called from any number of threads.
#ifndef FUSIONRL_TOKENIZER_BPE_TOKENIZER_H_
#define FUSIONRL_TOKENIZER_BPE_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "fusionrl/tokenizer.h"
#include "nlohmann/json_fwd.hpp"
#include "tokenizer/bpe_text.h"

namespace fusionrl {
namespace bpe {
struct TokenizerJson;
}  // namespace bpe

class BpeTokenizer final : public Tokenizer {
 public:
  // Loads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json.
  // NotFound for a missing tokenizer.json; InvalidArgument (naming the file)
  // otherwise.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Load(
      const std::string& dir);

  // The same from the files' contents; `config_json` may be empty (no
  // tokenizer_config.json). `tokenizer_name` / `config_name` prefix errors.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view config_json,
      const std::string& tokenizer_name = "tokenizer.json",
      const std::string& config_name = "tokenizer_config.json");

  int vocab_size() const override { return vocab_size_; }
  int pad_id() const override { return pad_id_; }
  int bos_id() const override { return bos_id_; }
  int eos_id() const override { return eos_id_; }

  absl::StatusOr<std::vector<int>> Encode(std::string_view text) const override;
  std::string Decode(const std::vector<int>& ids) const override;
  std::string DecodeWithSpecial(const std::vector<int>& ids) const override;
  int TokenToId(std::string_view token) const override;

  // Whether the pre-tokenizer regexes run JIT-compiled (for benchmarks).
  bool regex_jit() const;

 private:
  struct AddedToken {
    std::string content;
    int id = -1;
    bool special = false;
    bool normalized = false;
  };
  struct Merge {
    int rank;
    int new_id;
  };

  BpeTokenizer() = default;

  static uint64_t PairKey(int left, int right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  absl::Status ParseTokenizerJson(std::string_view text,
                                  const std::string& name);
  // The sections of tokenizer.json, in the order ParseTokenizerJson reads
  // them; `max_id` grows to the largest id seen. ReadModel moves the
  // vocabulary out of `read`.
  absl::Status ReadModel(bpe::TokenizerJson& read, const std::string& file,
                         int* max_id);
  absl::Status ReadAddedTokens(const bpe::TokenizerJson& read,
                               const std::string& file, int* max_id);
  absl::Status ReadNormalizer(const bpe::TokenizerJson& read,
                              const std::string& file);
  absl::Status ReadPreTokenizer(const bpe::TokenizerJson& read,
                                const std::string& file);
  absl::Status ReadSplitStep(const nlohmann::json& step,
                             const std::string& field, const std::string& file);
  absl::Status ReadByteLevelStep(const nlohmann::json& step,
                                 const std::string& field,
                                 const std::string& file);
  void BuildIdTables(int max_id);
  absl::Status ParseConfigJson(std::string_view text, const std::string& name);
  void BuildAddedTokenIndex();

  // Splits `text` on the added tokens of one kind (normalized or not);
  // `on_text` receives the stretches between them.
  template <typename OnText>
  absl::Status SplitOnAddedTokens(std::string_view text, bool normalized,
                                  std::vector<int>* ids, OnText on_text) const;
  // A stretch of raw text between added tokens: normalizer, then the
  // normalized added tokens, then pre-tokenization and BPE.
  absl::Status EncodeSection(std::string_view text,
                             std::vector<int>* ids) const;
  absl::Status EncodeNormalized(std::string_view text,
                                std::vector<int>* ids) const;
  // One pre-tokenized word: through the cache, else BpeWord.
  absl::Status EncodeWord(std::string_view word, std::vector<int>* ids) const;
  // One word through the model: the vocabulary (ignore_merges), else its
  // bytes merged by rank.
  absl::Status BpeWord(std::string_view word, std::vector<int>* symbols) const;
  void MergeSymbols(std::vector<int>* symbols) const;
  void MergeSymbolsLong(std::vector<int>* symbols) const;
  std::string DecodeImpl(const std::vector<int>& ids, bool skip_special) const;

  int vocab_size_ = 0;
  int pad_id_ = -1;
  int bos_id_ = -1;
  int eos_id_ = -1;
  bool nfc_ = false;
  bool ignore_merges_ = false;

  // Token string (byte-level characters) -> id; added tokens separately.
  absl::flat_hash_map<std::string, int> vocab_;
  // PairKey(left id, right id) -> rank and merged id.
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // Byte -> id of its one-character token, -1 when the vocabulary lacks it.
  std::array<int, 256> byte_ids_{};
  std::vector<std::unique_ptr<bpe::RegexSplitter>> splitters_;

  std::vector<AddedToken> added_;
  absl::flat_hash_map<std::string, int> added_ids_;  // content -> id
  // Per first byte: indexes into added_, longest content first, split by
  // whether the token is matched before (raw) or after normalization.
  std::array<std::vector<int>, 256> raw_by_first_byte_;
  std::array<std::vector<int>, 256> normalized_by_first_byte_;
  bool has_raw_added_ = false;
  bool has_normalized_added_ = false;

  // Decoding: id -> bytes, whether special, whether the id exists.
  std::vector<std::string> id_bytes_;
  std::vector<uint8_t> id_special_;
  std::vector<uint8_t> id_known_;

  // Word (raw bytes) -> ids. Bounded; stops growing when full.
  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int>> cache_
      ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace fusionrl

#endif  // FUSIONRL_TOKENIZER_BPE_TOKENIZER_H_
