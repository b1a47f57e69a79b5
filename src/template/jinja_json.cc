// The chat-template values as JSON: the render's variables in (FromJson)
// and Python's json.dumps out (ToJson, for transformers' tojson filter).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {

Value FromJson(const nlohmann::ordered_json& json) {
  using T = nlohmann::ordered_json::value_t;
  switch (json.type()) {
    case T::null:
      return Value::None();
    case T::boolean:
      return Value(json.get<bool>());
    case T::number_integer:
      return Value(json.get<int64_t>());
    case T::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        Fail(absl::StrCat("integer out of range in the variables: ", u));
      }
      return Value(static_cast<int64_t>(u));
    }
    case T::number_float:
      return Value(json.get<double>());
    case T::string:
      return Value(json.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJson(item));
      return Value::MakeList(std::move(items));
    }
    case T::object: {
      Dict dict;
      dict.entries.reserve(json.size());
      for (const auto& [key, item] : json.items()) {
        dict.entries.emplace_back(key, FromJson(item));
      }
      return Value::MakeDict(std::move(dict));
    }
    default:
      Fail("unsupported JSON value in the variables (binary)");
  }
}

namespace {

void JsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (uint32_t c : DecodeUtf8(s)) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default: {
        char buf[16];
        if (c < 0x20) {
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else if (ensure_ascii && c > 0x7e) {
          if (c >= 0x10000) {
            const uint32_t v = c - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x",
                          0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          }
          *out += buf;
        } else {
          AppendUtf8(c, out);
        }
      }
    }
  }
  out->push_back('"');
}

void DumpJson(const Value& v, const JsonDumpOptions& o, int depth,
              std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return;
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      absl::StrAppend(out, v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : FloatRepr(d);
      return;
    }
    case Value::Kind::kString:
      JsonString(v.as_string(), o.ensure_ascii, out);
      return;
    default:
      break;
  }
  const bool is_list = v.is_list();
  if (!is_list && !v.is_dict() && !v.is_namespace()) {
    Fail(absl::StrCat("Object of type ", v.TypeName(),
                      " is not JSON serializable"));
  }
  std::vector<std::pair<std::string, const Value*>> entries;
  size_t size;
  if (is_list) {
    size = v.as_list().items.size();
  } else {
    const Dict& d = v.is_dict() ? v.as_dict() : v.namespace_dict();
    for (const auto& [k, item] : d.entries) entries.emplace_back(k, &item);
    if (o.sort_keys) {
      std::stable_sort(
          entries.begin(), entries.end(),
          [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    size = entries.size();
  }
  out->push_back(is_list ? '[' : '{');
  if (size == 0) {
    out->push_back(is_list ? ']' : '}');
    return;
  }
  std::string newline;
  if (o.indent >= 0) {
    newline = "\n";
    for (int i = 0; i <= depth; ++i) newline += o.indent_string;
  }
  for (size_t i = 0; i < size; ++i) {
    if (i > 0) *out += o.item_separator;
    *out += newline;
    if (is_list) {
      DumpJson(v.as_list().items[i], o, depth + 1, out);
    } else {
      JsonString(entries[i].first, o.ensure_ascii, out);
      *out += o.key_separator;
      DumpJson(*entries[i].second, o, depth + 1, out);
    }
  }
  if (o.indent >= 0) {
    *out += "\n";
    for (int i = 0; i < depth; ++i) *out += o.indent_string;
  }
  out->push_back(is_list ? ']' : '}');
}

}  // namespace

std::string ToJson(const Value& value, const JsonDumpOptions& options) {
  std::string out;
  DumpJson(value, options, 0, &out);
  return out;
}

}  // namespace fusionrl::jinja::internal
