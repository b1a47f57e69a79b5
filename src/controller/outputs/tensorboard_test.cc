// TensorBoardWriter: files read back with a decoder written here from the
// format's description (its own bitwise CRC-32C, varints and fixed-width
// fields; nothing shared with the writer) hold the file_version event first
// and then the steps, tags and values written; a flipped byte fails a CRC;
// the bytes equal a published reference; bad paths give clear errors.
#include "controller/outputs/tensorboard.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---- An independent decoder ------------------------------------------------

uint32_t BitwiseCrc32c(const std::string& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
  }
  return ~crc;
}

uint32_t Masked(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

uint64_t LittleEndian(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  }
  return v;
}

// The records of a TFRecord file; `error` says why reading stopped early.
std::vector<std::string> ReadRecords(const std::string& file,
                                     std::string* error) {
  std::vector<std::string> records;
  size_t at = 0;
  error->clear();
  while (at < file.size()) {
    if (file.size() - at < 12) {
      *error = "truncated header at " + std::to_string(at);
      break;
    }
    const uint64_t length = LittleEndian(file, at, 8);
    if (Masked(BitwiseCrc32c(file.substr(at, 8))) !=
        LittleEndian(file, at + 8, 4)) {
      *error = "length CRC mismatch at " + std::to_string(at);
      break;
    }
    if (file.size() - at - 12 < length + 4) {
      *error = "truncated data at " + std::to_string(at);
      break;
    }
    std::string data = file.substr(at + 12, length);
    if (Masked(BitwiseCrc32c(data)) !=
        LittleEndian(file, at + 12 + length, 4)) {
      *error = "data CRC mismatch at " + std::to_string(at);
      break;
    }
    records.push_back(std::move(data));
    at += 12 + length + 4;
  }
  return records;
}

// A protobuf message's fields: (field number, wire type, raw value) where
// the raw value is the varint / fixed bits, or the bytes for wire type 2.
struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t bits = 0;
  std::string bytes;
};

bool ReadVarint(const std::string& s, size_t* at, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*at >= s.size()) return false;
    const unsigned char b = static_cast<unsigned char>(s[(*at)++]);
    *v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

std::vector<Field> ParseFields(const std::string& s, bool* ok) {
  std::vector<Field> fields;
  size_t at = 0;
  *ok = true;
  while (at < s.size()) {
    uint64_t key;
    if (!ReadVarint(s, &at, &key)) break;
    Field f;
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire_type = static_cast<uint32_t>(key & 7);
    if (f.wire_type == 0) {
      if (!ReadVarint(s, &at, &f.bits)) break;
    } else if (f.wire_type == 1 || f.wire_type == 5) {
      const int n = f.wire_type == 1 ? 8 : 4;
      if (s.size() - at < static_cast<size_t>(n)) break;
      f.bits = LittleEndian(s, at, n);
      at += n;
    } else if (f.wire_type == 2) {
      uint64_t n;
      if (!ReadVarint(s, &at, &n) || s.size() - at < n) break;
      f.bytes = s.substr(at, n);
      at += n;
    } else {
      break;
    }
    fields.push_back(std::move(f));
  }
  if (at != s.size()) *ok = false;
  return fields;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  bool has_file_version = false;
  std::string file_version;
  bool has_summary = false;
  std::vector<std::pair<std::string, float>> values;
};

