// The chat-template builtins besides filters and tests: argument binding,
// the safe dict / list methods (ImmutableSandboxedEnvironment allows no
// mutation), and the globals range, namespace, dict and transformers'
// raise_exception and strftime_now.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/civil_time.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {

std::vector<const Value*> CallArgs::Bind(
    absl::string_view function,
    std::initializer_list<absl::string_view> names) const {
  std::vector<const Value*> slots(names.size(), nullptr);
  if (positional.size() > names.size()) {
    Fail(absl::StrCat(function, "() takes at most ", names.size(),
                      " arguments, got ", positional.size()));
  }
  for (size_t i = 0; i < positional.size(); ++i) slots[i] = &positional[i];
  for (const auto& [key, value] : keyword) {
    size_t i = 0;
    for (absl::string_view name : names) {
      if (name == key) break;
      ++i;
    }
    if (i == names.size()) {
      Fail(absl::StrCat(function, "() got an unexpected argument '", key, "'"));
    }
    if (slots[i] != nullptr) {
      Fail(absl::StrCat(function, "() got argument '", key, "' twice"));
    }
    slots[i] = &value;
  }
  return slots;
}

namespace {

// ------------------------------------------------------------ methods

Value DictMethod(const Dict& d, absl::string_view name, CallArgs& args) {
  if (name == "get") {
    auto a = args.Bind(name, {"key", "default"});
    const Value* v = a[0] != nullptr && a[0]->is_string()
                         ? d.Find(a[0]->as_string())
                         : nullptr;
    if (v != nullptr) return *v;
    return a[1] ? *a[1] : Value::None();
  }
  args.Bind(name, {});
  std::vector<Value> out;
  for (const auto& [k, v] : d.entries) {
    if (name == "keys") {
      out.emplace_back(k);
    } else if (name == "values") {
      out.push_back(v);
    } else {
      out.push_back(Value::MakeList({Value(k), v}, /*is_tuple=*/true));
    }
  }
  return Value::MakeList(std::move(out));
}

Value ListMethod(const List& l, absl::string_view name, CallArgs& args) {
  auto a = args.Bind(name, {"value"});
  const Value item = a[0] ? *a[0] : Value();
  int64_t count = 0;
  for (size_t i = 0; i < l.items.size(); ++i) {
    if (!Equals(l.items[i], item)) continue;
    if (name == "index") return Value(static_cast<int64_t>(i));
    ++count;
  }
  if (name == "index") Fail(absl::StrCat(item.Repr(), " is not in list"));
  return Value(count);
}

// ------------------------------------------------------------ globals

Value Range(Evaluator&, CallArgs& args) {
  // jinja2's sandbox caps range() at 100000 items (MAX_RANGE).
  constexpr int64_t kMaxRange = 100000;
  auto a = args.Bind("range", {"start", "stop", "step"});
  int64_t start = 0;
  int64_t stop;
  if (a[1] == nullptr) {
    stop = RequireInt(a[0], "range stop");
  } else {
    start = RequireInt(a[0], "range start");
    stop = RequireInt(a[1], "range stop");
  }
  const int64_t step = a[2] ? RequireInt(a[2], "range step") : 1;
  if (step == 0) Fail("range() step must not be zero");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) {
      FailResource(absl::StrCat("range() of more than ", kMaxRange, " items"));
    }
    out.emplace_back(i);
  }
  return Value::MakeList(std::move(out));
}

// namespace(mapping?, **kwargs) and dict(mapping?, **kwargs).
Dict DictFromArgs(absl::string_view function, CallArgs& args) {
  if (args.positional.size() > 1) {
    Fail(absl::StrCat(function, "() takes at most one positional argument"));
  }
  Dict dict;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      dict = source.as_dict();
    } else {
      for (const Value& pair : Iterate(source)) {
        if (!pair.is_list() || pair.as_list().items.size() != 2 ||
            !pair.as_list().items[0].is_string()) {
          Fail(absl::StrCat(function, "() expects (string key, value) pairs"));
        }
        dict.Set(pair.as_list().items[0].as_string(), pair.as_list().items[1]);
      }
    }
  }
  for (auto& [k, v] : args.keyword) dict.Set(k, v);
  return dict;
}

Value Namespace(Evaluator&, CallArgs& args) {
  return Value::MakeNamespace(DictFromArgs("namespace", args));
}

Value MakeDictGlobal(Evaluator&, CallArgs& args) {
  return Value::MakeDict(DictFromArgs("dict", args));
}

Value RaiseException(Evaluator&, CallArgs& args) {
  auto a = args.Bind("raise_exception", {"message"});
  Fail(absl::StrCat("raise_exception: ", a[0] ? a[0]->Str() : ""));
}

