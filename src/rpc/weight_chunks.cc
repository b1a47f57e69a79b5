#include "rpc/weight_chunks.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/crc32c.h"

namespace fusionrl::rpc {
namespace {

using fusionrl::v1::WeightChunk;

std::string Hex32(uint32_t v) { return absl::StrFormat("0x%08x", v); }

// A wire string, quoted and made printable, at most 80 bytes of it.
std::string Quote(absl::string_view s) {
  return absl::StrCat("'", absl::CHexEscape(s.substr(0, 80)),
                      s.size() > 80 ? "...'" : "'");
}

}  // namespace

// ---------------------------------------------------------------- chunker

WeightChunker::WeightChunker(std::string job_id, int64_t version,
                             std::string super_node, absl::string_view bytes,
                             size_t chunk_bytes,
                             std::optional<uint32_t> version_crc32c)
    : job_id_(std::move(job_id)),
      version_(version),
      super_node_(std::move(super_node)),
      bytes_(bytes),
      chunk_bytes_(chunk_bytes),
      known_version_crc32c_(version_crc32c) {
  if (chunk_bytes < 1 || chunk_bytes > kMaxWeightChunkBytes) {  // a bug
    std::fprintf(stderr,
                 "WeightChunker: chunk_bytes must be in [1, %zu], "
                 "got %zu\n",
                 kMaxWeightChunkBytes, chunk_bytes);
    std::abort();
  }
}

size_t WeightChunker::chunk_count() const {
  if (bytes_.empty()) return 1;
  return (bytes_.size() + chunk_bytes_ - 1) / chunk_bytes_;
}

bool WeightChunker::Next(WeightChunk* chunk) {
  if (done_) return false;
  const size_t n = std::min(chunk_bytes_, bytes_.size() - offset_);
  const absl::string_view data = bytes_.substr(offset_, n);
  const uint32_t crc = Crc32c(data);
  chunk->Clear();  // keeps the data buffer's capacity for the next chunk
  chunk->set_job_id(job_id_);
  chunk->set_version(version_);
  chunk->set_super_node(super_node_);
  chunk->set_offset(static_cast<int64_t>(offset_));
  chunk->set_data(data.data(), data.size());
  chunk->set_crc32c(crc);
  running_crc32c_ = Crc32cCombine(running_crc32c_, crc, n);
  offset_ += n;
  if (offset_ == bytes_.size()) {
    chunk->set_last(true);
    chunk->set_total_bytes(static_cast<int64_t>(bytes_.size()));
    chunk->set_version_crc32c(known_version_crc32c_.value_or(running_crc32c_));
    done_ = true;
  }
  return true;
}

// -------------------------------------------------------------- assembler

WeightChunkAssembler::WeightChunkAssembler(int64_t max_total_bytes)
    : max_total_bytes_(max_total_bytes) {
  if (max_total_bytes < 0) {  // a bug
    std::fprintf(stderr,
                 "WeightChunkAssembler: max_total_bytes must be >= 0, got "
                 "%lld\n",
                 static_cast<long long>(max_total_bytes));
    std::abort();
  }
}

std::string WeightChunkAssembler::Where(const WeightChunk& chunk) const {
  return absl::StrCat(absl::CHexEscape(job_id_.substr(0, 80)), " version ",
                      version_, ": ", chunk.last() ? "last chunk" : "chunk",
                      " at offset ", chunk.offset(), ": ");
}

absl::Status WeightChunkAssembler::Add(const WeightChunk& chunk) {
  if (!failed_.ok()) return failed_;
  absl::Status status = Check(chunk);
  if (!status.ok()) failed_ = status;
  return status;
}

absl::Status WeightChunkAssembler::Check(const WeightChunk& chunk) {
  if (chunks_ == 0) {
    if (chunk.job_id().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk at offset ", chunk.offset(), ": job_id must not be empty"));
    }
    if (chunk.version() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          absl::CHexEscape(chunk.job_id().substr(0, 80)), ": chunk at offset ",
          chunk.offset(), ": version must be >= 1, got ", chunk.version()));
    }
    job_id_ = chunk.job_id();
    version_ = chunk.version();
    super_node_ = chunk.super_node();
  }
  if (done_) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk), "a chunk after the last chunk"));
  }
  if (chunk.job_id() != job_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk), "job_id ", Quote(chunk.job_id()),
                     " differs from the first chunk's ", Quote(job_id_)));
  }
  if (chunk.version() != version_) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk), "version ", chunk.version(),
                     " differs from the first chunk's ", version_));
  }
  if (chunk.super_node() != super_node_) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk), "super_node ", Quote(chunk.super_node()),
                     " differs from the first chunk's ", Quote(super_node_)));
  }
  const auto received = static_cast<int64_t>(bytes_.size());
  if (chunk.offset() != received) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk), "expected offset ", received,
                     " (the bytes received so far); chunks must be "
                     "contiguous and in order"));
  }
  const absl::string_view data = chunk.data();
  if (data.size() > kMaxWeightChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk), data.size(), " data bytes, over the ",
                     kMaxWeightChunkBytes, "-byte chunk limit"));
  }
  const int64_t grown = received + static_cast<int64_t>(data.size());
  if (grown > max_total_bytes_ ||
      (chunk.last() && chunk.total_bytes() > max_total_bytes_)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Where(chunk), "the version grows to ",
                     std::max(grown, chunk.last() ? chunk.total_bytes() : 0),
                     " bytes, over the limit of ", max_total_bytes_, " bytes"));
  }
  const uint32_t crc = Crc32c(data);
  if (crc != chunk.crc32c()) {
    return absl::DataLossError(absl::StrCat(
        Where(chunk), "CRC-32C of the ", data.size(), " data bytes is ",
        Hex32(crc), ", the chunk says ", Hex32(chunk.crc32c())));
  }
  bytes_.append(data.data(), data.size());
  crc32c_ = Crc32cCombine(crc32c_, crc, data.size());
  ++chunks_;
  if (!chunk.last()) return absl::OkStatus();

  if (chunk.total_bytes() != grown) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(chunk), "total_bytes says ", chunk.total_bytes(),
                     " but ", grown, " bytes were received"));
  }
  if (chunk.version_crc32c() != crc32c_) {
    return absl::DataLossError(
        absl::StrCat(Where(chunk), "CRC-32C of the whole version (", grown,
                     " bytes) is ", Hex32(crc32c_), ", the last chunk says ",
                     Hex32(chunk.version_crc32c())));
  }
  done_ = true;
  return absl::OkStatus();
}

std::string WeightChunkAssembler::EndedEarlyMessage() const {
  if (chunks_ == 0) {
    return "stream ended before the last chunk (no chunks received)";
  }
  return absl::StrCat("stream ended before the last chunk (",
                      absl::CHexEscape(job_id_.substr(0, 80)), " version ",
                      version_, ": ", chunks_, " chunks, ", bytes_.size(),
                      " bytes received)");
}

std::string WeightChunkAssembler::TakeBytes() {
  if (!done_) {  // a bug
    std::fprintf(stderr, "WeightChunkAssembler::TakeBytes before done()\n");
    std::abort();
  }
  return std::move(bytes_);
}

}  // namespace fusionrl::rpc