Event DecodeEvent(const std::string& data) {
  Event e;
  bool ok;
  for (const Field& f : ParseFields(data, &ok)) {
    if (f.number == 1 && f.wire_type == 1) {
      std::memcpy(&e.wall_time, &f.bits, 8);
    } else if (f.number == 2 && f.wire_type == 0) {
      e.step = static_cast<int64_t>(f.bits);
    } else if (f.number == 3 && f.wire_type == 2) {
      e.has_file_version = true;
      e.file_version = f.bytes;
    } else if (f.number == 5 && f.wire_type == 2) {
      e.has_summary = true;
      bool summary_ok;
      for (const Field& v : ParseFields(f.bytes, &summary_ok)) {
        EXPECT_EQ(v.number, 1u);
        EXPECT_EQ(v.wire_type, 2u);
        std::pair<std::string, float> tv{"", NAN};
        bool value_ok;
        for (const Field& g : ParseFields(v.bytes, &value_ok)) {
          if (g.number == 1 && g.wire_type == 2) tv.first = g.bytes;
          if (g.number == 2 && g.wire_type == 5) {
            const uint32_t bits = static_cast<uint32_t>(g.bits);
            std::memcpy(&tv.second, &bits, 4);
          }
        }
        EXPECT_TRUE(value_ok);
        e.values.push_back(tv);
      }
      EXPECT_TRUE(summary_ok);
    } else {
      ADD_FAILURE() << "unexpected field " << f.number << " wire type "
                    << f.wire_type;
    }
  }
  EXPECT_TRUE(ok) << "trailing bytes in an event";
  return e;
}

// ---- Helpers ---------------------------------------------------------------

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/tensorboard-" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<Event> ReadEvents(const std::string& path) {
  std::string error;
  std::vector<Event> events;
  for (const std::string& r : ReadRecords(ReadFile(path), &error)) {
    events.push_back(DecodeEvent(r));
  }
  EXPECT_EQ(error, "");
  return events;
}

std::unique_ptr<TensorBoardWriter> OpenOk(const std::string& dir,
                                          double wall_time) {
  auto w = TensorBoardWriter::Open(dir, wall_time);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : nullptr;
}

// ---- Tests -----------------------------------------------------------------

TEST(TensorBoardWriterTest, FileVersionFirstThenStepsTagsAndValues) {
  const std::string dir = FreshDir("roundtrip") + "/nested/run";
  auto w = OpenOk(dir, 1700000000.25);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->WriteScalars(1, 1700000001.5,
                              {{"reward_mean", 0.125}, {"loss/policy", -3.5}})
                  .ok());
  ASSERT_TRUE(w->WriteScalars(2, 1700000002.75, {{"reward_mean", 0.1}}).ok());
  ASSERT_TRUE(
      w->WriteScalars(300000, 1700000003.0, {{"tokens_per_second", 1934.5}})
          .ok());

  // Flushed per call: readable while the writer is still open.
  const std::vector<Event> events = ReadEvents(w->path());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_TRUE(events[0].has_file_version);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_FALSE(events[0].has_summary);
  EXPECT_EQ(events[0].step, 0);
  EXPECT_EQ(events[0].wall_time, 1700000000.25);

  EXPECT_FALSE(events[1].has_file_version);
  EXPECT_TRUE(events[1].has_summary);
  EXPECT_EQ(events[1].step, 1);
  EXPECT_EQ(events[1].wall_time, 1700000001.5);
  ASSERT_EQ(events[1].values.size(), 2u);
  EXPECT_EQ(events[1].values[0].first, "reward_mean");
  EXPECT_EQ(events[1].values[0].second, 0.125f);
  EXPECT_EQ(events[1].values[1].first, "loss/policy");
  EXPECT_EQ(events[1].values[1].second, -3.5f);

  EXPECT_EQ(events[2].step, 2);
  EXPECT_EQ(events[2].wall_time, 1700000002.75);
  ASSERT_EQ(events[2].values.size(), 1u);
  EXPECT_EQ(events[2].values[0].second, 0.1f);  // rounded to float

  EXPECT_EQ(events[3].step, 300000);  // a multi-byte varint
  ASSERT_EQ(events[3].values.size(), 1u);
  EXPECT_EQ(events[3].values[0].first, "tokens_per_second");
  EXPECT_EQ(events[3].values[0].second, 1934.5f);

  // The same again after closing (the destructor flushes and closes).
  const std::string path = w->path();
  w.reset();
  EXPECT_EQ(ReadEvents(path).size(), 4u);
}

