// Safetensors reading: dtypes, header parsing and validation, the
// memory-mapped SafetensorsFile, and the bf16/f16 conversions.
#include "hf/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "hf/safetensors_internal.h"
#include "nlohmann/json.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fusionrl_hf assumes a little-endian host (safetensors is little-endian)"
#endif

namespace fusionrl {
namespace {

using hf_internal::Av;
using hf_internal::ByteSize;
using hf_internal::ErrnoError;
using hf_internal::FileDescriptor;
using hf_internal::JsonGuard;
using hf_internal::kMetadataKey;
using hf_internal::ParseJson;
using hf_internal::Printable;
using hf_internal::ShapeString;
using Json = nlohmann::json;

struct DtypeEntry {
  StDtype dtype;
  std::string_view name;
  size_t size;
};
constexpr DtypeEntry kDtypes[] = {
    {StDtype::kF64, "F64", 8}, {StDtype::kF32, "F32", 4},
    {StDtype::kF16, "F16", 2}, {StDtype::kBF16, "BF16", 2},
    {StDtype::kI64, "I64", 8}, {StDtype::kI32, "I32", 4},
    {StDtype::kI16, "I16", 2}, {StDtype::kI8, "I8", 1},
    {StDtype::kU8, "U8", 1},   {StDtype::kBool, "BOOL", 1},
};

// A short description of `v` for an error message: the value itself if it is
// a scalar (strings cut at 40 bytes), else its type and size. Never recurses.
std::string Describe(const Json& v) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    return absl::StrCat("\"", Printable(s.substr(0, 40), false),
                        s.size() > 40 ? "...\"" : "\"");
  }
  if (v.is_primitive()) return Printable(v.dump(), false);
  return absl::StrCat("a JSON ", v.type_name(), " of ", v.size(),
                      v.is_array() ? " elements" : " keys");
}

// A JSON number that is a non-negative integer fitting in uint64.
bool AsUint64(const Json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {  // signed: only if non-negative
    const int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = static_cast<uint64_t>(s);
    return true;
  }
  return false;
}

absl::Status ParseTensorEntry(std::string_view file_name,
                              const std::string& name, const Json& entry,
                              uint64_t data_bytes, StTensorInfo* info) {
  const std::string where =
      absl::StrCat(Av(file_name), ": tensor '", Printable(name), "': ");
  auto error = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(where, parts...));
  };
  if (!entry.is_object()) {
    return error("entry is a JSON ", entry.type_name(), ", not an object");
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) return error("missing field '", field, "'");
  }
  info->name = name;

  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) {
    return error("field 'dtype' is a JSON ", dtype.type_name(),
                 ", not a string");
  }
  absl::StatusOr<StDtype> parsed =
      ParseStDtype(dtype.get_ref<const std::string&>());
  if (!parsed.ok()) return error(parsed.status().message());
  info->dtype = *parsed;

  const Json& shape = entry["shape"];
  if (!shape.is_array()) {
    return error("field 'shape' is a JSON ", shape.type_name(),
                 ", not an array");
  }
  info->shape.clear();
  info->shape.reserve(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    const Json& d = shape[i];
    if (d.is_number_integer() && !d.is_number_unsigned() &&
        d.get<int64_t>() < 0) {
      return error("shape dim ", i, " is negative (", d.get<int64_t>(), ")");
    }
    uint64_t u;
    if (!AsUint64(d, &u)) {
      return error("shape dim ", i, " is not an integer (", Describe(d), ")");
    }
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return error("shape dim ", i, " (", u, ") is too large");
    }
    info->shape.push_back(static_cast<int64_t>(u));
  }

  const Json& offsets = entry["data_offsets"];
  uint64_t begin = 0, end = 0;
  if (!offsets.is_array() || offsets.size() != 2 ||
      !AsUint64(offsets[0], &begin) || !AsUint64(offsets[1], &end)) {
    return error(
        "field 'data_offsets' must be [begin, end] of non-negative "
        "integers, got ",
        Describe(offsets));
  }
  info->begin = begin;
  info->end = end;
  const std::string range =
      absl::StrCat("data_offsets [", begin, ", ", end, "]");
  if (begin > end) return error(range, " have begin > end");
  if (end > data_bytes) {
    return error(range, " run past the end of the data section (", data_bytes,
                 " bytes)");
  }
  uint64_t numel, needed;
  if (!ByteSize(info->shape, StDtypeSize(info->dtype), &numel, &needed)) {
    return error("shape ", ShapeString(info->shape), " of ",
                 Av(StDtypeName(info->dtype)), " overflows 64-bit byte size");
  }
  if (end - begin != needed) {
    return error(range, " hold ", end - begin, " bytes but shape ",
                 ShapeString(info->shape), " of ", Av(StDtypeName(info->dtype)),
                 " needs ", needed);
  }
  return absl::OkStatus();
}

