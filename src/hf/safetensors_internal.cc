// Helpers shared by the safetensors reader and writer.
#include "hf/safetensors_internal.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace fusionrl {
namespace hf_internal {

// `s` made printable on one line: control bytes (and, unless keep_utf8,
// every byte >= 0x80) become \xNN.
std::string Printable(std::string_view s, bool keep_utf8) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f || (!keep_utf8 && c >= 0x80)) {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or code points
// past U+10FFFF), the rule the JSON parser and writer enforce.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < static_cast<size_t>(len)) return false;
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      return false;
    }
    i += len;
  }
  return true;
}

// product(shape) * elem_size, or false on a negative dim or 64-bit overflow.
bool ByteSize(const std::vector<int64_t>& shape, size_t elem_size,
              uint64_t* numel_out, uint64_t* bytes_out) {
  uint64_t numel = 1;
  bool zero = false;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d == 0) zero = true;
    if (!overflow &&
        __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
      overflow = true;
    }
  }
  // A zero dim makes the tensor empty even if other dims multiply past 2^64.
  if (zero) {
    *numel_out = 0;
    *bytes_out = 0;
    return true;
  }
  if (overflow) return false;
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(elem_size), &bytes)) {
    return false;
  }
  *numel_out = numel;
  *bytes_out = bytes;
  return true;
}

// Parses text[0, n) into *root, or returns the reason (one printable line).
absl::Status ParseJson(const char* text, size_t n, JsonGuard* guard,
                       nlohmann::json* root) {
  try {
    *root = nlohmann::json::parse(text, text + n, std::ref(*guard));
  } catch (const JsonTooDeep&) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON nests deeper than ", kMaxJsonDepth, " levels"));
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(Printable(e.what(), false));
  }
  return absl::OkStatus();
}

absl::Status ErrnoError(int err, const std::string& path,
                        std::string_view what) {
  return absl::ErrnoToStatus(err, absl::StrCat(path, ": ", Av(what)));
}

}  // namespace hf_internal
}  // namespace fusionrl
