#include "core/crc32c.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace fusionrl {
namespace {

TEST(Crc32cTest, MatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
}

TEST(Crc32cTest, EmptyInputIsZero) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32cExtend(0, nullptr, 0), 0u);
  EXPECT_EQ(Crc32cExtend(0x12345678u, nullptr, 0), 0x12345678u);
}

// RFC 3720 (iSCSI), appendix B.4.
TEST(Crc32cTest, MatchesTheIscsiTestVectors) {
  std::string zeros(32, '\0');
  std::string ones(32, '\xff');
  std::string ascending(32, '\0');
  std::string descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
}

// Byte-at-a-time reference, to check the sliced loop on every length and
// alignment.
uint32_t ReferenceCrc32c(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
  }
  return ~c;
}

TEST(Crc32cTest, AgreesWithBitwiseReferenceAtEveryLengthAndAlignment) {
  std::string data(300, '\0');
  uint32_t x = 12345;
  for (char& c : data) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  for (size_t start = 0; start < 9; ++start) {
    for (size_t len = 0; start + len <= data.size(); len += 7) {
      const std::string piece = data.substr(start, len);
      ASSERT_EQ(Crc32c(absl::string_view(data).substr(start, len)),
                ReferenceCrc32c(piece))
          << "start=" << start << " len=" << len;
    }
  }
}

// Both implementations (the CPU's instruction where Crc32c uses it, and
// the tables) agree with the bitwise reference, pieces and alignments
// included.
TEST(Crc32cTest, PortableAndDispatchedPathsAgree) {
  std::string data(5000, '\0');
  uint32_t x = 777;
  for (char& c : data) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  for (size_t start : {0, 1, 3, 7}) {
    for (size_t len : {0, 1, 7, 8, 9, 63, 64, 65, 4093}) {
      const std::string piece = data.substr(start, len);
      const uint32_t want = ReferenceCrc32c(piece);
      EXPECT_EQ(internal::Crc32cExtendPortable(0, piece.data(), len), want)
          << "start=" << start << " len=" << len;
      EXPECT_EQ(Crc32cExtend(0, data.data() + start, len), want)
          << "start=" << start << " len=" << len;
    }
  }
  std::printf("Crc32c uses %s\n", internal::Crc32cHasHardwarePath()
                                      ? "the SSE4.2 crc32 instruction"
                                      : "the portable tables");
}

TEST(Crc32cTest, ExtendingInPiecesEqualsOneShot) {
  std::string data(10'000, '\0');
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<char>((i * 131) ^ (i >> 3));
  }
  const uint32_t whole = Crc32c(data);
  for (size_t piece : {1, 3, 8, 13, 64, 1000, 4096, 9999, 10000}) {
    uint32_t crc = 0;
    for (size_t off = 0; off < data.size(); off += piece) {
      const size_t n = std::min(piece, data.size() - off);
      crc = Crc32cExtend(crc, data.data() + off, n);
    }
    EXPECT_EQ(crc, whole) << "piece=" << piece;
  }
  EXPECT_EQ(Crc32cExtend(Crc32c("1234"), "56789", 5), 0xE3069283u);
}

TEST(Crc32cTest, CombineEqualsCrcOfTheConcatenation) {
  std::string data(5000, '\0');
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<char>((i * 2654435761u) >> 13);
  }
  const absl::string_view all(data);
  for (size_t split : {0, 1, 7, 8, 9, 100, 2500, 4095, 4999, 5000}) {
    const absl::string_view a = all.substr(0, split);
    const absl::string_view b = all.substr(split);
    EXPECT_EQ(Crc32cCombine(Crc32c(a), Crc32c(b), b.size()), Crc32c(all))
        << "split=" << split;
  }
  EXPECT_EQ(Crc32cCombine(Crc32c("1234"), Crc32c("56789"), 5), 0xE3069283u);
  EXPECT_EQ(Crc32cCombine(0x12345678u, 0, 0), 0x12345678u);
}

}  // namespace
}  // namespace fusionrl
