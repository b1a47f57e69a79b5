// Tests of safetensors header validation, one error at a time, and a fuzz
// test of the parser (never crashes or hangs; parses or returns one line).
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hf/safetensors.h"
#include "hf/safetensors_test_util.h"

namespace fusionrl {
namespace {

using hf_testing::Bytes;
using hf_testing::Entry;
using hf_testing::ExpectConsistent;
using hf_testing::LengthPrefix;
using hf_testing::MakeFile;
using hf_testing::Parse;
using hf_testing::ParseError;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Validation errors, one by one.

TEST(SafetensorsParseTest, ShapeSizeMismatchMessage) {
  EXPECT_EQ(ParseError(MakeFile(
                R"({"model.norm.weight":)" + Entry("BF16", "[4]", 0, 12) + "}",
                Bytes(12))),
            "bad.safetensors: tensor 'model.norm.weight': data_offsets [0, 12] "
            "hold 12 bytes but shape [4] of BF16 needs 8");
}

TEST(SafetensorsParseTest, RejectsBadLengths) {
  EXPECT_THAT(ParseError(""), HasSubstr("too short"));
  EXPECT_THAT(ParseError("\x01\x00\x00"), HasSubstr("too short"));
  EXPECT_THAT(ParseError(LengthPrefix(100) + "{}"),
              HasSubstr("header length 100 runs past the end of the file (2 "
                        "bytes follow the length)"));
  EXPECT_THAT(ParseError(LengthPrefix(uint64_t{1} << 63) + "{}"),
              HasSubstr("exceeds the limit"));
  EXPECT_THAT(ParseError(LengthPrefix(~uint64_t{0}) + "{}"),
              HasSubstr("exceeds the limit"));
  EXPECT_THAT(ParseError(LengthPrefix(0) + "{}"),
              HasSubstr("not a JSON object"));
}

TEST(SafetensorsParseTest, RejectsNonObjectAndInvalidJson) {
  EXPECT_THAT(ParseError(MakeFile("[1, 2]", "")),
              HasSubstr("header is not a JSON object"));
  EXPECT_THAT(ParseError(MakeFile("\"x\"", "")),
              HasSubstr("header is not a JSON object"));
  EXPECT_THAT(ParseError(MakeFile("{abc", "")),
              HasSubstr("header is not valid JSON"));
  EXPECT_THAT(ParseError(MakeFile("{} {}", "")),
              HasSubstr("header is not valid JSON"));
  // Invalid UTF-8 inside a string: the message stays printable ASCII.
  const std::string msg = ParseError(
      MakeFile("{\"a\xff\xfe\":" + Entry("U8", "[1]", 0, 1) + "}", "x"));
  EXPECT_THAT(msg, HasSubstr("header is not valid JSON"));
  for (char c : msg) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << msg;
  // Overlong encoding of '/'.
  EXPECT_THAT(ParseError(MakeFile("{\"\xc0\xaf\":{}}", "")),
              HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseError(MakeFile(std::string(200, '[') + "{", "")),
              HasSubstr("not a JSON object"));
  EXPECT_THAT(
      ParseError(MakeFile(
          "{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}", "")),
      HasSubstr("nests deeper than 64"));
}

TEST(SafetensorsParseTest, RejectsMalformedEntries) {
  struct Case {
    std::string entry;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"3", "tensor 't': entry is a JSON number, not an object"},
      {R"({"shape":[1],"data_offsets":[0,4]})",
       "tensor 't': missing field 'dtype'"},
      {R"({"dtype":"F32","data_offsets":[0,4]})", "missing field 'shape'"},
      {R"({"dtype":"F32","shape":[1]})", "missing field 'data_offsets'"},
      {R"({"dtype":5,"shape":[1],"data_offsets":[0,4]})",
       "field 'dtype' is a JSON number, not a string"},
      {R"({"dtype":"F32","shape":"1","data_offsets":[0,4]})",
       "field 'shape' is a JSON string, not an array"},
      {R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})",
       "shape dim 0 is negative (-1)"},
      {R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})",
       "shape dim 0 is not an integer (1.5)"},
      {R"({"dtype":"F32","shape":[1,"2"],"data_offsets":[0,4]})",
       "shape dim 1 is not an integer (\"2\")"},
      {R"({"dtype":"F32","shape":[[1]],"data_offsets":[0,4]})",
       "shape dim 0 is not an integer (a JSON array of 1 elements)"},
      {R"({"dtype":"F32","shape":[1],"data_offsets":[0]})",
       "field 'data_offsets' must be [begin, end]"},
      {R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})",
       "field 'data_offsets' must be [begin, end]"},
      {R"({"dtype":"F32","shape":[1],"data_offsets":[0,4.0]})",
       "field 'data_offsets' must be [begin, end]"},
      {R"({"dtype":"F32","shape":[1],"data_offsets":{"a":1}})",
       "field 'data_offsets' must be [begin, end]"},
      {R"({"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]})",
       "tensor 't': unsupported dtype 'F8_E4M3'"},
      {R"({"dtype":"U16","shape":[2],"data_offsets":[0,4]})",
       "tensor 't': unsupported dtype 'U16'"},
      {R"({"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,4]})",
       "tensor 't': shape [4611686018427387904, 4611686018427387904] of F32 "
       "overflows"},
      {R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]})",
       "shape dim 0 (18446744073709551615) is too large"},
      {R"({"dtype":"F32","shape":[1],"data_offsets":[4,0]})",
       "tensor 't': data_offsets [4, 0] have begin > end"},
      {R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})",
       "tensor 't': data_offsets [0, 8] run past the end of the data section "
       "(4 bytes)"},
      {R"({"dtype":"F32","shape":[1],"dtype":"F32","data_offsets":[0,4]})",
       "tensor 't': key 'dtype' appears more than once"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseError(MakeFile("{\"t\":" + c.entry + "}", Bytes(4))),
                HasSubstr(c.want))
        << c.entry;
  }
}

