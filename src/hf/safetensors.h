// Reads and writes Hugging Face safetensors files and sharded checkpoints
// (https://github.com/huggingface/safetensors), without LibTorch.
//
// File layout: an 8-byte little-endian unsigned header length N, then N bytes
// of UTF-8 JSON (possibly padded with trailing spaces), then the data section.
// The JSON object maps each tensor name to
//   {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [begin, end]}
// (offsets relative to the start of the data section), plus an optional
// "__metadata__" object of string -> string. The tensors cover the data
// section exactly, without overlaps or holes, and each tensor's range holds
// exactly product(shape) * element size bytes (shape [] is one element).
//
// Thread safety: the free functions are pure or touch only their own files;
// safe from any thread. Host byte order must be little-endian (checked at
// compile time), as in the file format.
#ifndef FUSIONRL_HF_SAFETENSORS_H_
#define FUSIONRL_HF_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace fusionrl {

// ---------------------------------------------------------------------------
// Dtypes.

// The element types we read and write. The format's other names (U16, U32,
// U64, F8_E4M3, F8_E5M2, ...) are rejected with an error naming the dtype.
enum class StDtype {
  kF64,
  kF32,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool
};

// The format's name of `dtype`: "F64", "F32", "F16", "BF16", "I64", "I32",
// "I16", "I8", "U8", "BOOL".
std::string_view StDtypeName(StDtype dtype);

// Bytes per element: 8, 4, 2, 2, 8, 4, 2, 1, 1, 1.
size_t StDtypeSize(StDtype dtype);

// The dtype named `name` (exact, case-sensitive, as in the format).
//   InvalidArgument: "unsupported dtype 'F8_E4M3' (supported: F64, ...)".
absl::StatusOr<StDtype> ParseStDtype(std::string_view name);

// ---------------------------------------------------------------------------
// Reading.

// One tensor of a parsed header. begin/end are byte offsets relative to the
// start of the data section; end - begin == product(shape) * element size.
struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;  // every dim >= 0; [] is a scalar
  uint64_t begin = 0;
  uint64_t end = 0;

  uint64_t num_bytes() const { return end - begin; }
  // product(shape); 1 for a scalar.
  uint64_t num_elements() const;
};

// A parsed and validated header.
struct SafetensorsHeader {
  // Sorted by data offset (begin, then end, then name): the order of the
  // bytes in the data section. For files written by WriteSafetensors this is
  // the order the tensors were given in.
  std::vector<StTensorInfo> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__", or empty
  uint64_t header_bytes = 0;  // N, the JSON length including padding
  uint64_t data_offset = 0;   // 8 + N: where the data section starts
  uint64_t data_bytes = 0;    // the data section's length
};

// Largest JSON header accepted (the reference implementation's limit, 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses and validates the whole file `data[0, size)`: header length, JSON,
// each tensor entry (fields, types, dtype, non-negative integer dims, byte
// size == numel * element size, no overflow), that the tensors cover the data
// section exactly (no overlap, hole or trailing bytes), no duplicate names or
// keys, and that "__metadata__" maps strings to strings. Unknown fields in a
// tensor entry are ignored (as the reference implementation does). Does not
// look at the tensor bytes themselves.
//   InvalidArgument: one line naming `file_name` and, where it applies, the
//     tensor, e.g. "model.safetensors: tensor 'model.norm.weight':
//     data_offsets [0, 12] hold 12 bytes but shape [4] of BF16 needs 8".
// REQUIRES: `data` points at `size` readable bytes (any pointer if size==0).
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    const uint8_t* data, size_t size, std::string_view file_name);

// SafetensorsFile: one safetensors file, memory-mapped read-only.
//
// Open() maps the whole file (MAP_PRIVATE, PROT_READ), closes the descriptor
// and validates the header; the mapping lives until the object is destroyed.
// Data() returns views into the mapping, valid while the object lives. Tensor
// bytes are little-endian and may be unaligned (offsets are arbitrary): read
// them with memcpy or the conversion helpers below.
//
// The file must not be truncated or rewritten in place while open (reading a
// truncated mapping raises SIGBUS); our writers replace files by rename, which
// is safe.
//
// Ownership: owns the mapping. Thread safety: immutable after Open(); every
// const method is safe to call concurrently from any number of threads.
class SafetensorsFile {
 public:
  // Maps and validates `path`.
  //   NotFound / PermissionDenied / ...: the file cannot be opened (errno).
  //   InvalidArgument: a directory or non-regular file, an empty file, or any
  //     ParseSafetensorsHeader error (messages start with `path`).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // In data order; see SafetensorsHeader::tensors.
  const std::vector<StTensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const {
    return header_.metadata;
  }
  const SafetensorsHeader& header() const { return header_; }
  uint64_t file_size() const { return size_; }

