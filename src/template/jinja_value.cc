// The chat-template value model: Python's truthiness, str/repr printing,
// equality and ordering, and the UTF-8 code-point helpers string operations
// are built on. JSON in and out is in jinja_json.cc.
#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {

void Fail(std::string message) {
  throw JinjaError{absl::StatusCode::kInvalidArgument, std::move(message), 0};
}
void FailAt(int line, std::string message) {
  throw JinjaError{absl::StatusCode::kInvalidArgument, std::move(message),
                   line};
}
void FailResource(std::string message) {
  throw JinjaError{absl::StatusCode::kResourceExhausted, std::move(message), 0};
}

// ---------------------------------------------------------------- Dict

const Value* Dict::Find(absl::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

// ---------------------------------------------------------------- Value

Value Value::None() {
  Value v;
  v.data_ = NoneTag{};
  return v;
}
Value Value::MakeList(std::vector<Value> items, bool is_tuple) {
  Value v;
  v.data_ = std::make_shared<const List>(List{std::move(items), is_tuple});
  return v;
}
Value Value::MakeDict(Dict dict) {
  Value v;
  v.data_ = std::make_shared<const Dict>(std::move(dict));
  return v;
}
Value Value::MakeNamespace(Dict dict) {
  Value v;
  v.data_ = std::make_shared<Dict>(std::move(dict));
  return v;
}
Value Value::MakeCallable(std::string name,
                          std::function<Value(Evaluator&, CallArgs&)> fn) {
  Value v;
  v.data_ = std::make_shared<const Callable>(
      Callable{std::move(name), std::move(fn)});
  return v;
}
Value Value::MakeLoop(std::shared_ptr<const LoopInfo> loop) {
  Value v;
  v.data_ = std::move(loop);
  return v;
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list().items.empty();
    case Kind::kDict:
      return !as_dict().entries.empty();
    default:
      return true;
  }
}

std::string Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return as_list().is_tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
    case Kind::kLoop:
      return "LoopContext";
  }
  return "?";
}

