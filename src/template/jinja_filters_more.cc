// More of jinja2's filters for chat templates (jinja2/filters.py): format,
// sum, max, min, batch, slice, center and wordcount. FindFilter
// (jinja_filters.cc) falls back to this table.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "template/jinja_internal.h"

namespace fusionrl::jinja::internal {
namespace {

// do_format(value, *args, **kwargs): soft_str(value) % (kwargs or args).
Value FilterFormat(Evaluator& ev, const Value& in, CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    Fail(
        "format: can't handle positional and keyword arguments at the same "
        "time");
  }
  if (!args.keyword.empty()) {
    Dict mapping;
    for (const auto& [k, v] : args.keyword) mapping.Set(k, v);
    return Value(
        PercentFormat(ev, in.Str(), Value::MakeDict(std::move(mapping))));
  }
  return Value(PercentFormat(
      ev, in.Str(), Value::MakeList(args.positional, /*is_tuple=*/true)));
}

// Python's a + b for sum(): ints (overflow-checked), floats, bools as ints.
Value Add(const Value& a, const Value& b) {
  const bool a_num = a.is_number() || a.is_bool();
  const bool b_num = b.is_number() || b.is_bool();
  if (!a_num || !b_num) {
    Fail(absl::StrCat("unsupported operand types for +: '", a.TypeName(),
                      "' and '", b.TypeName(), "'"));
  }
  if (a.is_float() || b.is_float()) return Value(a.AsDouble() + b.AsDouble());
  int64_t r;
  const int64_t x = a.is_int() ? a.as_int() : a.as_bool();
  const int64_t y = b.is_int() ? b.as_int() : b.as_bool();
  if (__builtin_add_overflow(x, y, &r)) Fail("integer overflow");
  return Value(r);
}

// sum(iterable, attribute=None, start=0).
Value FilterSum(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("sum", {"attribute", "start"});
  Value total = a[1] ? *a[1] : Value(0);
  for (const Value& item : Iterate(in)) {
    total = Add(total, a[0] ? AttributePath(item, a[0]->Str()) : item);
  }
  return total;
}

// _min_or_max: the first smallest (largest) item by its `attribute`,
// strings compared lower-cased unless case_sensitive; undefined if empty.
Value MinOrMax(const Value& in, CallArgs& args, bool max, const char* name) {
  auto a = args.Bind(name, {"case_sensitive", "attribute"});
  const bool case_sensitive = OptionalBool(a[0], false);
  auto key = [&](const Value& item) {
    Value v = a[1] ? AttributePath(item, a[1]->Str()) : item;
    return !case_sensitive && v.is_string()
               ? Value(MapCodePoints(v.as_string(), ToLower))
               : v;
  };
  const std::vector<Value> items = Iterate(in);
  if (items.empty()) return Value();
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (max ? LessThan(best_key, k) : LessThan(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}
Value FilterMax(Evaluator&, const Value& in, CallArgs& args) {
  return MinOrMax(in, args, /*max=*/true, "max");
}
Value FilterMin(Evaluator&, const Value& in, CallArgs& args) {
  return MinOrMax(in, args, /*max=*/false, "min");
}

// batch(value, linecount, fill_with=None): lists of linecount items, the
// last one filled up when fill_with is given.
Value FilterBatch(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("batch", {"linecount", "fill_with"});
  const int64_t n = RequireInt(a[0], "batch linecount");
  if (n <= 0) Fail("batch linecount must be positive");
  const bool fill = a[1] != nullptr && !a[1]->is_none();
  std::vector<Value> out;
  std::vector<Value> current;
  for (const Value& item : Iterate(in)) {
    if (static_cast<int64_t>(current.size()) == n) {
      out.push_back(Value::MakeList(std::move(current)));
      current.clear();
    }
    current.push_back(item);
  }
  if (!current.empty()) {
    while (fill && static_cast<int64_t>(current.size()) < n) {
      current.push_back(*a[1]);
    }
    out.push_back(Value::MakeList(std::move(current)));
  }
  return Value::MakeList(std::move(out));
}

// slice(value, slices, fill_with=None): jinja2's column split.
Value FilterSlice(Evaluator&, const Value& in, CallArgs& args) {
  auto a = args.Bind("slice", {"slices", "fill_with"});
  const int64_t slices = RequireInt(a[0], "slice slices");
  if (slices <= 0) Fail("slice slices must be positive");
  const std::vector<Value> seq = Iterate(in);
  const int64_t length = static_cast<int64_t>(seq.size());
  const int64_t per_slice = length / slices;
  const int64_t with_extra = length % slices;
  int64_t offset = 0;
  std::vector<Value> out;
  for (int64_t k = 0; k < slices; ++k) {
    const int64_t start = offset + k * per_slice;
    if (k < with_extra) ++offset;
    const int64_t end = offset + (k + 1) * per_slice;
    std::vector<Value> part(seq.begin() + start, seq.begin() + end);
    if (a[1] != nullptr && !a[1]->is_none() && k >= with_extra) {
      part.push_back(*a[1]);
    }
    out.push_back(Value::MakeList(std::move(part)));
  }
  return Value::MakeList(std::move(out));
}

// center(width=80): Python's str.center.
Value FilterCenter(Evaluator& ev, const Value& in, CallArgs& args) {
  auto a = args.Bind("center", {"width"});
  const int64_t width = a[0] ? RequireInt(a[0], "center width") : 80;
  const std::string s = in.Str();
  const int64_t n = static_cast<int64_t>(DecodeUtf8(s).size());
  if (width <= n) return Value(s);
  ev.CheckSize(s.size() + static_cast<size_t>(width - n));
  const int64_t pad = width - n;
  const int64_t left = pad / 2 + (pad & width & 1);
  return Value(std::string(left, ' ') + s + std::string(pad - left, ' '));
}

// wordcount: the number of \w+ runs.
Value FilterWordcount(Evaluator&, const Value& in, CallArgs& args) {
  args.Bind("wordcount", {});
  int64_t words = 0;
  bool in_word = false;
  for (uint32_t c : DecodeUtf8(in.Str())) {
    const bool word = IsPythonWordChar(c);
    if (word && !in_word) ++words;
    in_word = word;
  }
  return Value(words);
}

struct NamedFilter {
  absl::string_view name;
  FilterFn fn;
};
constexpr NamedFilter kMoreFilters[] = {
    {"batch", FilterBatch},   {"center", FilterCenter},
    {"format", FilterFormat}, {"max", FilterMax},
    {"min", FilterMin},       {"slice", FilterSlice},
    {"sum", FilterSum},       {"wordcount", FilterWordcount},
};

}  // namespace

FilterFn FindMoreFilter(absl::string_view name) {
  for (const NamedFilter& f : kMoreFilters) {
    if (f.name == name) return f.fn;
  }
  return nullptr;
}

}  // namespace fusionrl::jinja::internal
