// Helpers shared by the hf_test files: temp dirs, hand-built safetensors
// bytes, and the invariants every parsed header must satisfy.
#ifndef FUSIONRL_HF_SAFETENSORS_TEST_UTIL_H_
#define FUSIONRL_HF_SAFETENSORS_TEST_UTIL_H_

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hf/safetensors.h"

namespace fusionrl {
namespace hf_testing {

// ---------------------------------------------------------------------------
// Helpers.

// A fresh directory under TEST_TMPDIR (or /tmp), removed with its files
// (not recursively). Not thread-safe.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl =
        absl::StrCat(base != nullptr ? base : "/tmp", "/hf_test.XXXXXX");
    char* made = ::mkdtemp(tmpl.data());
    if (made == nullptr) std::abort();
    path_ = made;
  }
  ~TempDir() {
    for (const std::string& f : Files()) ::unlink((path_ + "/" + f).c_str());
    ::rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    DIR* d = ::opendir(path_.c_str());
    if (d == nullptr) return out;
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string LengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out;
}

// 8-byte length + header + data.
inline std::string MakeFile(const std::string& header,
                            const std::string& data) {
  return LengthPrefix(header.size()) + header + data;
}

inline absl::StatusOr<SafetensorsHeader> Parse(const std::string& bytes) {
  return ParseSafetensorsHeader(reinterpret_cast<const uint8_t*>(bytes.data()),
                                bytes.size(), "bad.safetensors");
}

// The error message of parsing `bytes`; fails the test if it parses.
inline std::string ParseError(const std::string& bytes) {
  absl::StatusOr<SafetensorsHeader> h = Parse(bytes);
  EXPECT_FALSE(h.ok()) << "parsed unexpectedly";
  if (h.ok()) return "";
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(h.status().message()),
              ::testing::StartsWith("bad.safetensors: "));
  EXPECT_EQ(h.status().message().find('\n'), std::string::npos);
  return std::string(h.status().message());
}

inline std::string Entry(const std::string& dtype, const std::string& shape,
                         uint64_t begin, uint64_t end) {
  return absl::StrCat("{\"dtype\":\"", dtype, "\",\"shape\":", shape,
                      ",\"data_offsets\":[", begin, ",", end, "]}");
}

inline std::string Bytes(size_t n, uint8_t seed = 1) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(seed + 7 * i);
  return out;
}

inline StTensorView View(const std::string& name, StDtype dtype,
                         std::vector<int64_t> shape, const std::string& bytes) {
  return StTensorView{name, dtype, std::move(shape), bytes.data(),
                      bytes.size()};
}

inline std::string SpanString(absl::Span<const uint8_t> s) {
  return std::string(reinterpret_cast<const char*>(s.data()), s.size());
}

// Checks what every successfully parsed header must satisfy.
inline void ExpectConsistent(const SafetensorsHeader& h, size_t file_size) {
  ASSERT_EQ(h.data_offset, 8 + h.header_bytes);
  ASSERT_EQ(h.data_offset + h.data_bytes, file_size);
  uint64_t covered = 0;
  for (const StTensorInfo& t : h.tensors) {
    ASSERT_EQ(t.begin, covered);
    ASSERT_LE(t.begin, t.end);
    ASSERT_EQ(t.num_bytes(), t.num_elements() * StDtypeSize(t.dtype));
    covered = t.end;
  }
  ASSERT_EQ(covered, h.data_bytes);
}

}  // namespace hf_testing
}  // namespace fusionrl

#endif  // FUSIONRL_HF_SAFETENSORS_TEST_UTIL_H_