TEST(TensorBoardWriterTest, FileNameIsWhatTensorBoardGlobs) {
  const std::string dir = FreshDir("name");
  auto w = OpenOk(dir, 1234567890.9);
  ASSERT_NE(w, nullptr);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(w->path(), dir + "/events.out.tfevents.1234567890." +
                           std::string(host) + ".fusionrl");
  EXPECT_TRUE(std::filesystem::is_regular_file(w->path()));
}

TEST(TensorBoardWriterTest, SecondWriterInTheSameSecondGetsItsOwnFile) {
  const std::string dir = FreshDir("collision");
  auto a = OpenOk(dir, 100.0);
  auto b = OpenOk(dir, 100.5);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->path(), b->path());
  EXPECT_THAT(b->path(), HasSubstr("tfevents.100."));
  EXPECT_THAT(b->path(), HasSubstr(".1.fusionrl"));
  ASSERT_TRUE(a->WriteScalars(1, 101, {{"x", 1}}).ok());
  ASSERT_TRUE(b->WriteScalars(1, 101, {{"x", 2}}).ok());
  EXPECT_EQ(ReadEvents(a->path()).size(), 2u);
  const std::vector<Event> b_events = ReadEvents(b->path());
  ASSERT_EQ(b_events.size(), 2u);
  ASSERT_EQ(b_events[1].values.size(), 1u);
  EXPECT_EQ(b_events[1].values[0].second, 2.0f);
}

// Bytes published by TeamHG-Memex/tensorboard_logger
// (tests/test_tensorboard_logger.py, test_serialization), a writer whose
// files TensorBoard reads: wall time 256.5, ('v/1', 1.5) at step 1 and
// ('v/22', 16.0) at step 2, one value per event.
TEST(TensorBoardWriterTest, BytesEqualAPublishedReference) {
  const std::string expected(
      "\x18\x00\x00\x00\x00\x00\x00\x00\xa3\x7f\x4b\x22"
      "\x09\x00\x00\x00\x00\x00\x08\x70\x40"
      "\x1a\x0d"
      "brain.Event:2"
      "\xbc\x98\x21\x2b"
      "\x19\x00\x00\x00\x00\x00\x00\x00\x8b\xf1\x08\x28"
      "\x09\x00\x00\x00\x00\x00\x08\x70\x40\x10\x01"
      "\x2a\x0c\x0a\x0a\x0a\x03"
      "v/1"
      "\x15\x00\x00\xc0\x3f"
      "\x2c\xec\xc0\x87"
      "\x1a\x00\x00\x00\x00\x00\x00\x00\x12\x9b\xd8\x2d"
      "\x09\x00\x00\x00\x00\x00\x08\x70\x40\x10\x02"
      "\x2a\x0d\x0a\x0b\x0a\x04"
      "v/22"
      "\x15\x00\x00\x80\x41"
      "\x8f\xa3\xb6\x88",
      40 + 41 + 42);
  const std::string dir = FreshDir("reference");
  auto w = OpenOk(dir, 256.5);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->WriteScalars(1, 256.5, {{"v/1", 1.5}}).ok());
  ASSERT_TRUE(w->WriteScalars(2, 256.5, {{"v/22", 16.0}}).ok());
  ASSERT_TRUE(w->Flush().ok());
  EXPECT_EQ(ReadFile(w->path()), expected);
  // And our own decoder agrees with the reference, field by field.
  std::string error;
  const std::vector<std::string> records = ReadRecords(expected, &error);
  EXPECT_EQ(error, "");
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(DecodeEvent(records[0]).file_version, "brain.Event:2");
  const Event third = DecodeEvent(records[2]);
  EXPECT_EQ(third.step, 2);
  ASSERT_EQ(third.values.size(), 1u);
  EXPECT_EQ(third.values[0].first, "v/22");
  EXPECT_EQ(third.values[0].second, 16.0f);
}

