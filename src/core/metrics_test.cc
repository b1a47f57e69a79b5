#include "core/metrics.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace fusionrl {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(MetricsTest, RecordToJsonKeepsOrderIntegersAndNulls) {
  const std::string json =
      MetricRecordToJson({{"step", 3},
                          {"reward", 0.25},
                          {"kl", std::numeric_limits<double>::quiet_NaN()}});
  EXPECT_EQ(json, R"({"step":3,"reward":0.25,"kl":null})");
}

TEST(MetricsTest, AppendWritesOneParsableLinePerRecord) {
  const std::string path = testing::TempDir() + "/metrics_test.jsonl";
  {
    auto log = MetricsLog::Open(path, /*truncate=*/true);
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)->Append({{"step", 1}, {"x", 0.5}}).ok());
    ASSERT_TRUE((*log)->Append({{"step", 2}, {"x", 1.5}}).ok());
  }
  std::istringstream lines(ReadAll(path));
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"].get<int>(), n + 1);
    ++n;
  }
  EXPECT_EQ(n, 2);
}

TEST(MetricsTest, OpenFailsWithReadableErrorForMissingDirectory) {
  auto log = MetricsLog::Open("/nonexistent-dir-fusionrl/m.jsonl", true);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find("/nonexistent-dir-fusionrl/m.jsonl"),
            std::string::npos);
}

TEST(MetricsTest, FormatsDurationsAndCounts) {
  EXPECT_EQ(FormatDuration(45), "45s");
  EXPECT_EQ(FormatDuration(185), "3m05s");
  EXPECT_EQ(FormatDuration(7440), "2h04m");
  EXPECT_EQ(FormatCount(950), "950");
  EXPECT_EQ(FormatCount(12345), "12.3k");
  EXPECT_EQ(FormatCount(4560000), "4.56M");
}

TEST(MetricsTest, WriteFileAtomicReplacesContent) {
  const std::string path = testing::TempDir() + "/atomic_test.json";
  ASSERT_TRUE(WriteFileAtomic(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "second").ok());
  EXPECT_EQ(ReadAll(path), "second");
  EXPECT_FALSE(WriteFileAtomic("/nonexistent-dir-fusionrl/x", "y").ok());
}

}  // namespace
}  // namespace fusionrl