TEST(SafetensorsParseTest, RejectsTruncatedData) {
  const std::string header = "{\"a\":" + Entry("F32", "[4]", 0, 16) + "}";
  EXPECT_THAT(ParseError(MakeFile(header, Bytes(10))),
              HasSubstr("tensor 'a': data_offsets [0, 16] run past the end of "
                        "the data section (10 bytes)"));
}

TEST(SafetensorsParseTest, RejectsOverlapsHolesAndTrailingBytes) {
  EXPECT_THAT(
      ParseError(MakeFile("{\"a\":" + Entry("F32", "[2]", 0, 8) +
                              ",\"b\":" + Entry("F32", "[2]", 4, 12) + "}",
                          Bytes(12))),
      HasSubstr("tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]"));
  EXPECT_THAT(
      ParseError(MakeFile("{\"a\":" + Entry("F32", "[1]", 0, 4) +
                              ",\"b\":" + Entry("F32", "[1]", 0, 4) + "}",
                          Bytes(4))),
      HasSubstr("overlap"));
  EXPECT_THAT(
      ParseError(MakeFile("{\"a\":" + Entry("F32", "[1]", 0, 4) +
                              ",\"b\":" + Entry("F32", "[1]", 8, 12) + "}",
                          Bytes(12))),
      HasSubstr("data bytes [4, 8) are not covered by any tensor (a hole "
                "before tensor 'b')"));
  EXPECT_THAT(ParseError(MakeFile("{\"b\":" + Entry("F32", "[1]", 4, 8) + "}",
                                  Bytes(8))),
              HasSubstr("data bytes [0, 4) are not covered"));
  EXPECT_THAT(ParseError(MakeFile("{\"a\":" + Entry("F32", "[1]", 0, 4) + "}",
                                  Bytes(8))),
              HasSubstr("the tensors cover 4 of the 8 data bytes (4 trailing "
                        "bytes not covered by any tensor)"));
  EXPECT_THAT(ParseError(MakeFile("{}", Bytes(3))),
              HasSubstr("cover 0 of the 3 data bytes"));
}

TEST(SafetensorsParseTest, RejectsDuplicatesAndBadMetadata) {
  EXPECT_THAT(
      ParseError(MakeFile("{\"a\":" + Entry("F32", "[1]", 0, 4) +
                              ",\"a\":" + Entry("F32", "[1]", 4, 8) + "}",
                          Bytes(8))),
      HasSubstr("tensor 'a' appears more than once in the header"));
  EXPECT_THAT(
      ParseError(MakeFile(R"({"__metadata__":{},"__metadata__":{}})", "")),
      HasSubstr("'__metadata__' appears more than once"));
  EXPECT_THAT(ParseError(MakeFile(R"({"__metadata__":[1]})", "")),
              HasSubstr("'__metadata__' is a JSON array, not an object"));
  EXPECT_THAT(ParseError(MakeFile(R"({"__metadata__":{"k":1}})", "")),
              HasSubstr("'__metadata__' value of key 'k' is a JSON number, "
                        "not a string"));
}

TEST(SafetensorsParseTest, AcceptsWhatTheReferenceAccepts) {
  // Space padding, unknown fields, null metadata, zero-size tensors sharing
  // an offset with others, scalars, a zero dim.
  const std::string header =
      "{\"__metadata__\":null,\"s\":" + Entry("I64", "[]", 4, 12) +
      ",\"z\":" + Entry("F32", "[0,3]", 4, 4) +
      ",\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
      "\"extra\":[1,{\"x\":2}]}}      ";
  absl::StatusOr<SafetensorsHeader> h = Parse(MakeFile(header, Bytes(12)));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[1].name, "z");  // [4, 4] sorts before [4, 12]
  EXPECT_EQ(h->tensors[2].name, "s");
  EXPECT_TRUE(h->tensors[2].shape.empty());
  EXPECT_TRUE(h->metadata.empty());
  EXPECT_EQ(h->header_bytes, header.size());
  ExpectConsistent(*h, 8 + header.size() + 12);
}

