// The chat-template filters: jinja2's that chat templates use, with
// transformers' tojson; looked up by name when a template is parsed. The
// tests (`is defined`, ...) are in jinja_is_tests.cc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {
namespace {

// ------------------------------------------------------------ filters

Value FilterAbs(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("abs", {});
  if (in.is_float()) return Value(std::fabs(in.as_float()));
  if (in.is_int() || in.is_bool()) {
    const int64_t i = in.is_int() ? in.as_int() : in.as_bool();
    if (i == INT64_MIN) Fail("integer overflow");
    return Value(i < 0 ? -i : i);
  }
  Fail(absl::StrCat("bad operand type for abs(): '", in.TypeName(), "'"));
}

Value FilterCapitalize(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("capitalize", {});
  return Value(Capitalize(in.Str()));
}

Value FilterLength(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("length", {});
  switch (in.kind()) {
    case Value::Kind::kString:
      return Value(static_cast<int64_t>(DecodeUtf8(in.as_string()).size()));
    case Value::Kind::kList:
      return Value(static_cast<int64_t>(in.as_list().items.size()));
    case Value::Kind::kDict:
      return Value(static_cast<int64_t>(in.as_dict().entries.size()));
    case Value::Kind::kUndefined:
      return Value(0);
    default:
      Fail(absl::StrCat("object of type '", in.TypeName(), "' has no len()"));
  }
}

Value FilterDefault(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("default", {"default_value", "boolean"});
  const bool use_default =
      in.is_undefined() || (OptionalBool(a[1], false) && !in.Truthy());
  if (!use_default) return in;
  return a[0] ? *a[0] : Value("");
}

Value FilterDictsort(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("dictsort", {"case_sensitive", "by", "reverse"});
  if (!in.is_dict()) {
    Fail(absl::StrCat("dictsort expects a dict, got ", in.TypeName()));
  }
  const bool case_sensitive = OptionalBool(a[0], false);
  const std::string by = a[1] ? RequireString(a[1], "dictsort by") : "key";
  if (by != "key" && by != "value") {
    Fail("dictsort: 'by' must be 'key' or 'value'");
  }
  std::vector<Value> items;
  for (const auto& [k, v] : in.as_dict().entries) {
    items.push_back(Value::MakeList({Value(k), v}, /*is_tuple=*/true));
  }
  const size_t index = by == "key" ? 0 : 1;
  auto key = [&](const Value& item) {
    const Value& v = item.as_list().items[index];
    return !case_sensitive && v.is_string()
               ? Value(MapCodePoints(v.as_string(), ToLower))
               : v;
  };
  std::stable_sort(
      items.begin(), items.end(),
      [&](const Value& x, const Value& y) { return LessThan(key(x), key(y)); });
  if (OptionalBool(a[2], false)) std::reverse(items.begin(), items.end());
  return Value::MakeList(std::move(items));
}

Value FilterEscape(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("escape", {});
  std::string out;
  for (char c : in.Str()) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return Value(std::move(out));
}

Value FilterFirst(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("first", {});
  std::vector<Value> items = Iterate(in);
  return items.empty() ? Value() : items.front();
}

Value FilterLast(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("last", {});
  std::vector<Value> items = Iterate(in);
  return items.empty() ? Value() : items.back();
}

Value FilterFloat(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("float", {"default"});
  if (in.is_number() || in.is_bool()) return Value(in.AsDouble());
  double d;
  if (in.is_string() && ParseFloat(in.as_string(), &d)) return Value(d);
  return a[0] ? *a[0] : Value(0.0);
}

Value FilterInt(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("int", {"default", "base"});
  if (in.is_int()) return in;
  if (in.is_bool()) return Value(int64_t{in.as_bool()});
  double d = 0;
  if (in.is_float()) {
    d = in.as_float();
  } else if (in.is_string()) {
    const int64_t base = a[1] ? RequireInt(a[1], "int base") : 10;
    std::string s(absl::StripAsciiWhitespace(in.as_string()));
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, static_cast<int>(base));
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0) {
      return Value(static_cast<int64_t>(i));
    }
    if (!ParseFloat(s, &d)) return a[0] ? *a[0] : Value(0);
  } else {
    return a[0] ? *a[0] : Value(0);
  }
  if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) {
    return a[0] ? *a[0] : Value(0);
  }
  return Value(static_cast<int64_t>(d));
}

