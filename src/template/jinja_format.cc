// Python's string formatting for the chat-template interpreter: `fmt % args`
// (printf-style, also jinja2's `format` filter) and `fmt.format(...)`.
// What is not implemented (a `{0.attr}` field, `*` widths, a precision
// without a type, %a, '#' with %o) is refused with an error, never
// approximated.
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {
namespace {

int64_t IntArg(const Value& v, char conversion) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  if (v.is_float()) {
    if (!std::isfinite(v.as_float()) || std::fabs(v.as_float()) >= 9.2e18) {
      Fail("cannot convert the float to an integer");
    }
    return static_cast<int64_t>(v.as_float());
  }
  Fail(absl::StrCat("%", std::string(1, conversion),
                    " format: a real number is required, not ", v.TypeName()));
}

// `text` padded to `width` code points: on the left unless `left_align`.
std::string Pad(std::string text, int64_t width, bool left_align, char fill) {
  const int64_t n = static_cast<int64_t>(DecodeUtf8(text).size());
  if (n >= width) return text;
  const std::string padding(static_cast<size_t>(width - n), fill);
  return left_align ? text + padding : padding + text;
}

// One number conversion (d i u o x X e E f F g G) through printf, whose
// output for these matches Python's; `flags` are printf flags.
std::string FormatNumber(const Value& v, char conversion,
                         const std::string& flags, int64_t width,
                         int64_t precision) {
  std::string spec = "%" + flags;
  if (width >= 0) absl::StrAppend(&spec, width);
  if (precision >= 0) absl::StrAppend(&spec, ".", precision);
  char buf[512];
  if (conversion == 'd' || conversion == 'i' || conversion == 'u' ||
      conversion == 'o' || conversion == 'x' || conversion == 'X') {
    const int64_t i = IntArg(v, conversion);
    if (conversion == 'o' && flags.find('#') != std::string::npos) {
      Fail("unsupported: '#' with %o");  // Python writes 0o17, printf 017
    }
    if (conversion != 'd' && conversion != 'i' && conversion != 'u' && i < 0) {
      // printf has no signed hex / octal; Python prints -0x..: refuse.
      Fail(absl::StrCat("unsupported: %", std::string(1, conversion),
                        " of a negative number"));
    }
    spec += "ll";
    spec.push_back(conversion == 'i' || conversion == 'u' ? 'd' : conversion);
    std::snprintf(buf, sizeof(buf), spec.c_str(), static_cast<long long>(i));
    return buf;
  }
  if (!v.is_number() && !v.is_bool()) {
    Fail(absl::StrCat("%", std::string(1, conversion),
                      " format: a real number is required, not ",
                      v.TypeName()));
  }
  if (width > 400 || precision > 300)
    Fail("format width or precision too large");
  spec.push_back(conversion);
  std::snprintf(buf, sizeof(buf), spec.c_str(), v.AsDouble());
  return buf;
}

// One %-conversion of `v`.
std::string Convert(const Value& v, char conversion, const std::string& flags,
                    int64_t width, int64_t precision) {
  const bool left = flags.find('-') != std::string::npos;
  switch (conversion) {
    case 's':
    case 'r': {
      std::string text = conversion == 's' ? v.Str() : v.Repr();
      if (precision >= 0) {
        std::vector<uint32_t> cps = DecodeUtf8(text);
        if (static_cast<int64_t>(cps.size()) > precision) cps.resize(precision);
        text = EncodeUtf8(cps);
      }
      return Pad(std::move(text), width, left, ' ');
    }
    case 'c': {
      std::string text;
      if (v.is_string() && DecodeUtf8(v.as_string()).size() == 1) {
        text = v.as_string();
      } else if (v.is_int()) {
        AppendUtf8(static_cast<uint32_t>(v.as_int()), &text);
      } else {
        Fail("%c requires an int or a single character");
      }
      return Pad(std::move(text), width, left, ' ');
    }
    case 'd':
    case 'i':
    case 'u':
    case 'o':
    case 'x':
    case 'X':
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G':
      return FormatNumber(v, conversion, flags, width, precision);
    default:
      Fail(absl::StrCat("unsupported format character '",
                        std::string(1, conversion), "'"));
  }
}

int64_t ReadNumber(const std::string& fmt, size_t* i) {
  int64_t n = 0;
  while (*i < fmt.size() && fmt[*i] >= '0' && fmt[*i] <= '9') {
    n = n * 10 + (fmt[(*i)++] - '0');
    if (n > 100000) Fail("format width or precision too large");
  }
  return n;
}

}  // namespace

