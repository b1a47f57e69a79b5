// JobConfigToYaml: a JobConfig as YAML, every key in schema order, doubles
// exact (the text reads back to the same config).
#include <yaml-cpp/yaml.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "core/config_schema.h"
#include "fusionrl/config.h"

namespace fusionrl {
namespace {

using config_internal::FormatDouble;
using config_internal::NumRule;
using config_internal::StrRule;

// Emitter: writes every key as YAML.

class Emitter {
 public:
  Emitter() { out_ << YAML::BeginMap; }

  std::string Finish() {
    out_ << YAML::EndMap;
    return absl::StrCat(out_.c_str(), "\n");
  }

  void Int(const char* key, int* v, const NumRule&) { Put(key, *v); }
  void Int64(const char* key, int64_t* v, const NumRule&) { Put(key, *v); }
  void Double(const char* key, double* v, const NumRule&) {
    std::string text = FormatDouble(*v);
    // "1.0", not "1": a reader sees the field is a float.
    if (text.find_first_not_of("-0123456789") == std::string::npos) {
      text += ".0";
    }
    Put(key, text);
  }
  void Bool(const char* key, bool* v) { Put(key, *v); }
  void String(const char* key, std::string* v, const StrRule&) { Put(key, *v); }
  template <class E, class Parse>
  void Enum(const char* key, E* v, Parse, const char* (*name)(E)) {
    Put(key, name(*v));
  }

  template <class Body>
  void Section(const char* key, Body body) {
    out_ << YAML::Key << key << YAML::Value << YAML::BeginMap;
    body();
    out_ << YAML::EndMap;
  }

 private:
  template <class T>
  void Put(const char* key, const T& value) {
    out_ << YAML::Key << key << YAML::Value << value;
  }

  YAML::Emitter out_;
};

}  // namespace

std::string JobConfigToYaml(const JobConfig& config) {
  JobConfig copy = config;
  Emitter emitter;
  config_internal::VisitJob(copy, emitter);
  return emitter.Finish();
}

}  // namespace fusionrl