  // The tensor named `name`, or nullptr. The pointer lives as long as *this.
  const StTensorInfo* Find(std::string_view name) const;

  // The bytes of `info`.
  // REQUIRES: `info` is one of tensors() (aborts if its range lies outside
  // this file's data section).
  absl::Span<const uint8_t> Data(const StTensorInfo& info) const;

 private:
  SafetensorsFile(std::string path, const uint8_t* base, size_t size,
                  SafetensorsHeader header);

  const std::string path_;
  const uint8_t* const base_;  // the mapping, size_ bytes
  const size_t size_;
  const SafetensorsHeader header_;
  absl::flat_hash_map<std::string, size_t> index_;  // name -> tensors() index
};

// ---------------------------------------------------------------------------
// Writing.

// One tensor to write: `bytes` little-endian bytes at `data`, borrowed for the
// duration of the call.
struct StTensorView {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // may be null only when bytes == 0
  size_t bytes = 0;            // must equal product(shape) * element size
};

// Writes one safetensors file: the header JSON (compact; "__metadata__" first
// when `metadata` is not empty, then the tensors in the given order), padded
// with spaces to a multiple of 8 bytes as the reference writer does, then the
// tensor bytes in the given order. The output is a pure function of the
// arguments (byte-for-byte deterministic). Writes `path + ".tmp"`, fsyncs it,
// renames it over `path` and fsyncs the directory, so readers see either the
// old file or the whole new one.
//   InvalidArgument: a duplicate or reserved ("__metadata__") name, a name or
//     metadata string that is not valid UTF-8, a negative dim, or
//     bytes != product(shape) * element size (message names the tensor).
//   Other codes (from errno): the file cannot be written; the .tmp file is
//     removed.
absl::Status WriteSafetensors(
    const std::string& path, const std::vector<StTensorView>& tensors,
    const std::map<std::string, std::string>& metadata);

// Writes `tensors` under directory `dir` (which must exist) as transformers
// does with save_pretrained(safe_serialization=True, max_shard_size=...):
//  - if the tensor bytes total at most `max_shard_bytes` (or there are no
//    tensors): one file, "<base_name>.safetensors", and no index;
//  - else shards "<base_name>-00001-of-0000N.safetensors", ..., filled
//    greedily in the given order (a new shard starts when the next tensor
//    would push the current one past max_shard_bytes; a tensor larger than
//    the limit gets a shard of its own), plus "<base_name>.safetensors.
//    index.json" = {"metadata": {"total_size": <sum of tensor bytes>},
//    "weight_map": {tensor: shard file name}} (2-space indent, sorted keys,
//    trailing newline, as transformers writes it).
// Every shard carries `metadata` in its header. Each file is written
// atomically (see WriteSafetensors); the index is written last. Existing
// files from an earlier save with a different shard count are not removed.
// Returns the paths written (dir + "/" + name), shards in order, index last.
//   InvalidArgument: max_shard_bytes == 0, or any WriteSafetensors argument
//     error. Other codes: I/O errors.
absl::StatusOr<std::vector<std::string>> WriteShardedSafetensors(
    const std::string& dir, const std::vector<StTensorView>& tensors,
    const std::map<std::string, std::string>& metadata,
    uint64_t max_shard_bytes, const std::string& base_name = "model");

// Reads a sharded checkpoint's index ("model.safetensors.index.json") and
// returns its weight_map: tensor name -> shard file name, relative to the
// index's directory. "metadata" may be absent or any object (not checked).
//   NotFound / PermissionDenied / ...: the file cannot be read.
//   InvalidArgument: a directory, not JSON (or a key repeated in an object),
//     not an object, no "weight_map" object, a value that is not a string,
//     or a file name that is empty, absolute, or has a ".." component
//     (message names the index path and the tensor).
absl::StatusOr<std::map<std::string, std::string>> ReadSafetensorsIndex(
    const std::string& index_path);

// ---------------------------------------------------------------------------
// Conversions (pure C++, exact; `src` may be unaligned little-endian bytes).

// bf16 -> f32: exact (bf16 is the top half of an f32); NaN stays NaN.
void Bf16ToF32(const uint8_t* src, float* dst, size_t n);

// IEEE half -> f32: exact, including subnormals, +-0, +-inf and NaN (the
// payload is kept, shifted into the f32 mantissa).
void F16ToF32(const uint8_t* src, float* dst, size_t n);

// f32 -> bf16 (2 bytes each into `dst`, little-endian), rounding to nearest,
// ties to even; overflow rounds to +-inf; NaN stays NaN (sign and top payload
// kept, made quiet so it cannot round to inf).
void F32ToBf16(const float* src, uint8_t* dst, size_t n);

}  // namespace fusionrl

#endif  // FUSIONRL_HF_SAFETENSORS_H_