Value FilterItems(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("items", {});
  if (in.is_undefined()) return Value::MakeList({});
  if (!in.is_dict()) {
    Fail(absl::StrCat("items expects a mapping, got ", in.TypeName()));
  }
  std::vector<Value> items;
  for (const auto& [k, v] : in.as_dict().entries) {
    items.push_back(Value::MakeList({Value(k), v}, /*is_tuple=*/true));
  }
  return Value::MakeList(std::move(items));
}

// jinja2's indent(width=4, first=False, blank=False).
Value FilterIndent(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("indent", {"width", "first", "blank"});
  std::string indention;
  if (a[0] != nullptr && a[0]->is_string()) {
    indention = a[0]->as_string();
  } else {
    indention.assign(a[0] ? RequireInt(a[0], "indent width") : 4, ' ');
  }
  const std::vector<std::string> lines = SplitLines(in.Str() + "\n");
  std::string out;
  if (OptionalBool(a[2], false)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n" + indention;
      out += lines[i];
    }
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      out += "\n";
      if (!lines[i].empty()) out += indention;
      out += lines[i];
    }
  }
  if (OptionalBool(a[1], false)) out = indention + out;
  return Value(std::move(out));
}

Value FilterJoin(Evaluator& ev, const Value& in, CallArgs& args) {
  auto a = args.Bind("join", {"d", "attribute"});
  const std::string sep = a[0] ? a[0]->Str() : "";
  std::string out;
  bool first = true;
  for (const Value& item : Iterate(in)) {
    if (!first) out += sep;
    first = false;
    out += a[1] ? AttributePath(item, a[1]->Str()).Str() : item.Str();
    ev.CheckSize(out.size());
  }
  return Value(std::move(out));
}

Value FilterList(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("list", {});
  return Value::MakeList(Iterate(in));
}

Value FilterLower(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("lower", {});
  return Value(MapCodePoints(in.Str(), ToLower));
}

Value FilterUpper(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("upper", {});
  return Value(MapCodePoints(in.Str(), ToUpper));
}

// map(attribute='x', default=...) or map('filter', args...).
Value FilterMap(Evaluator& ev, const Value& in, CallArgs& args) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* default_value = nullptr;
  for (const auto& [k, v] : args.keyword) {
    if (k == "attribute") attribute = &v;
    if (k == "default") default_value = &v;
  }
  if (attribute != nullptr) {
    if (!args.positional.empty() ||
        args.keyword.size() != (default_value ? 2u : 1u)) {
      Fail("map(attribute=...) takes only 'attribute' and 'default'");
    }
    for (const Value& item : Iterate(in)) {
      Value v = AttributePath(item, attribute->Str());
      out.push_back(v.is_undefined() && default_value ? *default_value : v);
    }
    return Value::MakeList(std::move(out));
  }
  if (args.positional.empty()) {
    Fail("map needs a filter name or attribute=...");
  }
  const std::string name = RequireString(&args.positional[0], "map filter");
  FilterFn filter = FindFilter(name);
  if (filter == nullptr) Fail(absl::StrCat("unsupported filter '", name, "'"));
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : Iterate(in)) {
    CallArgs copy = rest;
    out.push_back(filter(ev, item, copy));
  }
  return Value::MakeList(std::move(out));
}

