// Tests of the safetensors reader and writer: round trips, exact output,
// sharded checkpoints and their index, and Open errors.
#include "hf/safetensors.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hf/safetensors_test_util.h"

namespace fusionrl {
namespace {

using hf_testing::Bytes;
using hf_testing::Entry;
using hf_testing::LengthPrefix;
using hf_testing::MakeFile;
using hf_testing::ReadBytes;
using hf_testing::SpanString;
using hf_testing::TempDir;
using hf_testing::View;
using hf_testing::WriteBytes;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---------------------------------------------------------------------------
// Dtypes.

TEST(StDtypeTest, NamesSizesAndParsingRoundTrip) {
  const std::vector<std::pair<StDtype, size_t>> all = {
      {StDtype::kF64, 8},  {StDtype::kF32, 4}, {StDtype::kF16, 2},
      {StDtype::kBF16, 2}, {StDtype::kI64, 8}, {StDtype::kI32, 4},
      {StDtype::kI16, 2},  {StDtype::kI8, 1},  {StDtype::kU8, 1},
      {StDtype::kBool, 1}};
  for (const auto& [dtype, size] : all) {
    EXPECT_EQ(StDtypeSize(dtype), size);
    absl::StatusOr<StDtype> parsed = ParseStDtype(StDtypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << StDtypeName(dtype);
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(StDtypeName(StDtype::kBF16), "BF16");
  EXPECT_EQ(StDtypeName(StDtype::kBool), "BOOL");
}

TEST(StDtypeTest, RejectsUnsupportedNames) {
  for (const char* name :
       {"F8_E4M3", "F8_E5M2", "U16", "U32", "U64", "f32", "", "bf16"}) {
    absl::StatusOr<StDtype> parsed = ParseStDtype(name);
    ASSERT_FALSE(parsed.ok()) << name;
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr(absl::StrCat("'", name, "'")));
  }
}

// ---------------------------------------------------------------------------
// Round trips.

TEST(SafetensorsTest, RoundTripKeepsNamesDtypesShapesAndBytes) {
  TempDir dir;
  const std::string f32 = Bytes(2 * 3 * 4, 1), bf16 = Bytes(4 * 2, 2),
                    i64 = Bytes(8, 3), empty, boolean = Bytes(3, 4),
                    f16 = Bytes(2 * 2, 5), f64 = Bytes(16, 6),
                    i32 = Bytes(4, 7), i16 = Bytes(6, 8), i8 = Bytes(5, 9);
  const std::vector<StTensorView> views = {
      View("model.layers.0.w", StDtype::kF32, {2, 3}, f32),
      View("model.norm.weight", StDtype::kBF16, {4}, bf16),
      View("step", StDtype::kI64, {}, i64),
      View("empty", StDtype::kU8, {0, 5}, empty),
      View("mask", StDtype::kBool, {3}, boolean),
      View("h", StDtype::kF16, {1, 1, 2}, f16),
      View("d", StDtype::kF64, {2}, f64),
      View("i32", StDtype::kI32, {1}, i32),
      View("i16", StDtype::kI16, {3}, i16),
      View("\xc3\xa9t\xc3\xa9", StDtype::kI8, {5}, i8),  // UTF-8 name
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"note", "x y"}};
  const std::string path = dir.File("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, views, metadata).ok());
  EXPECT_THAT(dir.Files(), ElementsAre("model.safetensors"));  // no .tmp

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& f = **file;
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.metadata(), metadata);
  EXPECT_EQ(f.header().header_bytes % 8, 0u);
  ASSERT_EQ(f.tensors().size(), views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    // The zero-byte tensor sorts first among equal offsets only by name, so
    // look every tensor up by name rather than relying on position.
    const StTensorInfo* t = f.Find(views[i].name);
    ASSERT_NE(t, nullptr) << views[i].name;
    EXPECT_EQ(t->name, views[i].name);
    EXPECT_EQ(t->dtype, views[i].dtype);
    EXPECT_EQ(t->shape, views[i].shape);
    EXPECT_EQ(
        SpanString(f.Data(*t)),
        std::string(static_cast<const char*>(views[i].data), views[i].bytes));
  }
  EXPECT_EQ(f.Find("missing"), nullptr);
  EXPECT_EQ(f.Find("step")->num_elements(), 1u);
  EXPECT_EQ(f.Find("empty")->num_elements(), 0u);
}

TEST(SafetensorsTest, TensorsAreInDataOrder) {
  TempDir dir;
  const std::string a = Bytes(4), b = Bytes(8), c = Bytes(4);
  const std::string path = dir.File("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {View("zz", StDtype::kF32, {1}, a),
                                View("aa", StDtype::kF32, {2}, b),
                                View("mm", StDtype::kF32, {1}, c)},
                               {})
                  .ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), 3u);
  EXPECT_EQ((*file)->tensors()[0].name, "zz");
  EXPECT_EQ((*file)->tensors()[1].name, "aa");
  EXPECT_EQ((*file)->tensors()[2].name, "mm");
  EXPECT_EQ((*file)->tensors()[1].begin, 4u);
  EXPECT_EQ((*file)->tensors()[1].end, 12u);
}