// Python's time.strftime for the codes chat templates use (C locale).
std::string Strftime(absl::string_view format, absl::Time now,
                     absl::TimeZone zone) {
  static constexpr const char* kMonths[] = {
      "January", "February", "March",     "April",   "May",      "June",
      "July",    "August",   "September", "October", "November", "December"};
  static constexpr const char* kDays[] = {"Monday",   "Tuesday", "Wednesday",
                                          "Thursday", "Friday",  "Saturday",
                                          "Sunday"};
  const absl::CivilSecond t = absl::ToCivilSecond(now, zone);
  const absl::CivilDay day(t);
  const int weekday = static_cast<int>(absl::GetWeekday(day));  // Monday = 0
  auto pad = [](int64_t v, int width) {
    std::string s = absl::StrCat(v);
    return s.size() < static_cast<size_t>(width)
               ? std::string(width - s.size(), '0') + s
               : s;
  };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 == format.size()) {
      out.push_back(format[i]);
      continue;
    }
    char code = format[++i];
    bool no_pad = false;  // glibc's %-d
    if (code == '-' && i + 1 < format.size()) {
      no_pad = true;
      code = format[++i];
    }
    const int w = no_pad ? 1 : 2;
    switch (code) {
      case 'Y':
        out += absl::StrCat(t.year());
        break;
      case 'y':
        out += pad(t.year() % 100, w);
        break;
      case 'm':
        out += pad(t.month(), w);
        break;
      case 'd':
        out += pad(t.day(), w);
        break;
      case 'e':
        out += no_pad ? absl::StrCat(t.day())
                      : (t.day() < 10 ? " " : "") + absl::StrCat(t.day());
        break;
      case 'H':
        out += pad(t.hour(), w);
        break;
      case 'I':
        out += pad(t.hour() % 12 == 0 ? 12 : t.hour() % 12, w);
        break;
      case 'M':
        out += pad(t.minute(), w);
        break;
      case 'S':
        out += pad(t.second(), w);
        break;
      case 'p':
        out += t.hour() < 12 ? "AM" : "PM";
        break;
      case 'j':
        out += pad(absl::GetYearDay(day), no_pad ? 1 : 3);
        break;
      case 'B':
        out += kMonths[t.month() - 1];
        break;
      case 'b':
      case 'h':
        out += std::string(kMonths[t.month() - 1]).substr(0, 3);
        break;
      case 'A':
        out += kDays[weekday];
        break;
      case 'a':
        out += std::string(kDays[weekday]).substr(0, 3);
        break;
      case 'u':
        out += absl::StrCat(weekday + 1);
        break;
      case 'w':
        out += absl::StrCat((weekday + 1) % 7);
        break;
      case '%':
        out += "%";
        break;
      default:
        Fail(absl::StrCat("strftime_now: unsupported format code '%",
                          no_pad ? "-" : "", std::string(1, code), "'"));
    }
  }
  return out;
}

Value StrftimeNow(Evaluator& ev, CallArgs& args) {
  auto a = args.Bind("strftime_now", {"format"});
  return Value(Strftime(RequireString(a[0], "strftime_now format"),
                        ev.options().now, ev.options().time_zone));
}

}  // namespace

Value FindGlobal(absl::string_view name) {
  using Fn = Value (*)(Evaluator&, CallArgs&);
  static constexpr std::pair<absl::string_view, Fn> kGlobals[] = {
      {"range", Range},
      {"namespace", Namespace},
      {"dict", MakeDictGlobal},
      {"raise_exception", RaiseException},
      {"strftime_now", StrftimeNow},
  };
  for (const auto& [global_name, fn] : kGlobals) {
    if (global_name == name) {
      return Value::MakeCallable(std::string(name), fn);
    }
  }
  return Value();
}

Value FindMethod(const Value& receiver, absl::string_view name) {
  const std::string method(name);
  if (receiver.is_string() && IsStrMethod(name)) {
    return Value::MakeCallable(
        absl::StrCat("str.", name),
        [receiver, method](Evaluator& ev, CallArgs& args) {
          return StrMethod(ev, receiver.as_string(), method, args);
        });
  }
  if (receiver.is_dict() && (name == "items" || name == "keys" ||
                             name == "values" || name == "get")) {
    return Value::MakeCallable(absl::StrCat("dict.", name),
                               [receiver, method](Evaluator&, CallArgs& args) {
                                 return DictMethod(receiver.as_dict(), method,
                                                   args);
                               });
  }
  if (receiver.is_list() && (name == "index" || name == "count")) {
    return Value::MakeCallable(absl::StrCat("list.", name),
                               [receiver, method](Evaluator&, CallArgs& args) {
                                 return ListMethod(receiver.as_list(), method,
                                                   args);
                               });
  }
  return Value();
}

}  // namespace fusionrl::jinja::internal