// select/reject/selectattr/rejectattr.
Value SelectImpl(Evaluator& ev, const Value& in, CallArgs& args,
                 bool by_attribute, bool keep_if, absl::string_view name) {
  if (!args.keyword.empty()) {
    Fail(absl::StrCat(name, "() takes no keyword arguments"));
  }
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty()) Fail(absl::StrCat(name, "() needs a name"));
    attribute = args.positional[next++].Str();
  }
  TestFn test = nullptr;
  if (next < args.positional.size()) {
    const std::string test_name =
        RequireString(&args.positional[next++], "test name");
    test = FindTest(test_name);
    if (test == nullptr) {
      Fail(absl::StrCat("unsupported test '", test_name, "'"));
    }
  }
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + next,
                              args.positional.end());
  std::vector<Value> out;
  for (const Value& item : Iterate(in)) {
    const Value v = by_attribute ? AttributePath(item, attribute) : item;
    CallArgs copy = test_args;
    const bool passed = test ? test(ev, v, copy) : v.Truthy();
    if (passed == keep_if) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}
Value FilterSelect(Evaluator& ev, const Value& in, CallArgs& args) {
  return SelectImpl(ev, in, args, false, true, "select");
}
Value FilterReject(Evaluator& ev, const Value& in, CallArgs& args) {
  return SelectImpl(ev, in, args, false, false, "reject");
}
Value FilterSelectAttr(Evaluator& ev, const Value& in, CallArgs& args) {
  return SelectImpl(ev, in, args, true, true, "selectattr");
}
Value FilterRejectAttr(Evaluator& ev, const Value& in, CallArgs& args) {
  return SelectImpl(ev, in, args, true, false, "rejectattr");
}

Value FilterReplace(Evaluator& ev, const Value& in, CallArgs& args) {
  auto a = args.Bind("replace", {"old", "new", "count"});
  return Value(Replace(
      ev, in.Str(), RequireString(a[0], "replace old"), a[1] ? a[1]->Str() : "",
      a[2] && !a[2]->is_none() ? RequireInt(a[2], "count") : -1));
}

Value FilterReverse(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("reverse", {});
  if (in.is_string()) {
    std::vector<uint32_t> cps = DecodeUtf8(in.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value(EncodeUtf8(cps));
  }
  std::vector<Value> items = Iterate(in);
  std::reverse(items.begin(), items.end());
  return Value::MakeList(std::move(items));
}

// round(precision=0, method='common'|'ceil'|'floor').
Value FilterRound(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("round", {"precision", "method"});
  const int64_t precision = a[0] ? RequireInt(a[0], "round precision") : 0;
  const std::string method = a[1] ? RequireString(a[1], "method") : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    Fail("round method must be 'common', 'ceil' or 'floor'");
  }
  if ((in.is_int() || in.is_bool()) && method == "common" && precision >= 0) {
    return Value(in.is_int() ? in.as_int() : int64_t{in.as_bool()});
  }
  if (method == "common" && precision >= 0 && precision < 300) {
    // Python's round() rounds the exact binary value (2.675 -> 2.67), as
    // printf does.
    char buf[400];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision),
                  in.AsDouble());
    return Value(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = in.AsDouble() * scale;
  const double r = method == "ceil"    ? std::ceil(x)
                   : method == "floor" ? std::floor(x)
                                       : std::nearbyint(x);  // half to even
  return Value(r / scale);
}

Value FilterSafe(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("safe", {});
  return in;
}

Value FilterSort(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("sort", {"reverse", "case_sensitive", "attribute"});
  std::vector<Value> items = Iterate(in);
  const bool case_sensitive = OptionalBool(a[1], false);
  auto key = [&](const Value& item) {
    Value v = a[2] ? AttributePath(item, a[2]->Str()) : item;
    return !case_sensitive && v.is_string()
               ? Value(MapCodePoints(v.as_string(), ToLower))
               : v;
  };
  const bool reverse = OptionalBool(a[0], false);
  std::stable_sort(
      items.begin(), items.end(), [&](const Value& x, const Value& y) {
        return reverse ? LessThan(key(y), key(x)) : LessThan(key(x), key(y));
      });
  return Value::MakeList(std::move(items));
}

Value FilterString(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("string", {});
  return Value(in.Str());
}