std::string PercentFormat(Evaluator& ev, const std::string& fmt,
                          const Value& args) {
  // Python: a tuple gives the positional values, a mapping is looked up
  // by %(key)s, anything else is the single value.
  std::vector<Value> positional;
  const Dict* mapping = args.is_dict() ? &args.as_dict() : nullptr;
  if (args.is_list() && args.as_list().is_tuple) {
    positional = args.as_list().items;
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) Fail("incomplete format");
    const Value* value = nullptr;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) Fail("incomplete format key");
      if (mapping == nullptr) Fail("format requires a mapping");
      const std::string key = fmt.substr(i + 1, close - i - 1);
      value = mapping->Find(key);
      if (value == nullptr) Fail(absl::StrCat("KeyError: '", key, "'"));
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() &&
           std::string("-+ #0").find(fmt[i]) != std::string::npos) {
      flags.push_back(fmt[i++]);
    }
    if (i < fmt.size() && fmt[i] == '*') Fail("unsupported: '*' in a format");
    const int64_t width = i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9'
                              ? ReadNumber(fmt, &i)
                              : -1;
    int64_t precision = -1;
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      precision = ReadNumber(fmt, &i);
    }
    while (i < fmt.size() &&
           (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) {
      ++i;
    }
    if (i >= fmt.size()) Fail("incomplete format");
    if (fmt[i] == '%' && value == nullptr) {
      out.push_back('%');
      continue;
    }
    if (value == nullptr) {
      if (mapping != nullptr && used_mapping) {
        Fail("format requires a mapping");
      }
      if (next >= positional.size()) {
        Fail("not enough arguments for format string");
      }
      value = &positional[next++];
    }
    out += Convert(*value, fmt[i], flags, width, precision);
    ev.CheckSize(out.size());
  }
  if (mapping == nullptr && next < positional.size()) {
    Fail("not all arguments converted during string formatting");
  }
  return out;  // a mapping need not be used up ('x' % {} is 'x')
}

