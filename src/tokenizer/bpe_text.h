// The text-side stages of byte-level BPE that run before the merges, as the
// Hugging Face `tokenizers` reference runs them: UTF-8 validation, NFC
// normalization (utf8proc), the pre-tokenizer's regex split (PCRE2), and the
// GPT-2 byte <-> printable-character table of the ByteLevel pre-tokenizer and
// decoder.
//
// Thread safety: the free functions are pure; a RegexSplitter is immutable
// after Create() and may be shared between threads (each thread matches with
// its own thread-local PCRE2 match data and JIT stack).
#ifndef FUSIONRL_TOKENIZER_BPE_TEXT_H_
#define FUSIONRL_TOKENIZER_BPE_TEXT_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// pcre2.h needs PCRE2_CODE_UNIT_WIDTH; only the .cc includes it.
struct pcre2_real_code_8;

namespace fusionrl::bpe {

// Byte offset of the first byte of the first invalid UTF-8 sequence in `s`
// (overlong forms, surrogates and code points above U+10FFFF are invalid),
// or std::string_view::npos when `s` is valid.
size_t FindInvalidUtf8(std::string_view s);

// Appends `bytes` to `out`, replacing each maximal invalid UTF-8 subpart by
// U+FFFD (the policy of Rust's String::from_utf8_lossy and of the WHATWG
// decoder, which the reference decoder uses).
void AppendUtf8Lossy(std::string_view bytes, std::string* out);

// Unicode NFC of `s`. REQUIRES: `s` is valid UTF-8. Returns false (and leaves
// `out` untouched) when a quick scan shows `s` is already in NFC (ASCII,
// Latin-1, and the common letter, CJK, kana, Hangul, punctuation and emoji
// ranges without combining marks), so callers can keep using `s`.
absl::StatusOr<bool> NfcNormalize(std::string_view s, std::string* out);

// The GPT-2 table: byte b -> the UTF-8 of the printable character that
// stands for it in byte-level vocabularies (e.g. ' ' -> "Ġ", '\n' -> "Ċ").
const std::string& ByteToUnicode(unsigned char b);

// Inverse of the table for a whole token string: appends the bytes its
// characters stand for and returns true, or returns false (appending
// nothing) when some character is not in the table.
bool UnicodeToBytes(std::string_view token, std::string* out);

// The regex of GPT-2's ByteLevel pre-tokenizer (use_regex: true).
inline constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

// A compiled `Split` pre-tokenizer with behavior "Isolated" and invert false:
// every match is a piece, and so is every stretch of text between matches.
// Matches with PCRE2 in UTF + UCP mode, JIT-compiled when the platform
// supports it (falls back to the interpreter otherwise).
class RegexSplitter {
 public:
  // `literal`: the pattern is a plain string ({"String": ...}), not a regex.
  // InvalidArgument with PCRE2's message and offset for a bad pattern.
  static absl::StatusOr<std::unique_ptr<RegexSplitter>> Create(
      std::string_view pattern, bool literal);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the pieces of `text` (views into it, none empty, in order,
  // covering it exactly) to `pieces`. REQUIRES: `text` is valid UTF-8.
  absl::Status Split(std::string_view text,
                     std::vector<std::string_view>* pieces) const;

  bool jit() const { return jit_; }

 private:
  RegexSplitter(pcre2_real_code_8* code, bool jit) : code_(code), jit_(jit) {}

  pcre2_real_code_8* code_;  // owned
  bool jit_;
};

}  // namespace fusionrl::bpe

#endif  // FUSIONRL_TOKENIZER_BPE_TEXT_H_
