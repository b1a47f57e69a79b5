// Helpers shared by the safetensors reader and writer; private to src/hf.
#ifndef FUSIONRL_HF_SAFETENSORS_INTERNAL_H_
#define FUSIONRL_HF_SAFETENSORS_INTERNAL_H_

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace hf_internal {

inline constexpr std::string_view kMetadataKey = "__metadata__";

// Debian's Abseil has its own absl::string_view, which does not convert from
// std::string_view implicitly.
inline absl::string_view Av(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

// `s` made printable on one line: control bytes (and, unless keep_utf8,
// every byte >= 0x80) become \xNN.
std::string Printable(std::string_view s, bool keep_utf8 = true);

// "[2, 3]"; "[]" for a scalar.
std::string ShapeString(const std::vector<int64_t>& shape);

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or code points
// past U+10FFFF), the rule the JSON parser and writer enforce.
bool IsValidUtf8(std::string_view s);

// product(shape) * elem_size into *numel_out / *bytes_out; false on a
// negative dim or 64-bit overflow (a zero dim gives 0 even if other dims
// multiply past 2^64).
bool ByteSize(const std::vector<int64_t>& shape, size_t elem_size,
              uint64_t* numel_out, uint64_t* bytes_out);

// Deepest JSON nesting accepted. A valid header nests 3 deep (root, entry,
// shape); the limit keeps a hostile "[[[[..." header from costing gigabytes.
inline constexpr int kMaxJsonDepth = 64;

// Thrown from the parser callback (and caught in ParseJson) to stop parsing.
struct JsonTooDeep {};

// A parser callback that stops at kMaxJsonDepth and records the first
// duplicate key anywhere in the document while the DOM is built
// (nlohmann::json objects keep one value per key, so duplicates are invisible
// afterwards). One guard per parse; not thread-safe.
struct JsonGuard {
  std::vector<std::set<std::string>> open_objects;
  std::string top_level_key;  // the most recent key of the root object
  bool found = false;
  bool at_top_level = false;
  std::string key;    // the duplicated key
  std::string owner;  // the root key whose entry holds it (if nested)

  bool operator()(int depth, nlohmann::json::parse_event_t event,
                  nlohmann::json& parsed) {
    switch (event) {
      case nlohmann::json::parse_event_t::object_start:
        if (depth >= kMaxJsonDepth) throw JsonTooDeep();
        open_objects.emplace_back();
        break;
      case nlohmann::json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) throw JsonTooDeep();
        break;
      case nlohmann::json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case nlohmann::json::parse_event_t::key: {
        if (open_objects.empty() || !parsed.is_string()) break;
        const std::string& k = parsed.get_ref<const std::string&>();
        if (open_objects.size() == 1) top_level_key = k;
        if (!open_objects.back().insert(k).second && !found) {
          found = true;
          key = k;
          at_top_level = open_objects.size() == 1;
          owner = top_level_key;
        }
        break;
      }
      default:
        break;
    }
    return true;
  }
};

// Parses text[0, n) into *root through `guard`, or returns the reason as
// one printable line (InvalidArgument). Never throws.
absl::Status ParseJson(const char* text, size_t n, JsonGuard* guard,
                       nlohmann::json* root);

// Owns a file descriptor; closes it on destruction.
// Thread safety: not thread-safe.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() { Close(); }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  // Closes now; returns close()'s errno, or 0.
  int Close() {
    if (fd_ < 0) return 0;
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

// ErrnoToStatus(err, "<path>: <what>").
absl::Status ErrnoError(int err, const std::string& path,
                        std::string_view what);

}  // namespace hf_internal
}  // namespace fusionrl

#endif  // FUSIONRL_HF_SAFETENSORS_INTERNAL_H_