namespace {

// Python's format(value, spec) for the specs chat templates use:
// [[fill]align][sign][#][0][width][,][.precision][type].
std::string FormatSpec(const Value& v, const std::string& spec) {
  if (spec.empty()) return v.Str();
  size_t i = 0;
  char fill = ' ';
  char align = '\0';
  auto is_align = [](char c) {
    return c == '<' || c == '>' || c == '^' || c == '=';
  };
  if (spec.size() >= 2 && is_align(spec[1])) {
    fill = spec[0];
    align = spec[1];
    i = 2;
  } else if (is_align(spec[0])) {
    align = spec[0];
    i = 1;
  }
  std::string flags;
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) {
    if (spec[i] != '-') flags.push_back(spec[i]);
    ++i;
  }
  if (i < spec.size() && spec[i] == '#')
    Fail("unsupported: '#' in a format spec");
  bool zero = false;  // '0': zero padding unless an alignment is given
  if (i < spec.size() && spec[i] == '0') {
    zero = align == '\0';
    ++i;
  }
  const int64_t width = ReadNumber(spec, &i);
  if (i < spec.size() && (spec[i] == ',' || spec[i] == '_')) {
    Fail("unsupported: a thousands separator in a format spec");
  }
  int64_t precision = -1;
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    precision = ReadNumber(spec, &i);
  }
  char type = i < spec.size() ? spec[i++] : '\0';
  if (i != spec.size()) Fail(absl::StrCat("invalid format spec '", spec, "'"));
  std::string body;
  if (v.is_string()) {
    if (type != '\0' && type != 's') {
      Fail(absl::StrCat("unknown format code '", std::string(1, type),
                        "' for a str"));
    }
    if (!flags.empty()) Fail("sign not allowed in a string format spec");
    if (align == '=') Fail("'=' alignment not allowed in a string format spec");
    body = Convert(v, 's', "", -1, precision);
    if (zero) fill = '0';
    if (align == '\0') align = '<';
  } else if (v.is_number() || v.is_bool()) {
    if (type == '\0' && (v.is_int() || v.is_bool()) && precision < 0) {
      type = 'd';
    }
    if (type == '\0' && precision >= 0) {
      Fail("unsupported: a number format spec with a precision but no type");
    }
    if (type == 'b' || type == 'n' || type == '%' || type == 'c') {
      Fail(
          absl::StrCat("unsupported format code '", std::string(1, type), "'"));
    }
    if ((type == 'd' || type == 'x' || type == 'X' || type == 'o') &&
        !(v.is_int() || v.is_bool())) {
      Fail(absl::StrCat("unknown format code '", std::string(1, type),
                        "' for a float"));
    }
    if (type == 's') Fail("unknown format code 's' for a number");
    if ((type == 'f' || type == 'F' || type == 'e' || type == 'E' ||
         type == 'g' || type == 'G') &&
        precision < 0) {
      precision = 6;
    }
    if (type == '\0') {  // a float without a type prints as str()
      body = (flags == "+" && !std::signbit(v.as_float())   ? "+"
              : flags == " " && !std::signbit(v.as_float()) ? " "
                                                            : "") +
             v.Str();
    } else {
      body = FormatNumber(v, type, flags, -1, precision);
    }
    if (zero) {
      fill = '0';
      align = '=';
    }
    if (align == '\0') align = '>';
  } else {
    Fail(absl::StrCat("unsupported: a format spec for a ", v.TypeName()));
  }
  const int64_t n = static_cast<int64_t>(DecodeUtf8(body).size());
  if (n >= width) return body;
  const int64_t pad = width - n;
  auto fill_of = [&](int64_t count) {
    std::string s;
    for (int64_t k = 0; k < count; ++k) s.push_back(fill);
    return s;
  };
  switch (align) {
    case '<':
      return body + fill_of(pad);
    case '^':
      return fill_of(pad / 2) + body + fill_of(pad - pad / 2);
    case '=': {
      const size_t sign =
          !body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')
              ? 1
              : 0;
      return body.substr(0, sign) + fill_of(pad) + body.substr(sign);
    }
    default:
      return fill_of(pad) + body;
  }
}

}  // namespace

std::string StrFormat(Evaluator& ev, const std::string& fmt,
                      const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  bool manual = false;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      Fail("single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos)
      Fail("single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find('{') != std::string::npos) {
      Fail("unsupported: nested fields in a format string");
    }
    i = close;
    std::string spec;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    char conversion = '\0';
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      if (bang + 2 != field.size())
        Fail("invalid conversion in a format field");
      conversion = field[bang + 1];
      field.resize(bang);
    }
    if (field.find_first_of(".[") != std::string::npos) {
      Fail("unsupported: attribute or item access in a format field");
    }
    const Value* value = nullptr;
    if (field.empty()) {
      if (manual)
        Fail("cannot switch from manual to automatic field numbering");
      if (auto_index >= args.positional.size()) {
        Fail(absl::StrCat("IndexError: replacement index ", auto_index,
                          " out of range"));
      }
      value = &args.positional[auto_index++];
    } else if (field.find_first_not_of("0123456789") == std::string::npos) {
      if (auto_index > 0) {
        Fail("cannot switch from automatic to manual field numbering");
      }
      manual = true;
      size_t k = 0;
      const int64_t index = ReadNumber(field, &k);
      if (index >= static_cast<int64_t>(args.positional.size())) {
        Fail(absl::StrCat("IndexError: replacement index ", index,
                          " out of range"));
      }
      value = &args.positional[index];
    } else {
      for (const auto& [key, v] : args.keyword) {
        if (key == field) value = &v;
      }
      if (value == nullptr) Fail(absl::StrCat("KeyError: '", field, "'"));
    }
    Value converted = *value;
    if (conversion == 'r') {
      converted = Value(value->Repr());
    } else if (conversion == 's') {
      converted = Value(value->Str());
    } else if (conversion != '\0') {
      Fail(absl::StrCat("unknown conversion specifier ",
                        std::string(1, conversion)));
    }
    out += FormatSpec(converted, spec);
    ev.CheckSize(out.size());
  }
  return out;
}

}  // namespace fusionrl::jinja::internal
