// Python's str operations for the chat-template interpreter: the helpers
// filters and methods share (strip, splitlines, replace, argument checks)
// and the safe str methods themselves (`s.split(...)`, `s.startswith(...)`).
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {
namespace {

// Python's str.title(): a cased character after an uncased one is upper.
std::string PyTitle(const std::string& s) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  bool previous_cased = false;
  for (uint32_t& c : cps) {
    const bool cased = IsCased(c);
    c = cased ? (previous_cased ? ToLower(c) : ToUpper(c)) : c;
    previous_cased = cased;
  }
  return EncodeUtf8(cps);
}

// Python's str.split(sep=None, maxsplit=-1); rsplit when `from_right`.
std::vector<Value> Split(const std::string& s, const Value* sep_v,
                         const Value* maxsplit_v, bool from_right) {
  const int64_t maxsplit = maxsplit_v ? RequireInt(maxsplit_v, "maxsplit") : -1;
  std::vector<std::string> parts;
  if (sep_v == nullptr || sep_v->is_none()) {
    // Runs of whitespace separate; no empty parts.
    std::vector<uint32_t> cps = DecodeUtf8(s);
    if (from_right) std::reverse(cps.begin(), cps.end());
    size_t i = 0;
    while (true) {
      while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        // The remainder keeps its trailing whitespace ("a b  ".split(None,
        // 1) == ['a', 'b  ']).
        std::vector<uint32_t> rest(cps.begin() + i, cps.end());
        if (from_right) std::reverse(rest.begin(), rest.end());
        parts.push_back(EncodeUtf8(rest));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !IsPythonSpace(cps[j])) ++j;
      std::vector<uint32_t> word(cps.begin() + i, cps.begin() + j);
      if (from_right) std::reverse(word.begin(), word.end());
      parts.push_back(EncodeUtf8(word));
      i = j;
    }
    if (from_right) std::reverse(parts.begin(), parts.end());
  } else {
    const std::string& sep = RequireString(sep_v, "split separator");
    if (sep.empty()) Fail("empty separator");
    if (!from_right) {
      size_t start = 0;
      while (true) {
        size_t at = s.find(sep, start);
        if (at == std::string::npos ||
            (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          parts.push_back(s.substr(start));
          break;
        }
        parts.push_back(s.substr(start, at - start));
        start = at + sep.size();
      }
    } else {
      size_t end = s.size();
      while (true) {
        size_t at = end >= sep.size() ? s.rfind(sep, end - sep.size())
                                      : std::string::npos;
        if (at == std::string::npos ||
            (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          parts.push_back(s.substr(0, end));
          break;
        }
        parts.push_back(s.substr(at + sep.size(), end - at - sep.size()));
        end = at;
      }
      std::reverse(parts.begin(), parts.end());
    }
  }
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

}  // namespace

const std::string& RequireString(const Value* v, absl::string_view what) {
  if (v == nullptr || !v->is_string()) {
    Fail(absl::StrCat(what, " must be a string, not ",
                      v ? v->TypeName() : "missing"));
  }
  return v->as_string();
}

int64_t RequireInt(const Value* v, absl::string_view what) {
  if (v == nullptr || !(v->is_int() || v->is_bool())) {
    Fail(absl::StrCat(what, " must be an integer, not ",
                      v ? v->TypeName() : "missing"));
  }
  return v->is_int() ? v->as_int() : v->as_bool();
}

bool OptionalBool(const Value* v, bool if_missing) {
  return v == nullptr ? if_missing : v->Truthy();
}

namespace {

// Python's full case mappings (Unicode SpecialCasing.txt) that expand one
// code point into several, for the letters and ligatures text contains:
// 'ß'.upper() == 'SS', 'ﬁ'.upper() == 'FI', 'İ'.lower() == 'i̇'.
struct SpecialCase {
  uint32_t from;
  const char* to;  // UTF-8
};
constexpr SpecialCase kUpperSpecial[] = {
    {0x00df, "SS"},           {0x0149, "\u02bcN"},
    {0x01f0, "J\u030c"},      {0x0587, "\u0535\u0552"},
    {0x1e96, "H\u0331"},      {0x1e97, "T\u0308"},
    {0x1e98, "W\u030a"},      {0x1e99, "Y\u030a"},
    {0x1e9a, "A\u02be"},      {0xfb00, "FF"},
    {0xfb01, "FI"},           {0xfb02, "FL"},
    {0xfb03, "FFI"},          {0xfb04, "FFL"},
    {0xfb05, "ST"},           {0xfb06, "ST"},
    {0xfb13, "\u0544\u0546"}, {0xfb14, "\u0544\u0535"},
    {0xfb15, "\u0544\u053b"}, {0xfb16, "\u054e\u0546"},
    {0xfb17, "\u0544\u053d"},
};
constexpr SpecialCase kLowerSpecial[] = {{0x0130, "i\u0307"}};

}  // namespace

std::string MapCodePoints(const std::string& s, uint32_t (*fn)(uint32_t)) {
  std::string out;
  out.reserve(s.size());
  for (uint32_t c : DecodeUtf8(s)) {
    const char* special = nullptr;
    if (fn == ToUpper) {
      for (const SpecialCase& sc : kUpperSpecial) {
        if (sc.from == c) special = sc.to;
      }
    } else if (fn == ToLower) {
      for (const SpecialCase& sc : kLowerSpecial) {
        if (sc.from == c) special = sc.to;
      }
    }
    if (special != nullptr) {
      out += special;
    } else {
      AppendUtf8(fn(c), &out);
    }
  }
  return out;
}

bool IsPythonWordChar(uint32_t c) {
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_';
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// Python's str.capitalize(): the first character upper, the rest lower.
std::string Capitalize(const std::string& s) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    cps[i] = i == 0 ? ToUpper(cps[i]) : ToLower(cps[i]);
  }
  return EncodeUtf8(cps);
}

// Python's str.strip/lstrip/rstrip(chars=None).
std::string Strip(const std::string& s, const Value* chars, bool left,
                  bool right) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  std::vector<uint32_t> set;
  const bool whitespace = chars == nullptr || chars->is_none();
  if (!whitespace) set = DecodeUtf8(RequireString(chars, "strip chars"));
  auto strip = [&](uint32_t c) {
    return whitespace ? IsPythonSpace(c)
                      : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t begin = 0;
  size_t end = cps.size();
  while (left && begin < end && strip(cps[begin])) ++begin;
  while (right && end > begin && strip(cps[end - 1])) --end;
  return EncodeUtf8(
      std::vector<uint32_t>(cps.begin() + begin, cps.begin() + end));
}

// Python's str.splitlines().
std::vector<std::string> SplitLines(const std::string& s) {
  std::vector<std::string> lines;
  std::vector<uint32_t> current;
  const std::vector<uint32_t> cps = DecodeUtf8(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t c = cps[i];
    const bool breaks = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c ||
                        (c >= 0x1c && c <= 0x1e) || c == 0x85 || c == 0x2028 ||
                        c == 0x2029;
    if (!breaks) {
      current.push_back(c);
      continue;
    }
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    lines.push_back(EncodeUtf8(current));
    current.clear();
  }
  if (!current.empty()) lines.push_back(EncodeUtf8(current));
  return lines;
}

// Python's str.replace(old, new, count=-1).
std::string Replace(Evaluator& ev, const std::string& s, const std::string& old,
                    const std::string& replacement, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Inserted before every character and at the end.
    const std::vector<uint32_t> cps = DecodeUtf8(s);
    int64_t done = 0;
    for (uint32_t c : cps) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      AppendUtf8(c, &out);
    }
    if (count < 0 || done < count) out += replacement;
    ev.CheckSize(out.size());
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += replacement;
    ev.CheckSize(out.size());
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// The item's attribute for map/selectattr/sort(attribute=...): a dotted
// path of keys or list indices ("function.name", "0").
Value AttributePath(const Value& item, const std::string& path) {
  Value current = item;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    if (dot == std::string::npos) dot = path.size();
    const std::string part = path.substr(start, dot - start);
    int64_t index;
    if (current.is_dict()) {
      const Value* v = current.as_dict().Find(part);
      current = v ? *v : Value();
    } else if (current.is_namespace()) {
      const Value* v = current.namespace_dict().Find(part);
      current = v ? *v : Value();
    } else if (current.is_list() && absl::SimpleAtoi(part, &index)) {
      const auto& items = current.as_list().items;
      if (index < 0) index += static_cast<int64_t>(items.size());
      current = index >= 0 && index < static_cast<int64_t>(items.size())
                    ? items[index]
                    : Value();
    } else {
      current = Value();
    }
    start = dot + 1;
  }
  return current;
}

