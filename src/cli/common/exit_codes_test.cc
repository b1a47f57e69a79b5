// The exit-code mapping of every absl::StatusCode (docs/architecture.md,
// "Exit codes"): a script can tell bad input (2) from a failed run (1).
#include "cli/common/exit_codes.h"

#include <set>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace fusionrl::cli {
namespace {

// Every canonical code, 0..16 (checked to be complete below).
constexpr absl::StatusCode kAllCodes[] = {
    absl::StatusCode::kOk,
    absl::StatusCode::kCancelled,
    absl::StatusCode::kUnknown,
    absl::StatusCode::kInvalidArgument,
    absl::StatusCode::kDeadlineExceeded,
    absl::StatusCode::kNotFound,
    absl::StatusCode::kAlreadyExists,
    absl::StatusCode::kPermissionDenied,
    absl::StatusCode::kResourceExhausted,
    absl::StatusCode::kFailedPrecondition,
    absl::StatusCode::kAborted,
    absl::StatusCode::kOutOfRange,
    absl::StatusCode::kUnimplemented,
    absl::StatusCode::kInternal,
    absl::StatusCode::kUnavailable,
    absl::StatusCode::kDataLoss,
    absl::StatusCode::kUnauthenticated,
};

int Expected(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 0;
    // Bad input: config, flags, a missing or mismatching file.
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    // A refused token.
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return 2;
    default:
      return 1;
  }
}

TEST(ExitCodesTest, ConstantsAreTheDocumentedNumbers) {
  EXPECT_EQ(kExitOk, 0);
  EXPECT_EQ(kExitFailure, 1);
  EXPECT_EQ(kExitBadInput, 2);
  EXPECT_EQ(kExitCancelled, 130);
}

TEST(ExitCodesTest, EveryStatusCodeMapsToItsDocumentedExitCode) {
  std::set<int> seen;
  for (absl::StatusCode code : kAllCodes) {
    seen.insert(static_cast<int>(code));
    const absl::Status status = code == absl::StatusCode::kOk
                                    ? absl::OkStatus()
                                    : absl::Status(code, "some message");
    EXPECT_EQ(ExitCodeFor(status), Expected(code))
        << absl::StatusCodeToString(code);
  }
  // The list above is complete: 17 distinct codes, 0..16.
  EXPECT_EQ(seen.size(), 17u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 16);
}

TEST(ExitCodesTest, BadInputIsTwoWhateverTheMessage) {
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("a.yaml: x: unknown key")),
            2);
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("")), 2);
  EXPECT_EQ(ExitCodeFor(absl::FailedPreconditionError("resume")), 2);
  EXPECT_EQ(ExitCodeFor(absl::OutOfRangeError("top_p")), 2);
}

TEST(ExitCodesTest, RuntimeFailuresAreOne) {
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("controller")), 1);
  EXPECT_EQ(ExitCodeFor(absl::DeadlineExceededError("rpc")), 1);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("bug")), 1);
  EXPECT_EQ(ExitCodeFor(absl::CancelledError("stopped")), 1);
}

TEST(ExitCodesTest, FailReturnsTheMappedCode) {
  testing::internal::CaptureStderr();
  const int rc = Fail(absl::InvalidArgumentError("job.yaml: model.x: bad"));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 2);
  EXPECT_EQ(err, "fusionrl: error: job.yaml: model.x: bad\n");
}

}  // namespace
}  // namespace fusionrl::cli
