// The controller's state journal: records come back as appended, across
// reopening and compaction; a tail cut short or corrupted is dropped with a
// warning naming where, and later appends follow the good records; a
// damaged snapshot refuses to load.
#include "controller/state_journal.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/state-journal-" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

std::unique_ptr<StateJournal> OpenOk(const std::string& dir,
                                     StateJournal::Loaded* loaded) {
  auto j = StateJournal::Open(dir, loaded);
  EXPECT_TRUE(j.ok()) << j.status();
  return j.ok() ? *std::move(j) : nullptr;
}

void Corrupt(const std::string& path, std::streamoff at, char byte) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(at);
  f.put(byte);
}

TEST(StateJournalTest, RecordsSurviveReopeningAndCompaction) {
  const std::string dir = FreshDir("reopen");
  StateJournal::Loaded loaded;
  {
    auto j = OpenOk(dir, &loaded);
    ASSERT_NE(j, nullptr);
    EXPECT_FALSE(loaded.has_snapshot);
    EXPECT_TRUE(loaded.records.empty());
    ASSERT_TRUE(j->Append({"one", std::string("t\0o", 3)}).ok());
    ASSERT_TRUE(j->Append({""}).ok());  // an empty payload is a record too
  }
  {
    auto j = OpenOk(dir, &loaded);
    ASSERT_NE(j, nullptr);
    EXPECT_TRUE(loaded.warning.empty()) << loaded.warning;
    EXPECT_THAT(loaded.records, ElementsAre("one", std::string("t\0o", 3), ""));
    ASSERT_TRUE(j->Compact("everything so far").ok());
    EXPECT_EQ(j->journal_bytes(), 0);
    ASSERT_TRUE(j->Append({"after"}).ok());
  }
  auto j = OpenOk(dir, &loaded);
  ASSERT_NE(j, nullptr);
  EXPECT_TRUE(loaded.has_snapshot);
  EXPECT_EQ(loaded.snapshot, "everything so far");
  EXPECT_THAT(loaded.records, ElementsAre("after"));
}

TEST(StateJournalTest, ATailCutShortIsDroppedAndNewRecordsFollowTheGoodOnes) {
  // Every cut inside the second record (a crash mid-write) keeps exactly
  // the first, says so, and leaves the file at the first's end.
  const uintmax_t first_end = 8 + 5, full = first_end + 8 + 6;
  StateJournal::Loaded loaded;
  for (uintmax_t cut = first_end + 1; cut < full; ++cut) {
    const std::string dir = FreshDir("cut");
    {
      auto j = OpenOk(dir, &loaded);
      ASSERT_TRUE(j->Append({"first", "second"}).ok());
    }
    ASSERT_EQ(std::filesystem::file_size(dir + "/journal"), full);
    std::filesystem::resize_file(dir + "/journal", cut);
    auto j = OpenOk(dir, &loaded);
    ASSERT_NE(j, nullptr);
    EXPECT_THAT(loaded.records, ElementsAre("first")) << "cut at " << cut;
    EXPECT_THAT(loaded.warning, HasSubstr("cut short")) << "cut at " << cut;
    EXPECT_THAT(loaded.warning, HasSubstr("1 good record(s)"));
    EXPECT_EQ(std::filesystem::file_size(dir + "/journal"), first_end);
    // New records follow the good ones.
    ASSERT_TRUE(j->Append({"third"}).ok());
    j.reset();
    j = OpenOk(dir, &loaded);
    EXPECT_TRUE(loaded.warning.empty()) << loaded.warning;
    EXPECT_THAT(loaded.records, ElementsAre("first", "third"));
  }
}

TEST(StateJournalTest, ACorruptedRecordEndsTheJournalThere) {
  StateJournal::Loaded loaded;
  const std::string dir = FreshDir("crc");
  {
    auto j = OpenOk(dir, &loaded);
    ASSERT_TRUE(j->Append({"aaaa", "bbbb", "cccc"}).ok());
  }
  Corrupt(dir + "/journal", 12 + 8 + 1, 'X');  // a byte of "bbbb"
  {
    auto j = OpenOk(dir, &loaded);
    ASSERT_NE(j, nullptr);
    EXPECT_THAT(loaded.records, ElementsAre("aaaa"));
    EXPECT_THAT(loaded.warning, HasSubstr("fails its CRC-32C"));
    EXPECT_THAT(loaded.warning, HasSubstr("at byte 12"));
  }
  // A length turned into garbage is caught before it is believed.
  const std::string dir2 = FreshDir("length");
  {
    auto j = OpenOk(dir2, &loaded);
    ASSERT_TRUE(j->Append({"aaaa", "bbbb"}).ok());
  }
  Corrupt(dir2 + "/journal", 12 + 3, '\x7f');  // the length's top byte
  auto j = OpenOk(dir2, &loaded);
  ASSERT_NE(j, nullptr);
  EXPECT_THAT(loaded.records, ElementsAre("aaaa"));
  EXPECT_THAT(loaded.warning, HasSubstr("claims"));
}

TEST(StateJournalTest, ADamagedSnapshotRefusesToLoad) {
  const std::string dir = FreshDir("snapshot");
  StateJournal::Loaded loaded;
  {
    auto j = OpenOk(dir, &loaded);
    ASSERT_TRUE(j->Compact("the state").ok());
  }
  Corrupt(dir + "/snapshot", 10, 'X');
  auto j = StateJournal::Open(dir, &loaded);
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(j.status().message(), HasSubstr("snapshot"));
  EXPECT_THAT(j.status().message(), HasSubstr("damaged"));
}

TEST(StateJournalTest, FramesAreReadBackExactly) {
  std::string data;
  std::vector<std::string> want;
  for (int i = 0; i < 50; ++i) {
    want.push_back(
        std::string(static_cast<size_t>(i * 7), static_cast<char>(i)));
    data += internal::FrameRecord(want.back());
  }
  int64_t good = 0;
  std::string error;
  EXPECT_EQ(internal::ReadFramedRecords(data, &good, &error), want);
  EXPECT_EQ(good, static_cast<int64_t>(data.size()));
  EXPECT_TRUE(error.empty());
}

}  // namespace
}  // namespace fusionrl