double Value::AsDouble() const {
  if (is_int()) return static_cast<double>(as_int());
  if (is_float()) return as_float();
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  Fail(absl::StrCat("expected a number, got ", TypeName()));
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits, laid out by Python's repr rule: scientific
  // when the exponent is < -4 or >= 16, else positional with a ".0".
  auto r =
      std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  const size_t e = s.find('e');
  std::string mantissa = s.substr(0, e);
  const int exponent = std::stoi(s.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+',
                  std::abs(exponent));
    return out + exp;
  }
  if (exponent < 0) {
    return out + "0." + std::string(-exponent - 1, '0') + digits;
  }
  const size_t int_digits = exponent + 1;
  if (digits.size() <= int_digits) {
    return out + digits + std::string(int_digits - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

namespace {

// Python's str.isprintable() for one code point.
bool IsPrintable(uint32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || c == 0x7f) return false;
  if (c < 0x7f) return true;
  if (c > 0x10ffff || (c >= 0xdc80 && c <= 0xdcff)) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string StringRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t c : DecodeUtf8(s)) {
    if (c == static_cast<uint32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (IsPrintable(c)) {
      AppendUtf8(c, &out);
    } else {
      char buf[16];
      if (c >= 0xdc80 && c <= 0xdcff) c -= 0xdc00;  // an undecodable byte
      std::snprintf(buf, sizeof(buf),
                    c < 0x100     ? "\\x%02x"
                    : c < 0x10000 ? "\\u%04x"
                                  : "\\U%08x",
                    c);
      out += buf;
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace

std::string Value::Str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return as_string();
    case Kind::kNamespace: {
      std::string out = "<Namespace {";
      const Dict& d = namespace_dict();
      for (size_t i = 0; i < d.entries.size(); ++i) {
        if (i > 0) out += ", ";
        out +=
            StringRepr(d.entries[i].first) + ": " + d.entries[i].second.Repr();
      }
      return out + "}>";
    }
    case Kind::kCallable:
      Fail(absl::StrCat("cannot print ", as_callable().name,
                        " (a function; call it)"));
    case Kind::kLoop:
      Fail("cannot print the loop variable");
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(as_int());
    case Kind::kFloat:
      return FloatRepr(as_float());
    case Kind::kString:
      return StringRepr(as_string());
    case Kind::kList: {
      const List& l = as_list();
      std::string out = l.is_tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i > 0) out += ", ";
        out += l.items[i].Repr();
      }
      if (l.is_tuple && l.items.size() == 1) out += ",";
      return out + (l.is_tuple ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = "{";
      const Dict& d = as_dict();
      for (size_t i = 0; i < d.entries.size(); ++i) {
        if (i > 0) out += ", ";
        out +=
            StringRepr(d.entries[i].first) + ": " + d.entries[i].second.Repr();
      }
      return out + "}";
    }
    default:
      return Str();
  }
}

// ---------------------------------------------------------------- compare

bool Equals(const Value& a, const Value& b) {
  using Kind = Value::Kind;
  const bool a_num = a.is_number() || a.is_bool();
  const bool b_num = b.is_number() || b.is_bool();
  if (a_num && b_num) {
    if (a.is_float() || b.is_float()) return a.AsDouble() == b.AsDouble();
    return (a.is_int() ? a.as_int() : a.as_bool()) ==
           (b.is_int() ? b.as_int() : b.as_bool());
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.as_string() == b.as_string();
    case Kind::kList: {
      const List& x = a.as_list();
      const List& y = b.as_list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) {
        return false;
      }
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!Equals(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.Find(k);
        if (other == nullptr || !Equals(v, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return &a.namespace_dict() == &b.namespace_dict();
    case Kind::kCallable:
      return &a.as_callable() == &b.as_callable();
    case Kind::kLoop:
      return &a.as_loop() == &b.as_loop();
    default:
      return false;
  }
}

bool LessThan(const Value& a, const Value& b) {
  const bool a_num = a.is_number() || a.is_bool();
  const bool b_num = b.is_number() || b.is_bool();
  if (a_num && b_num) {
    if (a.is_float() || b.is_float()) return a.AsDouble() < b.AsDouble();
    const int64_t x = a.is_int() ? a.as_int() : a.as_bool();
    const int64_t y = b.is_int() ? b.as_int() : b.as_bool();
    return x < y;
  }
  if (a.is_string() && b.is_string()) {
    return a.as_string() < b.as_string();  // UTF-8 keeps code-point order
  }
  if (a.is_list() && b.is_list() &&
      a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) return LessThan(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  Fail(absl::StrCat("'<' not supported between '", a.TypeName(), "' and '",
                    b.TypeName(), "'"));
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        Fail(absl::StrCat("'in <string>' requires a string on the left, not ",
                          item.TypeName()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.as_list().items) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.as_dict().Find(item.as_string());
    case Value::Kind::kUndefined:
      return false;
    default:
      Fail(absl::StrCat("argument of type '", container.TypeName(),
                        "' is not iterable"));
  }
}

std::vector<Value> Iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kList:
      return value.as_list().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, v] : value.as_dict().entries) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      std::string one;
      for (uint32_t c : DecodeUtf8(value.as_string())) {
        one.clear();
        AppendUtf8(c, &one);
        chars.emplace_back(one);
      }
      return chars;
    }
    case Value::Kind::kUndefined:
      return {};
    default:
      Fail(absl::StrCat("'", value.TypeName(), "' object is not iterable"));
  }
}

Value LoopAttribute(const LoopInfo& loop, absl::string_view name) {
  if (name == "index") return Value(loop.index0 + 1);
  if (name == "index0") return Value(loop.index0);
  if (name == "revindex") return Value(loop.length - loop.index0);
  if (name == "revindex0") return Value(loop.length - loop.index0 - 1);
  if (name == "first") return Value(loop.index0 == 0);
  if (name == "last") return Value(loop.index0 == loop.length - 1);
  if (name == "length") return Value(loop.length);
  if (name == "previtem") return loop.previtem;
  if (name == "nextitem") return loop.nextitem;
  if (name == "depth") return Value(1);
  if (name == "depth0") return Value(0);
  if (name == "cycle") {
    const int64_t index0 = loop.index0;
    return Value::MakeCallable(
        "loop.cycle", [index0](Evaluator&, CallArgs& args) {
          if (!args.keyword.empty() || args.positional.empty()) {
            Fail("loop.cycle() takes one or more positional arguments");
          }
          return args.positional[index0 % args.positional.size()];
        });
  }
  if (name == "changed") Fail("unsupported: loop.changed");
  return Value();
}

// ---------------------------------------------------------------- UTF-8

std::vector<uint32_t> DecodeUtf8(absl::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp;
    const utf8proc_ssize_t n = utf8proc_iterate(
        reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
        static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {
      // An undecodable byte, kept as Python's surrogateescape does so that
      // it encodes back unchanged.
      out.push_back(0xdc00 + static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      out.push_back(static_cast<uint32_t>(cp));
      i += n;
    }
  }
  return out;
}

void AppendUtf8(uint32_t c, std::string* out) {
  if (c >= 0xdc80 && c <= 0xdcff) {
    out->push_back(static_cast<char>(c - 0xdc00));
    return;
  }
  utf8proc_uint8_t buf[4];
  const utf8proc_ssize_t n =
      utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out->append(reinterpret_cast<const char*>(buf), n);
}

std::string EncodeUtf8(const std::vector<uint32_t>& code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (uint32_t c : code_points) AppendUtf8(c, &out);
  return out;
}

bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 ||
         c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

uint32_t ToUpper(uint32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
  return static_cast<uint32_t>(
      utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}

uint32_t ToLower(uint32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
  return static_cast<uint32_t>(
      utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}

bool IsCased(uint32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
         cat == UTF8PROC_CATEGORY_LT;
}

}  // namespace fusionrl::jinja::internal
