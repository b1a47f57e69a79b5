// The chunk protocol of fusionrl.v1.WeightService, without gRPC: splitting a
// version into WeightChunk messages and checking and reassembling a stream of
// them. Shared by the service (PublishWeights in, FetchWeights out) and the
// client helpers (weight_client.h), and tested on its own.
//
// A version of N bytes travels as chunks with consecutive offsets covering
// [0, N); every chunk carries the job id, version, super node, its offset,
// its data and the CRC-32C of that data; the last chunk (and only it) has
// last = true, total_bytes = N and version_crc32c = CRC-32C of all N bytes.
// An empty version is one chunk: offset 0, no data, last.
#ifndef FUSIONRL_RPC_WEIGHT_CHUNKS_H_
#define FUSIONRL_RPC_WEIGHT_CHUNKS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fusionrl/v1/weight.pb.h"

namespace fusionrl::rpc {

// Most data bytes one chunk may carry; a larger chunk is INVALID_ARGUMENT.
inline constexpr size_t kMaxWeightChunkBytes = size_t{4} << 20;
// The chunk size the service and the helpers use unless told otherwise.
inline constexpr size_t kDefaultWeightChunkBytes = size_t{1} << 20;
// A WeightChunk message of kMaxWeightChunkBytes data plus its other fields
// stays under this many bytes. gRPC receivers allow 4 MiB per message by
// default; a server (or a fetching channel) that must accept chunks larger
// than about 4 MiB - 64 KiB must raise its limit to this:
//   builder.SetMaxReceiveMessageSize(kMaxWeightChunkMessageBytes);
inline constexpr int kMaxWeightChunkMessageBytes =
    static_cast<int>(kMaxWeightChunkBytes + (size_t{64} << 10));

// WeightChunker: produces the chunks of one version, in order.
//
// Ownership: `bytes` is borrowed and must outlive the chunker.
// Thread safety: not thread-safe; one user at a time.
class WeightChunker {
 public:
  // `version_crc32c`: the CRC-32C of `bytes` when the caller already knows it
  // (the store computed it at Put); it goes on the last chunk as is, so a
  // reader also detects bytes damaged after they were stored. Without it,
  // the chunker derives it from the chunk CRCs (no extra pass).
  // REQUIRES: 1 <= chunk_bytes <= kMaxWeightChunkBytes (aborts otherwise).
  WeightChunker(std::string job_id, int64_t version, std::string super_node,
                absl::string_view bytes, size_t chunk_bytes,
                std::optional<uint32_t> version_crc32c = std::nullopt);

  WeightChunker(const WeightChunker&) = delete;
  WeightChunker& operator=(const WeightChunker&) = delete;

  // Overwrites `chunk` with the next chunk and returns true, or returns false
  // when every chunk has been produced (always at least one).
  bool Next(fusionrl::v1::WeightChunk* chunk);

  bool done() const { return done_; }
  // How many chunks the version takes: max(1, ceil(size / chunk_bytes)).
  size_t chunk_count() const;

 private:
  const std::string job_id_;
  const int64_t version_;
  const std::string super_node_;
  const absl::string_view bytes_;
  const size_t chunk_bytes_;
  const std::optional<uint32_t> known_version_crc32c_;
  size_t offset_ = 0;
  uint32_t running_crc32c_ = 0;  // of bytes_[0, offset_)
  bool done_ = false;
};

// WeightChunkAssembler: checks a stream of chunks and reassembles the version.
//
// Add() each chunk as it arrives. It checks that the first chunk names a job
// and a version >= 1, that every chunk has the first chunk's job id, version
// and super node, that its offset is the number of bytes received so far,
// that it carries at most kMaxWeightChunkBytes, that the version stays within
// `max_total_bytes`, and that its CRC-32C matches; on the last chunk, that
// total_bytes is what was received and version_crc32c matches the whole.
// Errors name the chunk's offset and what was wrong, prefixed by the job and
// version ("job-1 version 3: chunk at offset 2048: ..."):
//   InvalidArgument     the stream breaks the protocol (field mismatch, wrong
//                       offset, oversized chunk, a chunk after the last);
//   DataLoss            a chunk's or the whole version's CRC-32C mismatches;
//   ResourceExhausted   the version grows past `max_total_bytes`.
// After an error the assembler is spent: every later Add() returns it again.
//
// Every byte is read once (chunk CRCs are combined into the version's CRC).
// Thread safety: not thread-safe; one stream, one user.
class WeightChunkAssembler {
 public:
  // REQUIRES: max_total_bytes >= 0.
  explicit WeightChunkAssembler(
      int64_t max_total_bytes = std::numeric_limits<int64_t>::max());

  WeightChunkAssembler(const WeightChunkAssembler&) = delete;
  WeightChunkAssembler& operator=(const WeightChunkAssembler&) = delete;

  absl::Status Add(const fusionrl::v1::WeightChunk& chunk);

  // True once the last chunk was added and checked.
  bool done() const { return done_; }
  int64_t chunks() const { return chunks_; }
  int64_t bytes_received() const { return static_cast<int64_t>(bytes_.size()); }
  // From the first chunk; empty / 0 before it.
  const std::string& job_id() const { return job_id_; }
  int64_t version() const { return version_; }
  const std::string& super_node() const { return super_node_; }
  // CRC-32C of the bytes received so far (of the whole version once done()).
  uint32_t crc32c() const { return crc32c_; }

  // "stream ended before the last chunk (job-1 version 3: 2 chunks, 2048
  // bytes received)": the error for a stream that ends before done().
  std::string EndedEarlyMessage() const;

  // Moves the reassembled bytes out. REQUIRES: done().
  std::string TakeBytes();

 private:
  // "job-1 version 3: chunk at offset 2048: " (or "last chunk at ...").
  std::string Where(const fusionrl::v1::WeightChunk& chunk) const;
  absl::Status Check(const fusionrl::v1::WeightChunk& chunk);

  const int64_t max_total_bytes_;
  std::string job_id_;
  int64_t version_ = 0;
  std::string super_node_;
  std::string bytes_;
  uint32_t crc32c_ = 0;
  int64_t chunks_ = 0;
  bool done_ = false;
  absl::Status failed_;
};

}  // namespace fusionrl::rpc

#endif  // FUSIONRL_RPC_WEIGHT_CHUNKS_H_
