// ValidateJobConfig: the per-field rules of the schema (config_schema.h),
// then the checks that involve more than one field (config_cross_field.cc).
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/config_schema.h"
#include "core/hf_config.h"
#include "fusionrl/config.h"

namespace fusionrl {
namespace config_internal {
namespace {

bool IsDevice(absl::string_view s) {
  if (s == "cpu" || s == "mps" || s == "cuda") return true;
  if (!absl::ConsumePrefix(&s, "cuda:") || s.empty()) return false;
  return std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
}

// Validator: applies the per-field rules, stopping at the first error.

class Validator {
 public:
  const std::optional<FieldError>& error() const { return error_; }

  void Int(const char* key, int* v, const NumRule& r) {
    CheckNumber(key, *v, absl::StrCat(*v), r);
  }
  void Int64(const char* key, int64_t* v, const NumRule& r) {
    CheckNumber(key, static_cast<double>(*v), absl::StrCat(*v), r);
  }
  void Double(const char* key, double* v, const NumRule& r) {
    CheckNumber(key, *v, FormatDouble(*v), r);
  }
  void Bool(const char*, bool*) {}

  // The reader only produces valid values; this catches a value out of the
  // enum's range set in code (static_cast).
  template <class E, class Parse>
  void Enum(const char* key, E* v, Parse parse, const char* (*name)(E)) {
    if (error_) return;
    if (!parse(name(*v)).ok()) {
      Fail(key, absl::StrCat("not a valid value (", static_cast<int>(*v), ")"));
    }
  }

  void String(const char* key, std::string* v, const StrRule& r) {
    if (error_) return;
    if (r.non_empty && v->empty()) {
      Fail(key, "must not be empty");
    } else if (r.device && !IsDevice(*v)) {
      Fail(key, absl::StrCat("must be cpu, cuda, cuda:<index> or mps; got '",
                             *v, "'"));
    } else if (!r.one_of.empty() && std::find(r.one_of.begin(), r.one_of.end(),
                                              *v) == r.one_of.end()) {
      Fail(key, absl::StrCat("must be one of ", absl::StrJoin(r.one_of, ", "),
                             "; got '", *v, "'"));
    } else if (r.existing_file && !v->empty()) {
      std::error_code ec;
      if (!std::filesystem::exists(*v, ec)) {
        Fail(key, absl::StrCat("file not found: '", *v, "'"));
        error_->code = absl::StatusCode::kNotFound;
      }
    }
  }

  template <class Body>
  void Section(const char* key, Body body) {
    const std::string saved = prefix_;
    prefix_ = absl::StrCat(prefix_, key, ".");
    body();
    prefix_ = saved;
  }

 private:
  void CheckNumber(const char* key, double v, const std::string& text,
                   const NumRule& r) {
    if (error_) return;
    // Written so that NaN fails.
    const bool ok = (r.lo_open ? v > r.lo : v >= r.lo) &&
                    (r.hi_open ? v < r.hi : v <= r.hi);
    if (ok) return;
    std::string want;
    if (r.hi == kInf) {
      want = absl::StrCat(r.lo_open ? "> " : ">= ", FormatDouble(r.lo));
    } else {
      want = absl::StrCat("in ", r.lo_open ? "(" : "[", FormatDouble(r.lo),
                          ", ", FormatDouble(r.hi), r.hi_open ? ")" : "]");
    }
    Fail(key, absl::StrCat("must be ", want, ", got ", text));
  }

  void Fail(const char* key, std::string reason) {
    error_ = Invalid(absl::StrCat(prefix_, key), std::move(reason));
  }

  std::string prefix_;
  std::optional<FieldError> error_;
};

}  // namespace

std::optional<FieldError> Validate(const JobConfig& config) {
  JobConfig copy = config;
  Validator validator;
  VisitJob(copy, validator);
  if (validator.error()) return validator.error();
  return CheckCrossField(config);
}

}  // namespace config_internal

absl::Status ValidateJobConfig(const JobConfig& config) {
  if (auto error = config_internal::Validate(config)) {
    return config_internal::FormatError(config.source_path, *error);
  }
  return absl::OkStatus();
}

}  // namespace fusionrl