// jinja2's title filter: each word (after - or whitespace or an opening
// bracket) capitalized.
Value FilterTitle(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("title", {});
  std::vector<uint32_t> cps = DecodeUtf8(in.Str());
  bool word_start = true;
  for (uint32_t& c : cps) {
    const bool boundary = c == '-' || IsPythonSpace(c) || c == '(' ||
                          c == '{' || c == '[' || c == '<';
    if (boundary) {
      word_start = true;
      continue;
    }
    c = word_start ? ToUpper(c) : ToLower(c);
    word_start = false;
  }
  return Value(EncodeUtf8(cps));
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False); positional arguments bind in that
// order (tojson(true) is ensure_ascii).
Value FilterToJson(Evaluator& ev, const Value& in, CallArgs& args) {
  auto a = args.Bind("tojson",
                     {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions options;
  const Value* indent = a[1];
  if (indent != nullptr && !indent->is_none()) {
    if (indent->is_string()) {
      options.indent = 0;
      options.indent_string = indent->as_string();
    } else {
      options.indent = static_cast<int>(
          std::max<int64_t>(0, RequireInt(indent, "tojson indent")));
      options.indent_string.assign(options.indent, ' ');
    }
    options.item_separator = ",";
  }
  options.ensure_ascii = OptionalBool(a[0], false);
  if (a[2] != nullptr && !a[2]->is_none()) {
    if (!a[2]->is_list() || a[2]->as_list().items.size() != 2) {
      Fail("tojson separators must be an (item, key) pair");
    }
    options.item_separator = a[2]->as_list().items[0].Str();
    options.key_separator = a[2]->as_list().items[1].Str();
  }
  options.sort_keys = OptionalBool(a[3], false);
  std::string out = ToJson(in, options);
  ev.CheckSize(out.size());
  return Value(std::move(out));
}

Value FilterTrim(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("trim", {"chars"});
  return Value(Strip(in.Str(), a[0], true, true));
}

Value FilterUnique(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("unique", {"case_sensitive", "attribute"});
  const bool case_sensitive = OptionalBool(a[0], false);
  std::vector<Value> seen;
  std::vector<Value> out;
  for (const Value& item : Iterate(in)) {
    Value key = a[1] ? AttributePath(item, a[1]->Str()) : item;
    if (!case_sensitive && key.is_string()) {
      key = Value(MapCodePoints(key.as_string(), ToLower));
    }
    bool duplicate = false;
    for (const Value& s : seen) duplicate = duplicate || Equals(s, key);
    if (duplicate) continue;
    seen.push_back(std::move(key));
    out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

struct NamedFilter {
  absl::string_view name;
  FilterFn fn;
};
constexpr NamedFilter kFilters[] = {
    {"abs", FilterAbs},
    {"capitalize", FilterCapitalize},
    {"count", FilterLength},
    {"d", FilterDefault},
    {"default", FilterDefault},
    {"dictsort", FilterDictsort},
    {"e", FilterEscape},
    {"escape", FilterEscape},
    {"first", FilterFirst},
    {"float", FilterFloat},
    {"indent", FilterIndent},
    {"int", FilterInt},
    {"items", FilterItems},
    {"join", FilterJoin},
    {"last", FilterLast},
    {"length", FilterLength},
    {"list", FilterList},
    {"lower", FilterLower},
    {"map", FilterMap},
    {"reject", FilterReject},
    {"rejectattr", FilterRejectAttr},
    {"replace", FilterReplace},
    {"reverse", FilterReverse},
    {"round", FilterRound},
    {"safe", FilterSafe},
    {"select", FilterSelect},
    {"selectattr", FilterSelectAttr},
    {"sort", FilterSort},
    {"string", FilterString},
    {"title", FilterTitle},
    {"tojson", FilterToJson},
    {"trim", FilterTrim},
    {"unique", FilterUnique},
    {"upper", FilterUpper},
};

}  // namespace

FilterFn FindFilter(absl::string_view name) {
  for (const NamedFilter& f : kFilters) {
    if (f.name == name) return f.fn;
  }
  return FindMoreFilter(name);
}

}  // namespace fusionrl::jinja::internal