TEST(SafetensorsTest, WriterOutputIsExactAndDeterministic) {
  TempDir dir;
  const float one = 1.0f;
  const std::vector<StTensorView> views = {
      {"a", StDtype::kF32, {1}, &one, sizeof(one)}};
  ASSERT_TRUE(WriteSafetensors(dir.File("1.safetensors"), views, {}).ok());
  // What the reference serializer writes: compact JSON, dtype/shape/
  // data_offsets in that order, padded with spaces to a multiple of 8.
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  ASSERT_EQ(header.size(), 54u);
  const std::string expected =
      LengthPrefix(56) + header + "  " + std::string("\x00\x00\x80\x3f", 4);
  EXPECT_EQ(ReadBytes(dir.File("1.safetensors")), expected);

  // Same arguments -> same bytes, metadata first.
  const std::string b_bytes = Bytes(32), a_bytes = Bytes(32, 9);
  const std::vector<StTensorView> views2 = {
      View("b", StDtype::kBF16, {8, 2}, b_bytes),
      View("a", StDtype::kI64, {4}, a_bytes)};
  const std::map<std::string, std::string> meta = {{"z", "1"}, {"a", "2"}};
  ASSERT_TRUE(WriteSafetensors(dir.File("2.safetensors"), views2, meta).ok());
  ASSERT_TRUE(WriteSafetensors(dir.File("3.safetensors"), views2, meta).ok());
  const std::string two = ReadBytes(dir.File("2.safetensors"));
  EXPECT_EQ(two, ReadBytes(dir.File("3.safetensors")));
  EXPECT_THAT(two.substr(8),
              StartsWith(R"({"__metadata__":{"a":"2","z":"1"},"b":)"));
}

TEST(SafetensorsTest, WriterReplacesAnExistingFile) {
  TempDir dir;
  const std::string path = dir.File("m.safetensors");
  WriteBytes(path, "old junk");
  const std::string b = Bytes(4);
  ASSERT_TRUE(
      WriteSafetensors(path, {View("x", StDtype::kI32, {1}, b)}, {}).ok());
  EXPECT_THAT(dir.Files(), ElementsAre("m.safetensors"));
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(SpanString((*file)->Data(*(*file)->Find("x"))), b);
}

TEST(SafetensorsTest, EmptyCheckpointRoundTrips) {
  TempDir dir;
  const std::string path = dir.File("e.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}, {}).ok());
  EXPECT_EQ(ReadBytes(path), LengthPrefix(8) + "{}      ");
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->tensors().empty());
}

TEST(SafetensorsTest, WriterRejectsBadViewsAndLeavesNoFile) {
  TempDir dir;
  const std::string path = dir.File("w.safetensors");
  const std::string b8 = Bytes(8);
  struct Case {
    std::vector<StTensorView> views;
    std::map<std::string, std::string> metadata;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{View("t", StDtype::kF32, {3}, b8)},
       {},
       "tensor 't': 8 bytes given but "
       "shape [3] of F32 needs 12"},
      {{View("t", StDtype::kF32, {1}, b8.substr(0, 4)),
        View("t", StDtype::kF32, {1}, b8.substr(0, 4))},
       {},
       "tensor 't': duplicate tensor name"},
      {{View("__metadata__", StDtype::kU8, {8}, b8)}, {}, "reserved"},
      {{View("n", StDtype::kU8, {-8}, b8)}, {}, "negative dim"},
      {{View("bad\xff", StDtype::kU8, {8}, b8)}, {}, "not valid UTF-8"},
      {{View("t", StDtype::kU8, {8}, b8)},
       {{"k", "\xc0\x80"}},
       "metadata key 'k'"},
      {{{"null", StDtype::kU8, {8}, nullptr, 8}}, {}, "data is null"},
      {{View("big", StDtype::kF64, {int64_t{1} << 62, int64_t{1} << 62}, b8)},
       {},
       "overflows"},
  };
  for (const Case& c : cases) {
    absl::Status s = WriteSafetensors(path, c.views, c.metadata);
    ASSERT_FALSE(s.ok()) << c.want;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want));
    EXPECT_THAT(std::string(s.message()), StartsWith(path + ": "));
  }
  EXPECT_TRUE(dir.Files().empty());
}