TEST(TensorBoardWriterTest, ACorruptedByteFailsItsCrc) {
  const std::string dir = FreshDir("corrupt");
  std::string path;
  {
    auto w = OpenOk(dir, 1000.0);
    ASSERT_NE(w, nullptr);
    ASSERT_TRUE(w->WriteScalars(7, 1001.0, {{"loss", 0.5}}).ok());
    path = w->path();
  }
  const std::string good = ReadFile(path);
  std::string error;
  ASSERT_EQ(ReadRecords(good, &error).size(), 2u);
  ASSERT_EQ(error, "");
  // The first record: 12 header bytes, 24 of event (9 of wall time, 15 of
  // file_version), 4 of CRC.
  const size_t second = 12 + LittleEndian(good, 0, 8) + 4;
  ASSERT_EQ(second, 40u);

  std::string data_damaged = good;
  data_damaged[second + 12 + 3] ^= 0x01;  // inside the second event
  EXPECT_EQ(ReadRecords(data_damaged, &error).size(), 1u);
  EXPECT_EQ(error, "data CRC mismatch at 40");

  std::string length_damaged = good;
  length_damaged[second] ^= 0x01;  // the second record's length
  EXPECT_EQ(ReadRecords(length_damaged, &error).size(), 1u);
  EXPECT_EQ(error, "length CRC mismatch at 40");

  std::string torn = good.substr(0, good.size() - 3);
  EXPECT_EQ(ReadRecords(torn, &error).size(), 1u);
  EXPECT_EQ(error, "truncated data at 40");
}

TEST(TensorBoardWriterTest, OpenUnderARegularFileSaysWhereAndWhy) {
  const std::string dir = FreshDir("under-file");
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/plain";
  std::ofstream(file) << "not a directory";
  auto w = TensorBoardWriter::Open(file + "/tb", 1.0);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr("'" + file + "/tb'"));
  EXPECT_THAT(w.status().message(), HasSubstr("Not a directory"));
}

TEST(TensorBoardWriterTest, OpenInAReadOnlyDirectorySaysWhereAndWhy) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes to read-only dirs";
  const std::string dir = FreshDir("read-only");
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::owner_read |
                                        std::filesystem::perms::owner_exec);
  auto w = TensorBoardWriter::Open(dir, 1.0);
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr(dir + "/events.out.tfevents."));
  EXPECT_THAT(w.status().message(), HasSubstr("Permission denied"));
}

TEST(TensorBoardWriterTest, RejectsAWallTimeThatIsNotAnEpochTime) {
  const std::string dir = FreshDir("wall-time");
  for (double t :
       {-1.0, static_cast<double>(NAN), static_cast<double>(INFINITY)}) {
    auto w = TensorBoardWriter::Open(dir, t);
    ASSERT_FALSE(w.ok()) << t;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(w.status().message(), HasSubstr("wall time"));
  }
  auto w = OpenOk(dir, 5.0);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->WriteScalars(1, NAN, {{"x", 1}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadEvents(w->path()).size(), 1u);  // nothing written
}

TEST(TensorBoardWriterTest, NonFiniteAndOutOfRangeValuesAreWritten) {
  const std::string dir = FreshDir("non-finite");
  auto w = OpenOk(dir, 10.0);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->WriteScalars(3, 11.0,
                              {{"nan", NAN},
                               {"inf", INFINITY},
                               {"-inf", -INFINITY},
                               {"huge", 1e300},
                               {"-huge", -1e300},
                               {"tiny", 1e-300}})
                  .ok());
  const std::vector<Event> events = ReadEvents(w->path());
  ASSERT_EQ(events.size(), 2u);
  const auto& v = events[1].values;
  ASSERT_EQ(v.size(), 6u);
  EXPECT_TRUE(std::isnan(v[0].second));
  EXPECT_EQ(v[1].second, INFINITY);
  EXPECT_EQ(v[2].second, -INFINITY);
  EXPECT_EQ(v[3].second, INFINITY);
  EXPECT_EQ(v[4].second, -INFINITY);
  EXPECT_EQ(v[5].second, 0.0f);
}