// ---------------------------------------------------------------------------
// Fuzz: the parser never crashes or hangs, and either parses a consistent
// header or returns one printable line.

void FuzzOne(const std::string& bytes) {
  absl::StatusOr<SafetensorsHeader> h = Parse(bytes);
  if (h.ok()) {
    ExpectConsistent(*h, bytes.size());
  } else {
    ASSERT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    ASSERT_EQ(h.status().message().find('\n'), std::string::npos);
    ASSERT_EQ(h.status().message().rfind("bad.safetensors: ", 0), 0u);
  }
}

// A small valid file with metadata and several dtypes.
std::string ValidFile() {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("s":{"dtype":"I64","shape":[],"data_offsets":[16,24]},)"
      R"("e":{"dtype":"U8","shape":[0],"data_offsets":[24,24]}})";
  return MakeFile(header, Bytes(24));
}

TEST(SafetensorsFuzzTest, ValidFileParses) {
  const std::string f = ValidFile();
  absl::StatusOr<SafetensorsHeader> h = Parse(f);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->tensors.size(), 4u);
}

TEST(SafetensorsFuzzTest, RandomBytesNeverCrash) {
  std::mt19937_64 rng(12345);
  static const char* const kTokens[] = {"{",
                                        "}",
                                        "[",
                                        "]",
                                        ",",
                                        ":",
                                        "\"",
                                        "\"dtype\"",
                                        "\"shape\"",
                                        "\"data_offsets\"",
                                        "\"F32\"",
                                        "\"BF16\"",
                                        "\"__metadata__\"",
                                        "0",
                                        "1",
                                        "4",
                                        "-1",
                                        "1e3",
                                        "2.5",
                                        "null",
                                        "true",
                                        " ",
                                        "\"a\"",
                                        "\\u0000",
                                        "18446744073709551616"};
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    const size_t len = rng() % 513;
    std::string bytes;
    if (i % 2 == 0) {  // raw bytes
      bytes.resize(len);
      for (char& c : bytes) c = static_cast<char>(rng());
    } else {  // a plausible length over JSON-ish tokens
      std::string body = "{";
      while (body.size() < len) {
        body += kTokens[rng() % (sizeof(kTokens) / sizeof(kTokens[0]))];
      }
      const uint64_t n = rng() % (body.size() + 1);
      bytes = LengthPrefix(n) + body;
    }
    FuzzOne(bytes);
    if (HasFatalFailure()) return;
    parsed += Parse(bytes).ok() ? 1 : 0;
  }
  EXPECT_GE(parsed, 0);
}

TEST(SafetensorsFuzzTest, EveryTruncationOfAValidFile) {
  const std::string f = ValidFile();
  for (size_t len = 0; len < f.size(); ++len) {
    const std::string cut = f.substr(0, len);
    EXPECT_FALSE(Parse(cut).ok()) << len;
    FuzzOne(cut);
    if (HasFatalFailure()) return;
  }
}

TEST(SafetensorsFuzzTest, RandomByteMutationsOfAValidFile) {
  const std::string f = ValidFile();
  std::mt19937_64 rng(777);
  for (int i = 0; i < 20000; ++i) {
    std::string m = f;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < flips; ++k) {
      m[rng() % m.size()] = static_cast<char>(rng());
    }
    FuzzOne(m);
    if (HasFatalFailure()) return;
  }
}

TEST(SafetensorsFuzzTest, HugeAndOddHeaderLengths) {
  const std::string f = ValidFile();
  const std::string body = f.substr(8);
  std::mt19937_64 rng(99);
  std::vector<uint64_t> lengths = {0,
                                   1,
                                   2,
                                   body.size() - 1,
                                   body.size(),
                                   body.size() + 1,
                                   uint64_t{1} << 32,
                                   (uint64_t{1} << 32) + 8,
                                   kMaxSafetensorsHeaderBytes,
                                   kMaxSafetensorsHeaderBytes + 1,
                                   (uint64_t{1} << 63) - 1,
                                   uint64_t{1} << 63,
                                   ~uint64_t{0} - 7,
                                   ~uint64_t{0}};
  for (int i = 0; i < 200; ++i) lengths.push_back(rng());
  for (uint64_t n : lengths) {
    for (size_t body_len : {size_t{0}, size_t{1}, size_t{7}, body.size()}) {
      FuzzOne(LengthPrefix(n) + body.substr(0, body_len));
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace fusionrl
