// The chunk protocol without gRPC: WeightChunker and WeightChunkAssembler.
#include "rpc/weight_chunks.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl::rpc {
namespace {

using fusionrl::v1::WeightChunk;
using ::testing::HasSubstr;

std::string Bytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 37 + (i >> 7));
  return s;
}

std::vector<WeightChunk> Chunks(const std::string& bytes, size_t chunk_bytes) {
  WeightChunker chunker("job-1", 3, "sn-a", bytes, chunk_bytes);
  std::vector<WeightChunk> out;
  WeightChunk chunk;
  while (chunker.Next(&chunk)) out.push_back(chunk);
  EXPECT_TRUE(chunker.done());
  EXPECT_EQ(out.size(), chunker.chunk_count());
  return out;
}

absl::Status Feed(WeightChunkAssembler& assembler,
                  const std::vector<WeightChunk>& chunks) {
  for (const WeightChunk& c : chunks) {
    absl::Status s = assembler.Add(c);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

TEST(WeightChunkerTest, SplitsIntoContiguousCheckedChunksWithARaggedEnd) {
  const std::string bytes = Bytes(2500);
  std::vector<WeightChunk> chunks = Chunks(bytes, 1000);
  ASSERT_EQ(chunks.size(), 3u);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const WeightChunk& c = chunks[i];
    EXPECT_EQ(c.job_id(), "job-1");
    EXPECT_EQ(c.version(), 3);
    EXPECT_EQ(c.super_node(), "sn-a");
    EXPECT_EQ(c.offset(), static_cast<int64_t>(i * 1000));
    EXPECT_EQ(c.data(), bytes.substr(i * 1000, 1000));
    EXPECT_EQ(c.crc32c(), Crc32c(c.data()));
    EXPECT_EQ(c.last(), i == 2);
  }
  EXPECT_EQ(chunks[2].data().size(), 500u);
  EXPECT_EQ(chunks[2].total_bytes(), 2500);
  EXPECT_EQ(chunks[2].version_crc32c(), Crc32c(bytes));
  EXPECT_EQ(chunks[0].total_bytes(), 0);  // only the last says
}

TEST(WeightChunkerTest, EmptyVersionIsOneLastChunk) {
  std::vector<WeightChunk> chunks = Chunks("", 1000);
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_TRUE(chunks[0].last());
  EXPECT_EQ(chunks[0].offset(), 0);
  EXPECT_EQ(chunks[0].total_bytes(), 0);
  EXPECT_TRUE(chunks[0].data().empty());
  EXPECT_EQ(chunks[0].version_crc32c(), 0u);
}

TEST(WeightChunkerTest, ExactMultipleHasNoEmptyTail) {
  std::vector<WeightChunk> chunks = Chunks(Bytes(2000), 1000);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_TRUE(chunks[1].last());
  EXPECT_EQ(chunks[1].data().size(), 1000u);
}

TEST(WeightChunkerTest, UsesAKnownVersionCrcAsIs) {
  const std::string bytes = Bytes(10);
  WeightChunker chunker("job-1", 1, "sn-a", bytes, 4, 0xDEADBEEFu);
  WeightChunk chunk;
  while (chunker.Next(&chunk)) {
  }
  EXPECT_EQ(chunk.version_crc32c(), 0xDEADBEEFu);
}

TEST(WeightChunkAssemblerTest, ReassemblesWhatTheChunkerSplit) {
  for (size_t size : {0, 1, 999, 1000, 1001, 5000}) {
    const std::string bytes = Bytes(size);
    WeightChunkAssembler assembler;
    ASSERT_TRUE(Feed(assembler, Chunks(bytes, 1000)).ok()) << size;
    ASSERT_TRUE(assembler.done());
    EXPECT_EQ(assembler.job_id(), "job-1");
    EXPECT_EQ(assembler.version(), 3);
    EXPECT_EQ(assembler.super_node(), "sn-a");
    EXPECT_EQ(assembler.crc32c(), Crc32c(bytes));
    EXPECT_EQ(assembler.TakeBytes(), bytes);
  }
}

TEST(WeightChunkAssemblerTest, RejectsOutOfOrderAndMismatchedChunks) {
  std::vector<WeightChunk> chunks = Chunks(Bytes(3000), 1000);
  {
    WeightChunkAssembler a;
    ASSERT_TRUE(a.Add(chunks[0]).ok());
    absl::Status s = a.Add(chunks[2]);  // skipped one
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(),
                HasSubstr("job-1 version 3: last chunk at offset 2000: "
                          "expected offset 1000"));
    EXPECT_EQ(a.Add(chunks[1]), s);  // spent
  }
  {
    WeightChunkAssembler a;
    ASSERT_TRUE(a.Add(chunks[0]).ok());
    WeightChunk other = chunks[1];
    other.set_job_id("job-2");
    absl::Status s = a.Add(other);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("job_id 'job-2' differs"));
  }
  {
    WeightChunkAssembler a;
    ASSERT_TRUE(a.Add(chunks[0]).ok());
    WeightChunk other = chunks[1];
    other.set_version(4);
    EXPECT_THAT(a.Add(other).message(), HasSubstr("version 4 differs"));
  }
  {
    WeightChunkAssembler a;
    ASSERT_TRUE(a.Add(chunks[0]).ok());
    WeightChunk other = chunks[1];
    other.set_super_node("sn-b");
    EXPECT_THAT(a.Add(other).message(), HasSubstr("super_node 'sn-b'"));
  }
  {
    WeightChunkAssembler a;
    WeightChunk first = chunks[0];
    first.set_version(0);
    EXPECT_EQ(a.Add(first).code(), absl::StatusCode::kInvalidArgument);
    WeightChunkAssembler b;
    first = chunks[0];
    first.clear_job_id();
    EXPECT_EQ(b.Add(first).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(WeightChunkAssemblerTest, ChecksumMismatchesAreDataLossNamingTheOffset) {
  std::vector<WeightChunk> chunks = Chunks(Bytes(3000), 1000);
  {
    WeightChunkAssembler a;
    std::vector<WeightChunk> bad = chunks;
    (*bad[1].mutable_data())[7] ^= 0x10;
    absl::Status s = Feed(a, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), HasSubstr("chunk at offset 1000: CRC-32C"));
  }
  {
    WeightChunkAssembler a;
    std::vector<WeightChunk> bad = chunks;
    bad[2].set_version_crc32c(bad[2].version_crc32c() ^ 1u);
    absl::Status s = Feed(a, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(s.message(),
                HasSubstr("last chunk at offset 2000: CRC-32C of the whole"));
    EXPECT_FALSE(a.done());
  }
  {
    WeightChunkAssembler a;
    std::vector<WeightChunk> bad = chunks;
    bad[2].set_total_bytes(3001);
    absl::Status s = Feed(a, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("total_bytes says 3001"));
  }
}

TEST(WeightChunkAssemblerTest, EnforcesTheSizeLimits) {
  WeightChunkAssembler small(2500);
  absl::Status s = Feed(small, Chunks(Bytes(3000), 1000));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("over the limit of 2500 bytes"));

  WeightChunkAssembler exact(3000);
  EXPECT_TRUE(Feed(exact, Chunks(Bytes(3000), 1000)).ok());

  std::vector<WeightChunk> big =
      Chunks(Bytes(kMaxWeightChunkBytes + 1), kMaxWeightChunkBytes);
  WeightChunk merged = big[0];  // one chunk over the per-chunk limit
  merged.mutable_data()->append(big[1].data());
  merged.set_crc32c(Crc32c(merged.data()));
  WeightChunkAssembler a;
  EXPECT_EQ(a.Add(merged).code(), absl::StatusCode::kInvalidArgument);
}

TEST(WeightChunkAssemblerTest, RejectsAChunkAfterTheLast) {
  std::vector<WeightChunk> chunks = Chunks(Bytes(10), 100);
  WeightChunkAssembler a;
  ASSERT_TRUE(a.Add(chunks[0]).ok());
  absl::Status s = a.Add(chunks[0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("after the last chunk"));
}

TEST(WeightChunkAssemblerTest, EndedEarlyMessageSaysHowFarItGot) {
  WeightChunkAssembler a;
  EXPECT_EQ(a.EndedEarlyMessage(),
            "stream ended before the last chunk (no chunks received)");
  std::vector<WeightChunk> chunks = Chunks(Bytes(3000), 1000);
  ASSERT_TRUE(a.Add(chunks[0]).ok());
  ASSERT_TRUE(a.Add(chunks[1]).ok());
  EXPECT_FALSE(a.done());
  EXPECT_EQ(a.EndedEarlyMessage(),
            "stream ended before the last chunk (job-1 version 3: 2 chunks, "
            "2000 bytes received)");
}

}  // namespace
}  // namespace fusionrl::rpc
