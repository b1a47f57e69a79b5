// The pieces of the config schema shared by its reader, validator and
// emitter: error formatting, exact doubles, and the enum spellings of
// fusionrl/config.h.
#include "core/config_schema.h"

#include <charconv>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fusionrl {

absl::StatusOr<BehaviourWeightMode> ParseBehaviourWeightMode(
    absl::string_view name) {
  if (name == "truncate") return BehaviourWeightMode::kTruncate;
  if (name == "mask") return BehaviourWeightMode::kMask;
  return absl::InvalidArgumentError(
      absl::StrCat("must be one of truncate, mask; got '", name, "'"));
}

const char* BehaviourWeightModeName(BehaviourWeightMode mode) {
  switch (mode) {
    case BehaviourWeightMode::kTruncate:
      return "truncate";
    case BehaviourWeightMode::kMask:
      return "mask";
  }
  return "?";
}

namespace config_internal {

absl::Status FormatError(absl::string_view source, const FieldError& e) {
  std::vector<absl::string_view> parts;
  for (absl::string_view p : {source, absl::string_view(e.path)}) {
    if (!p.empty()) parts.push_back(p);
  }
  parts.push_back(e.reason);
  return absl::Status(e.code, absl::StrJoin(parts, ": "));
}

std::string FormatDouble(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return absl::StrCat(v);
  return std::string(buf, end);
}

}  // namespace config_internal
}  // namespace fusionrl