// Python's float(str): surrounding whitespace, inf, nan, exponents.
bool ParseFloat(const std::string& text, double* out) {
  std::string s(absl::StripAsciiWhitespace(text));
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

bool IsPyLowerOrUpper(const std::string& s, bool lower) {
  bool any_cased = false;
  for (uint32_t c : DecodeUtf8(s)) {
    if (!IsCased(c)) continue;
    any_cased = true;
    if ((lower ? ToLower(c) : ToUpper(c)) != c) return false;
  }
  return any_cased;
}

bool IsStrMethod(absl::string_view name) {
  static constexpr absl::string_view kNames[] = {
      "strip",      "lstrip",   "rstrip",  "split",   "rsplit",  "splitlines",
      "startswith", "endswith", "upper",   "lower",   "title",   "capitalize",
      "replace",    "count",    "find",    "rfind",   "join",    "isdigit",
      "isalpha",    "isalnum",  "isspace", "islower", "isupper", "format"};
  return std::find(std::begin(kNames), std::end(kNames), name) !=
         std::end(kNames);
}

Value StrMethod(Evaluator& ev, const std::string& s, absl::string_view name,
                CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto a = args.Bind(name, {"chars"});
    return Value(Strip(s, a[0], name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    auto a = args.Bind(name, {"sep", "maxsplit"});
    return Value::MakeList(Split(s, a[0], a[1], name == "rsplit"));
  }
  if (name == "splitlines") {
    args.Bind(name, {});
    std::vector<Value> lines;
    for (auto& line : SplitLines(s)) lines.emplace_back(std::move(line));
    return Value::MakeList(std::move(lines));
  }
  if (name == "startswith" || name == "endswith") {
    auto a = args.Bind(name, {"prefix"});
    std::vector<Value> options;
    if (a[0] != nullptr && a[0]->is_list()) {
      options = a[0]->as_list().items;
    } else {
      options.push_back(a[0] ? *a[0] : Value());
    }
    for (const Value& o : options) {
      const std::string& p = RequireString(&o, absl::StrCat(name, " argument"));
      const bool match = p.size() <= s.size() &&
                         (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                               : s.compare(s.size() - p.size(),
                                                           p.size(), p) == 0);
      if (match) return Value(true);
    }
    return Value(false);
  }
  if (name == "format") return Value(StrFormat(ev, s, args));
  if (name == "upper" || name == "lower") {
    args.Bind(name, {});
    return Value(MapCodePoints(s, name == "upper" ? ToUpper : ToLower));
  }
  if (name == "title") {
    args.Bind(name, {});
    return Value(PyTitle(s));
  }
  if (name == "capitalize") {
    args.Bind(name, {});
    return Value(Capitalize(s));
  }
  if (name == "replace") {
    auto a = args.Bind(name, {"old", "new", "count"});
    return Value(Replace(ev, s, RequireString(a[0], "replace old"),
                         RequireString(a[1], "replace new"),
                         a[2] ? RequireInt(a[2], "count") : -1));
  }
  if (name == "count" || name == "find" || name == "rfind") {
    auto a = args.Bind(name, {"sub"});
    const std::string& sub = RequireString(a[0], absl::StrCat(name, " sub"));
    if (name == "count") {
      if (sub.empty()) {
        return Value(static_cast<int64_t>(DecodeUtf8(s).size() + 1));
      }
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos;
           at = s.find(sub, at + sub.size())) {
        ++n;
      }
      return Value(n);
    }
    const size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
    if (at == std::string::npos) return Value(-1);
    return Value(static_cast<int64_t>(DecodeUtf8(s.substr(0, at)).size()));
  }
  if (name == "join") {
    auto a = args.Bind(name, {"iterable"});
    std::string out;
    bool first = true;
    for (const Value& item : Iterate(a[0] ? *a[0] : Value())) {
      if (!first) out += s;
      first = false;
      out += RequireString(&item, "join item");
      ev.CheckSize(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" ||
      name == "isspace" || name == "islower" || name == "isupper") {
    args.Bind(name, {});
    const std::vector<uint32_t> cps = DecodeUtf8(s);
    if (name == "islower" || name == "isupper") {
      return Value(IsPyLowerOrUpper(s, name == "islower"));
    }
    if (cps.empty()) return Value(false);
    for (uint32_t c : cps) {
      // ASCII classes; other code points count as letters (isalpha) only
      // when cased, which covers what chat templates test.
      const bool digit = c >= '0' && c <= '9';
      const bool alpha =
          (c < 0x80 && absl::ascii_isalpha(c)) || (c >= 0x80 && IsCased(c));
      const bool ok = name == "isdigit"   ? digit
                      : name == "isalpha" ? alpha
                      : name == "isalnum" ? digit || alpha
                                          : IsPythonSpace(c);
      if (!ok) return Value(false);
    }
    return Value(true);
  }
  Fail(absl::StrCat("unsupported method '", name, "' of str"));
}

}  // namespace fusionrl::jinja::internal