TEST(TensorBoardWriterTest, StepZeroNegativeStepsAndEmptySummaries) {
  const std::string dir = FreshDir("steps");
  auto w = OpenOk(dir, 10.0);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->WriteScalars(0, 10.0, {{"initial_eval_accuracy", 0.25}}).ok());
  ASSERT_TRUE(w->WriteScalars(-2, 10.0, {{"x", 1}}).ok());
  ASSERT_TRUE(w->WriteScalars(int64_t{1} << 40, 10.0, {}).ok());
  const std::vector<Event> events = ReadEvents(w->path());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[1].step, 0);
  ASSERT_EQ(events[1].values.size(), 1u);
  EXPECT_EQ(events[1].values[0].first, "initial_eval_accuracy");
  EXPECT_EQ(events[2].step, -2);
  EXPECT_EQ(events[3].step, int64_t{1} << 40);
  EXPECT_TRUE(events[3].has_summary);
  EXPECT_TRUE(events[3].values.empty());
}

// A write that fails part-way leaves a torn record; the writer then refuses
// to append after it. The file size limit makes the kernel cut the write.
TEST(TensorBoardWriterTest, AFailedWriteIsReportedAndSticks) {
  const std::string dir = FreshDir("sticky");
  auto w = OpenOk(dir, 10.0);
  ASSERT_NE(w, nullptr);
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct sigaction ignore = {}, old_action;
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 100;  // the first record is 40 bytes
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status first =
      w->WriteScalars(1, 11.0, {{std::string(200, 'x'), 1.0}});
  const absl::Status second = w->WriteScalars(2, 12.0, {{"y", 2.0}});
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ASSERT_EQ(::sigaction(SIGXFSZ, &old_action, nullptr), 0);

  EXPECT_EQ(first.code(), absl::StatusCode::kInternal) << first;
  EXPECT_THAT(first.message(), HasSubstr(w->path()));
  EXPECT_THAT(first.message(), HasSubstr("File too large"));
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
  EXPECT_THAT(second.message(), HasSubstr("File too large"));
  EXPECT_FALSE(w->Flush().ok());

  std::string error;
  EXPECT_EQ(ReadRecords(ReadFile(w->path()), &error).size(), 1u);
  EXPECT_THAT(error, StartsWith("truncated data at 40"));
}

TEST(TensorBoardWriterTest, AnOpenWhoseFirstWriteFailsLeavesNoFile) {
  const std::string dir = FreshDir("open-fails");
  std::filesystem::create_directories(dir);
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct sigaction ignore = {}, old_action;
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 10;  // less than the 40-byte first record
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto w = TensorBoardWriter::Open(dir, 20.0);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ASSERT_EQ(::sigaction(SIGXFSZ, &old_action, nullptr), 0);

  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(w.status().message(),
              HasSubstr(dir + "/events.out.tfevents.20."));
  EXPECT_THAT(w.status().message(), HasSubstr("File too large"));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST(TensorBoardWriterTest, FramingMatchesTheIndependentCrc) {
  // The writer's CRC (core/crc32c) against the bitwise one here, on a
  // record whose payload is long enough for the hardware path.
  const std::string payload(1000, '\x5a');
  const std::string record = internal::FrameTfRecord(payload);
  ASSERT_EQ(record.size(), 12 + 1000 + 4u);
  EXPECT_EQ(LittleEndian(record, 0, 8), 1000u);
  EXPECT_EQ(LittleEndian(record, 8, 4),
            Masked(BitwiseCrc32c(record.substr(0, 8))));
  EXPECT_EQ(LittleEndian(record, 1012, 4), Masked(BitwiseCrc32c(payload)));
  EXPECT_EQ(BitwiseCrc32c("123456789"), 0xE3069283u);  // the check value
}

}  // namespace
}  // namespace fusionrl
