// Helpers shared by the config tests (config_*_test.cc): temp files and the
// check that a job description fails with one line naming its fragments.
#ifndef FUSIONRL_CORE_CONFIG_TEST_UTIL_H_
#define FUSIONRL_CORE_CONFIG_TEST_UTIL_H_

#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "fusionrl/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fusionrl {
namespace config_testing {

// A file under the test temp dir with `content`; returns its path.
inline std::string WriteTempFile(const std::string& name,
                                 const std::string& content) {
  const std::string path =
      absl::StrCat(testing::TempDir(), "/fusionrl_config_test_", name);
  std::ofstream(path) << content;
  return path;
}

// A path under the test temp dir that does not exist.
inline std::string MissingPath(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/fusionrl_config_test_no_such_dir/",
                      name);
}

// Every field is emitted and doubles are exact, so equal YAML means equal
// configs.
inline void ExpectSameConfig(const JobConfig& a, const JobConfig& b) {
  EXPECT_EQ(JobConfigToYaml(a), JobConfigToYaml(b));
  EXPECT_EQ(a.source_path, b.source_path);
}

// Parses `yaml` as "job.yaml" and expects an error with `code` whose message
// contains every fragment.
inline void ExpectError(const std::string& yaml, absl::StatusCode code,
                        const std::vector<std::string>& fragments,
                        const std::vector<std::string>& overrides = {}) {
  SCOPED_TRACE(yaml);
  absl::StatusOr<JobConfig> config =
      ParseJobConfig(yaml, "job.yaml", overrides);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), code) << config.status();
  const std::string message(config.status().message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const std::string& fragment : fragments) {
    EXPECT_THAT(message, ::testing::HasSubstr(fragment));
  }
}

}  // namespace config_testing
}  // namespace fusionrl

#endif  // FUSIONRL_CORE_CONFIG_TEST_UTIL_H_
