#include "cli/common/child_process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace fusionrl::cli {
namespace {

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace

void LogToStderr() {
  spdlog::set_default_logger(spdlog::stderr_color_mt("fusionrl-child"));
}

absl::StatusOr<std::string> SelfExecutable() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return absl::InternalError("cannot read /proc/self/exe");
  return std::string(buf, n);
}

absl::StatusOr<nlohmann::ordered_json> RunJsonChild(
    const std::vector<std::string>& argv, int timeout_seconds) {
  std::vector<std::string> quoted;
  for (const auto& a : argv) quoted.push_back(ShellQuote(a));
  const std::string cmd =
      absl::StrCat("timeout --kill-after=10 ", timeout_seconds, " ",
                   absl::StrJoin(quoted, " "), " </dev/null");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    return absl::InternalError(absl::StrCat("cannot start: ", cmd));
  }
  std::string output;
  char chunk[4096];
  size_t got;
  while ((got = fread(chunk, 1, sizeof(chunk), pipe)) > 0) {
    output.append(chunk, got);
  }
  const int status = pclose(pipe);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const std::string tail =
      output.size() > 2000 ? output.substr(output.size() - 2000) : output;
  if (code == 124 || code == 137) {
    return absl::DeadlineExceededError(absl::StrCat(
        "timed out after ", timeout_seconds, " s: ", argv[0], "\n", tail));
  }
  if (code != 0) {
    return absl::InternalError(absl::StrCat(
        "exited with code ", code, ": ", absl::StrJoin(argv, " "), "\n", tail));
  }
  std::istringstream lines(output);
  std::string line;
  nlohmann::ordered_json last;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::ordered_json::parse(line, nullptr, false);
    if (j.is_object()) last = std::move(j);
  }
  if (last.is_null()) {
    return absl::InternalError(absl::StrCat(
        "printed no JSON object: ", absl::StrJoin(argv, " "), "\n", tail));
  }
  return last;
}

}  // namespace fusionrl::cli
