// UTF-8 checks, NFC, the GPT-2 byte table and the PCRE2 regex split of
// byte-level BPE (see bpe_text.h).
#include "tokenizer/bpe_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8

#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fusionrl::bpe {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// For a lead byte: the number of continuation bytes and the allowed range of
// the first one (which excludes overlongs, surrogates and > U+10FFFF).
// need < 0: not a valid lead byte.
struct LeadInfo {
  int need;
  unsigned char lo;
  unsigned char hi;
};

LeadInfo Lead(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
    return {2, 0x80, 0xBF};
  }
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {-1, 0, 0};
}

// Length of the valid sequence at s[i] (REQUIRES: s[i] >= 0x80), or the
// negated length of its maximal invalid subpart (at least 1).
int SequenceAt(std::string_view s, size_t i) {
  const LeadInfo lead = Lead(static_cast<unsigned char>(s[i]));
  if (lead.need < 0) return -1;
  size_t j = i + 1;
  for (int k = 0; k < lead.need; ++k, ++j) {
    const unsigned char lo = k == 0 ? lead.lo : 0x80;
    const unsigned char hi = k == 0 ? lead.hi : 0xBF;
    if (j >= s.size()) return -static_cast<int>(j - i);
    const auto c = static_cast<unsigned char>(s[j]);
    if (c < lo || c > hi) return -static_cast<int>(j - i);
  }
  return static_cast<int>(j - i);
}

struct ByteTable {
  std::array<std::string, 256> to_unicode;
  // code point (< 324) -> byte + 1, 0 = not in the table.
  std::array<uint16_t, 324> from_unicode{};
};

const ByteTable& Table() {
  static const ByteTable* const table = [] {
    auto* t = new ByteTable;
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') ||
                             (b >= 0xA1 && b <= 0xAC) ||
                             (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? b : 256 + extra++;
      AppendUtf8(cp, &t->to_unicode[b]);
      t->from_unicode[cp] = static_cast<uint16_t>(b + 1);
    }
    return t;
  }();
  return *table;
}

// Per-thread PCRE2 matching state: match data for the whole-match ovector
// and a JIT stack large enough for long whitespace runs.
struct MatchState {
  MatchState()
      : data(pcre2_match_data_create(1, nullptr)),
        context(pcre2_match_context_create(nullptr)),
        jit_stack(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
    if (jit_stack != nullptr) {
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
  }
  ~MatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  }
  pcre2_match_data* data;
  pcre2_match_context* context;
  pcre2_jit_stack* jit_stack;
};

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  if (n < 0) return absl::StrCat("PCRE2 error ", code);
  return std::string(reinterpret_cast<const char*>(buffer), n);
}

}  // namespace