absl::Status ParseMetadata(std::string_view file_name, const Json& value,
                           std::map<std::string, std::string>* out) {
  if (value.is_null()) return absl::OkStatus();  // serde's Option: None
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Av(file_name), ": '__metadata__' is a JSON ",
                     value.type_name(), ", not an object of strings"));
  }
  for (const auto& [k, v] : value.items()) {
    if (!v.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          Av(file_name), ": '__metadata__' value of key '", Printable(k),
          "' is a JSON ", v.type_name(), ", not a string"));
    }
    (*out)[k] = v.get<std::string>();
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// Dtypes.

std::string_view StDtypeName(StDtype dtype) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

size_t StDtypeSize(StDtype dtype) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.dtype == dtype) return e.size;
  }
  std::fprintf(stderr, "StDtypeSize: invalid StDtype %d\n",
               static_cast<int>(dtype));
  std::abort();
}

absl::StatusOr<StDtype> ParseStDtype(std::string_view name) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.name == name) return e.dtype;
  }
  std::vector<absl::string_view> names;
  for (const DtypeEntry& e : kDtypes) names.push_back(Av(e.name));
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype '", Printable(name, false),
                   "' (supported: ", absl::StrJoin(names, ", "), ")"));
}

uint64_t StTensorInfo::num_elements() const {
  uint64_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
  return numel;
}

// ---------------------------------------------------------------------------
// Parsing.

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    const uint8_t* data, size_t size, std::string_view file_name) {
  auto error = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat(Av(file_name), ": ", parts...));
  };
  if (size < 8) {
    return error("file is ", size,
                 " bytes, too short for the 8-byte header length");
  }
  uint64_t n;
  std::memcpy(&n, data, 8);  // little-endian host
  if (n > kMaxSafetensorsHeaderBytes) {
    return error("header length ", n, " exceeds the limit of ",
                 kMaxSafetensorsHeaderBytes, " bytes");
  }
  if (n > size - 8) {
    return error("header length ", n, " runs past the end of the file (",
                 size - 8, " bytes follow the length)");
  }
  SafetensorsHeader header;
  header.header_bytes = n;
  header.data_offset = 8 + n;
  header.data_bytes = size - 8 - n;

  const char* text = reinterpret_cast<const char*>(data + 8);
  if (n == 0 || text[0] != '{') {
    return error("header is not a JSON object (it must start with '{')");
  }
  JsonGuard duplicates;
  Json root;
  absl::Status parsed = ParseJson(text, n, &duplicates, &root);
  if (!parsed.ok())
    return error("header is not valid JSON: ", parsed.message());
  if (!root.is_object()) {  // a callback could discard it; not expected
    return error("header is not a JSON object");
  }
  if (duplicates.found) {
    if (duplicates.at_top_level && duplicates.key == kMetadataKey) {
      return error("'__metadata__' appears more than once in the header");
    }
    if (duplicates.at_top_level) {
      return error("tensor '", Printable(duplicates.key),
                   "' appears more than once in the header");
    }
    return error("tensor '", Printable(duplicates.owner), "': key '",
                 Printable(duplicates.key), "' appears more than once");
  }

  header.tensors.reserve(root.size());
  for (const auto& [name, entry] : root.items()) {
    if (name == kMetadataKey) {
      FUSIONRL_RETURN_IF_ERROR(
          ParseMetadata(file_name, entry, &header.metadata));
      continue;
    }
    StTensorInfo info;
    FUSIONRL_RETURN_IF_ERROR(
        ParseTensorEntry(file_name, name, entry, header.data_bytes, &info));
    header.tensors.push_back(std::move(info));
  }

  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const StTensorInfo& a, const StTensorInfo& b) {
              return std::tie(a.begin, a.end, a.name) <
                     std::tie(b.begin, b.end, b.name);
            });
  uint64_t covered = 0;  // [0, covered) is covered so far
  const StTensorInfo* previous = nullptr;
  for (const StTensorInfo& t : header.tensors) {
    if (t.begin < covered) {
      return error("tensor '", Printable(t.name), "': data_offsets [", t.begin,
                   ", ", t.end, "] overlap tensor '", Printable(previous->name),
                   "' [", previous->begin, ", ", previous->end, "]");
    }
    if (t.begin > covered) {
      return error("data bytes [", covered, ", ", t.begin,
                   ") are not covered by any tensor (a hole before tensor '",
                   Printable(t.name), "')");
    }
    covered = t.end;
    previous = &t;
  }
  if (covered != header.data_bytes) {
    return error("the tensors cover ", covered, " of the ", header.data_bytes,
                 " data bytes (", header.data_bytes - covered,
                 " trailing bytes not covered by any tensor)");
  }
  return header;
}