TEST(SafetensorsTest, WriterReportsUnwritableDirectory) {
  const std::string b = Bytes(4);
  absl::Status s = WriteSafetensors("/nonexistent_dir_hf_test/x.safetensors",
                                    {View("x", StDtype::kF32, {1}, b)}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("x.safetensors.tmp"));
}

// ---------------------------------------------------------------------------
// Sharded checkpoints.

TEST(ShardedSafetensorsTest, SplitsAboveTheLimitAndWritesTheIndex) {
  TempDir dir;
  std::vector<std::string> data;
  for (int i = 0; i < 6; ++i) data.push_back(Bytes(i == 4 ? 400 : 100, i));
  std::vector<StTensorView> views;
  for (int i = 0; i < 6; ++i) {
    views.push_back(View(absl::StrCat("t", i), StDtype::kU8,
                         {static_cast<int64_t>(data[i].size())}, data[i]));
  }
  // 100+100 | 100+100 | 400 (above the limit: alone) | 100
  absl::StatusOr<std::vector<std::string>> written =
      WriteShardedSafetensors(dir.path(), views, {{"format", "pt"}}, 250);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_THAT(*written,
              ElementsAre(dir.File("model-00001-of-00004.safetensors"),
                          dir.File("model-00002-of-00004.safetensors"),
                          dir.File("model-00003-of-00004.safetensors"),
                          dir.File("model-00004-of-00004.safetensors"),
                          dir.File("model.safetensors.index.json")));
  EXPECT_EQ(dir.Files().size(), 5u);  // no .tmp left behind

  const std::string index_text =
      ReadBytes(dir.File("model.safetensors.index.json"));
  EXPECT_EQ(index_text, R"({
  "metadata": {
    "total_size": 900
  },
  "weight_map": {
    "t0": "model-00001-of-00004.safetensors",
    "t1": "model-00001-of-00004.safetensors",
    "t2": "model-00002-of-00004.safetensors",
    "t3": "model-00002-of-00004.safetensors",
    "t4": "model-00003-of-00004.safetensors",
    "t5": "model-00004-of-00004.safetensors"
  }
}
)");

  // A reader over the index finds every tensor with its bytes.
  absl::StatusOr<std::map<std::string, std::string>> index =
      ReadSafetensorsIndex(dir.File("model.safetensors.index.json"));
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->size(), 6u);
  std::map<std::string, std::unique_ptr<SafetensorsFile>> open;
  for (int i = 0; i < 6; ++i) {
    const std::string& file = index->at(absl::StrCat("t", i));
    if (open.count(file) == 0) {
      auto f = SafetensorsFile::Open(dir.File(file));
      ASSERT_TRUE(f.ok()) << f.status();
      EXPECT_EQ((*f)->metadata().at("format"), "pt");
      open[file] = *std::move(f);
    }
    const StTensorInfo* t = open[file]->Find(absl::StrCat("t", i));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(SpanString(open[file]->Data(*t)), data[i]);
  }
  EXPECT_EQ(open.size(), 4u);
}

TEST(ShardedSafetensorsTest, WritesOneFileWithoutIndexWhenItFits) {
  TempDir dir;
  const std::string a = Bytes(100), b = Bytes(100);
  auto written = WriteShardedSafetensors(
      dir.path(),
      {View("a", StDtype::kU8, {100}, a), View("b", StDtype::kU8, {100}, b)},
      {}, 200);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_THAT(*written, ElementsAre(dir.File("model.safetensors")));
  EXPECT_THAT(dir.Files(), ElementsAre("model.safetensors"));

  // One tensor above the limit is still one file.
  TempDir dir2;
  written = WriteShardedSafetensors(
      dir2.path(), {View("a", StDtype::kU8, {100}, a)}, {}, 10, "adapter");
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_THAT(dir2.Files(), ElementsAre("adapter.safetensors"));
}