size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // Skip ASCII eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t word;
      __builtin_memcpy(&word, s.data() + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const int len = SequenceAt(s, i);
    if (len < 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

void AppendUtf8Lossy(std::string_view bytes, std::string* out) {
  out->reserve(out->size() + bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (b < 0x80) {
      out->push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    const int len = SequenceAt(bytes, i);
    if (len > 0) {
      out->append(bytes.substr(i, len));
      i += len;
    } else {
      out->append(kReplacement);
      i += -len;
    }
  }
}

// Whether `s` is certainly in NFC: every code point is below U+0300 or in
// one of the ranges below, all of whose characters have NFC_Quick_Check=Yes,
// canonical combining class 0 and are never the second character of a
// canonical composition (checked against Unicode 14 with Python's
// unicodedata). Such a string is its own NFC; anything else (combining
// marks, compatibility ideographs, Hangul jamo, ...) goes to utf8proc.
static bool SurelyNfc(std::string_view s) {
  static constexpr uint32_t kRanges[][2] = {
      {0x0391, 0x03A1},   {0x03A3, 0x03A9},   {0x03B1, 0x03C9},
      {0x0400, 0x0482},   {0x048A, 0x04FF},   {0x05D0, 0x05EA},
      {0x0621, 0x063A},   {0x0641, 0x064A},   {0x0904, 0x0939},
      {0x0E01, 0x0E30},   {0x2010, 0x2027},   {0x2030, 0x205E},
      {0x2190, 0x22FF},   {0x2460, 0x27BF},   {0x3000, 0x3029},
      {0x3041, 0x3096},   {0x30A1, 0x30FA},   {0x3400, 0x4DBF},
      {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3},   {0xFF01, 0xFFBE},
      {0x1F300, 0x1F6D7}, {0x1F900, 0x1F9FF},
  };
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0xCC) {  // a code point below U+0300 (or a continuation byte)
      ++i;
      continue;
    }
    uint32_t cp;
    if (b < 0xE0) {
      cp = ((b & 0x1F) << 6) | (s[i + 1] & 0x3F);
      i += 2;
    } else if (b < 0xF0) {
      cp = ((b & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
      i += 3;
    } else {
      cp = ((b & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) |
           ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
      i += 4;
    }
    bool safe = false;
    for (const auto& range : kRanges) {
      if (cp < range[0]) break;
      if (cp <= range[1]) {
        safe = true;
        break;
      }
    }
    if (!safe) return false;
  }
  return true;
}

absl::StatusOr<bool> NfcNormalize(std::string_view s, std::string* out) {
  if (SurelyNfc(s)) return false;
  utf8proc_uint8_t* normalized = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
      static_cast<utf8proc_ssize_t>(s.size()), &normalized,
      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NFC normalization failed: ", utf8proc_errmsg(n)));
  }
  out->assign(reinterpret_cast<const char*>(normalized), n);
  std::free(normalized);
  return true;
}

const std::string& ByteToUnicode(unsigned char b) {
  return Table().to_unicode[b];
}

bool UnicodeToBytes(std::string_view token, std::string* out) {
  const ByteTable& table = Table();
  const size_t start = out->size();
  size_t i = 0;
  while (i < token.size()) {
    const auto b = static_cast<unsigned char>(token[i]);
    uint32_t cp;
    int len;
    if (b < 0x80) {
      cp = b;
      len = 1;
    } else if ((b & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp =
          ((b & 0x1F) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3F);
      len = 2;
    } else {
      cp = 0xFFFFFFFF;  // three- and four-byte characters are never in it
      len = 1;
    }
    if (cp >= table.from_unicode.size() || table.from_unicode[cp] == 0) {
      out->resize(start);
      return false;
    }
    out->push_back(static_cast<char>(table.from_unicode[cp] - 1));
    i += len;
  }
  return true;
}

absl::StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::Create(
    std::string_view pattern, bool literal) {
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (literal) options |= PCRE2_LITERAL;
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()),
                                   pattern.size(), options, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "regex '", absl::string_view(pattern.data(), pattern.size()),
        "' does not compile: ", Pcre2Message(error_code), " at offset ",
        error_offset));
  }
  // JIT when available; pcre2_match() uses it transparently, and falls back
  // to the interpreter when compilation failed.
  const bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<RegexSplitter>(new RegexSplitter(code, jit));
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(code_); }

absl::Status RegexSplitter::Split(std::string_view text,
                                  std::vector<std::string_view>* pieces) const {
  thread_local MatchState state;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t start = 0;
  size_t last_end = 0;
  while (start < n) {
    const int rc = pcre2_match(code_, subject, n, start, PCRE2_NO_UTF_CHECK,
                               state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("pre-tokenizer regex failed at byte ", start, ": ",
                       Pcre2Message(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    const size_t match_start = ovector[0];
    const size_t match_end = ovector[1];
    if (match_end == match_start) {
      // An empty match yields no piece; move on by one character.
      start = match_start + 1;
      while (start < n &&
             (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
        ++start;
      }
      continue;
    }
    if (match_start > last_end) {
      pieces->push_back(text.substr(last_end, match_start - last_end));
    }
    pieces->push_back(text.substr(match_start, match_end - match_start));
    last_end = match_end;
    start = match_end;
  }
  if (last_end < n) pieces->push_back(text.substr(last_end));
  return absl::OkStatus();
}

}  // namespace fusionrl::bpe
