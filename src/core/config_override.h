// `key="value"` as a config override (the `--set key.path=value` form that
// ParseJobConfig / LoadJobConfig take), the value double-quoted for YAML so
// that a path with spaces, colons or quotes stays one string.
#ifndef FUSIONRL_CORE_CONFIG_OVERRIDE_H_
#define FUSIONRL_CORE_CONFIG_OVERRIDE_H_

#include <string>

namespace fusionrl {

inline std::string QuotedOverride(const std::string& key,
                                  const std::string& value) {
  std::string quoted = key + "=\"";
  for (char c : value) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace fusionrl

#endif  // FUSIONRL_CORE_CONFIG_OVERRIDE_H_