TEST(ShardedSafetensorsTest, RejectsBadArgumentsBeforeWriting) {
  TempDir dir;
  const std::string a = Bytes(100);
  EXPECT_EQ(WriteShardedSafetensors(dir.path(),
                                    {View("a", StDtype::kU8, {100}, a)}, {}, 0)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The duplicate sits in the second shard: nothing is written.
  auto s = WriteShardedSafetensors(
      dir.path(),
      {View("a", StDtype::kU8, {100}, a), View("b", StDtype::kU8, {100}, a),
       View("a", StDtype::kU8, {100}, a)},
      {}, 100);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("duplicate"));
  EXPECT_TRUE(dir.Files().empty());
}

TEST(ShardedSafetensorsTest, IndexErrorsNameTheFileAndTensor) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors.index.json");
  struct Case {
    std::string text;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"{", "not valid JSON"},
      {"[]", "not an object"},
      {R"({"metadata": {}})", "missing 'weight_map'"},
      {R"({"weight_map": []})", "'weight_map' is a JSON array"},
      {R"({"weight_map": {"w": 3}})", "tensor 'w': file is a JSON number"},
      {R"({"weight_map": {"w": "../x.safetensors"}})", "tensor 'w': file"},
      {R"({"weight_map": {"w": "/etc/x"}})", "relative path"},
      {R"({"weight_map": {"w": ""}})", "relative path"},
      {R"({"weight_map": {"w": "a", "w": "b"}})", "'w' appears more than once"},
  };
  for (const Case& c : cases) {
    WriteBytes(path, c.text);
    auto index = ReadSafetensorsIndex(path);
    ASSERT_FALSE(index.ok()) << c.text;
    EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(index.status().message()), StartsWith(path));
    EXPECT_THAT(std::string(index.status().message()), HasSubstr(c.want))
        << c.text;
  }
  WriteBytes(path, R"({"weight_map": {"w": "sub/model.safetensors"}})");
  auto ok = ReadSafetensorsIndex(path);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->at("w"), "sub/model.safetensors");

  EXPECT_EQ(ReadSafetensorsIndex(dir.File("missing.json")).status().code(),
            absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// Open errors.

TEST(SafetensorsFileTest, ConcurrentReadsSeeTheSameBytes) {
  TempDir dir;
  std::vector<std::string> data;
  std::vector<StTensorView> views;
  for (int i = 0; i < 32; ++i) data.push_back(Bytes(64 + i, i));
  for (int i = 0; i < 32; ++i) {
    views.push_back(View(absl::StrCat("t", i), StDtype::kU8,
                         {static_cast<int64_t>(data[i].size())}, data[i]));
  }
  const std::string path = dir.File("c.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, views, {}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& f = **file;
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        for (int i = 0; i < 32; ++i) {
          const StTensorInfo* info = f.Find(absl::StrCat("t", i));
          if (info == nullptr || SpanString(f.Data(*info)) != data[i]) {
            ++mismatches[t];
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

TEST(SafetensorsFileTest, OpenErrorsAreClear) {
  TempDir dir;
  auto missing = SafetensorsFile::Open(dir.File("missing.safetensors"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("missing.safetensors"));

  auto directory = SafetensorsFile::Open(dir.path());
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(directory.status().message()),
              HasSubstr("is a directory"));

  WriteBytes(dir.File("empty.safetensors"), "");
  auto empty = SafetensorsFile::Open(dir.File("empty.safetensors"));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("empty file"));

  const std::string bad = dir.File("bad.safetensors");
  WriteBytes(bad, MakeFile(R"({"model.norm.weight":)" +
                               Entry("BF16", "[4]", 0, 12) + "}",
                           Bytes(12)));
  auto mismatch = SafetensorsFile::Open(bad);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mismatch.status().message(),
            bad +
                ": tensor 'model.norm.weight': data_offsets [0, 12] hold 12 "
                "bytes but shape [4] of BF16 needs 8");
}

}  // namespace
}  // namespace fusionrl