// ---------------------------------------------------------------------------
// SafetensorsFile.

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError(errno, path, "cannot open");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, path, "fstat");
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a directory, not a safetensors file"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  if (st.st_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": empty file (a safetensors file starts with an 8-byte header "
        "length)"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) return ErrnoError(errno, path, "mmap failed");
  fd.Close();  // the mapping keeps the file alive
  const uint8_t* base = static_cast<const uint8_t*>(map);
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(base, size, path);
  if (!header.ok()) {
    ::munmap(map, size);
    return header.status();
  }
  return std::unique_ptr<SafetensorsFile>(
      new SafetensorsFile(path, base, size, *std::move(header)));
}

SafetensorsFile::SafetensorsFile(std::string path, const uint8_t* base,
                                 size_t size, SafetensorsHeader header)
    : path_(std::move(path)),
      base_(base),
      size_(size),
      header_(std::move(header)) {
  index_.reserve(header_.tensors.size());
  for (size_t i = 0; i < header_.tensors.size(); ++i) {
    index_.emplace(header_.tensors[i].name, i);
  }
}

SafetensorsFile::~SafetensorsFile() {
  ::munmap(const_cast<uint8_t*>(base_), size_);
}

const StTensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(Av(name));
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

absl::Span<const uint8_t> SafetensorsFile::Data(
    const StTensorInfo& info) const {
  if (info.begin > info.end || info.end > header_.data_bytes) {
    std::fprintf(stderr,
                 "SafetensorsFile::Data: tensor '%s' [%llu, %llu] is not in "
                 "%s (%llu data bytes)\n",
                 info.name.c_str(), static_cast<unsigned long long>(info.begin),
                 static_cast<unsigned long long>(info.end), path_.c_str(),
                 static_cast<unsigned long long>(header_.data_bytes));
    std::abort();
  }
  return absl::Span<const uint8_t>(base_ + header_.data_offset + info.begin,
                                   info.end - info.begin);
}

// ---------------------------------------------------------------------------
// Conversions.

void Bf16ToF32(const uint8_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}

void F16ToF32(const uint8_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0) {
      if (mant == 0) {
        bits = sign;       // +-0
      } else {             // subnormal: mant * 2^-24, normalize
        uint32_t e = 113;  // 127 - 15 + 1
        while ((mant & 0x400u) == 0) {
          mant <<= 1;
          --e;
        }
        bits = sign | (e << 23) | ((mant & 0x3FFu) << 13);
      }
    } else if (exp == 0x1F) {
      bits = sign | 0x7F800000u | (mant << 13);  // inf, or NaN with payload
    } else {
      bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    std::memcpy(dst + i, &bits, 4);
  }
}

void F32ToBf16(const float* src, uint8_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + i, 4);
    uint16_t out;
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
      out = static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
    } else {
      out = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    }
    std::memcpy(dst + 2 * i, &out, 2);
  }
}

}  // namespace fusionrl
