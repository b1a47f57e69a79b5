// Byte-level BPE at work: encoding (added tokens, normalizer, split, merges)
// and decoding. Loading is in bpe_tokenizer_load.cc; see bpe_tokenizer.h.
#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <queue>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "tokenizer/bpe_text.h"

namespace fusionrl {
namespace {

// Debian's Abseil has its own string_view type; convert at its API.
absl::string_view Av(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

// Words up to this many bytes are cached; the cache stops growing at
// kCacheCapacity words (the reference keeps 10,000).
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kCacheCapacity = 100000;
// Words with more symbols than this merge through a heap (O(n log n))
// instead of rescanning the pair ranks (O(n^2) on small ints).
constexpr size_t kLongWordSymbols = 48;

}  // namespace

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
    return absl::InvalidArgumentError(
        absl::StrFormat("invalid UTF-8 at byte offset %d (byte 0x%02X)", bad,
                        static_cast<unsigned char>(text[bad])));
  }
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 4);
  FUSIONRL_RETURN_IF_ERROR(SplitOnAddedTokens(
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
      FUSIONRL_RETURN_IF_ERROR(on_text(text.substr(last, i - last)));
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
      FUSIONRL_RETURN_IF_ERROR(splitter->Split(piece, &next));
    }
    pieces.swap(next);
  }
  for (std::string_view word : pieces) {
    FUSIONRL_RETURN_IF_ERROR(EncodeWord(word, ids));
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::EncodeWord(std::string_view word,
                                      std::vector<int>* ids) const {
  if (word.empty()) return absl::OkStatus();
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu_);
    if (auto it = cache_.find(Av(word)); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }
  std::vector<int> symbols;
  FUSIONRL_RETURN_IF_ERROR(BpeWord(word, &symbols));
  ids->insert(ids->end(), symbols.begin(), symbols.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() < kCacheCapacity) {
      cache_.try_emplace(std::string(word), symbols);
    }
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::BpeWord(std::string_view word,
                                   std::vector<int>* symbols) const {
  if (ignore_merges_) {  // a word in the vocabulary is its own token
    std::string mapped;
    for (char c : word) mapped += bpe::ByteToUnicode(c);
    if (auto it = vocab_.find(mapped); it != vocab_.end()) {
      symbols->push_back(it->second);
      return absl::OkStatus();
    }
  }
  symbols->reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const int id = byte_ids_[static_cast<unsigned char>(word[i])];
    if (id < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the vocabulary has no token for byte 0x%02X (byte %d of the "
          "pre-tokenized word '%s')",
          static_cast<unsigned char>(word[i]), i, Av(word)));
    }
    symbols->push_back(id);
  }
  if (symbols->size() > kLongWordSymbols) {
    MergeSymbolsLong(symbols);
  } else {
    MergeSymbols(symbols);
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
      heap.push(
          {it->second.rank, pos, sym[pos].id, sym[next].id, it->second.new_id});
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
  std::string bytes;
  for (int id : ids) {
    if (id < 0 || id >= vocab_size_ || !id_known_[id]) {
      // An id the tokenizer does not know (a model's vocabulary is often
      // larger than its tokenizer's: Qwen's 151936 against 151669) decodes
      // to nothing, as Hugging Face tokenizers' decode skips it.
      continue;
    }
    if (!(skip_special && id_special_[id])) {
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

}  // namespace fusionrl
