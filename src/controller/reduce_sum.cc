#include "controller/reduce_sum.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace fusionrl {
namespace {

// dst[i] += src[i] for `n` values of T stored unaligned.
template <typename T>
void AddInto(char* dst, const char* src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, dst + sizeof(T) * i, sizeof(T));
    std::memcpy(&y, src + sizeof(T) * i, sizeof(T));
    x += y;
    std::memcpy(dst + sizeof(T) * i, &x, sizeof(T));
  }
}

}  // namespace

size_t DtypeWidth(ReduceDtype dtype) {
  return dtype == ReduceDtype::kFloat64 ? 8 : 4;
}

const char* DtypeName(ReduceDtype dtype) {
  return dtype == ReduceDtype::kFloat64 ? "float64" : "float32";
}

absl::StatusOr<std::string> SumPayloads(
    ReduceDtype dtype, const std::vector<std::string>& payloads) {
  if (payloads.empty()) {
    return absl::InvalidArgumentError("reduce: no payload to sum");
  }
  const size_t width = DtypeWidth(dtype);
  const size_t bytes = payloads[0].size();
  for (size_t m = 0; m < payloads.size(); ++m) {
    if (payloads[m].size() % width != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reduce: payload ", m, " has ", payloads[m].size(),
          " bytes, not a whole number of ", DtypeName(dtype), " values"));
    }
    if (payloads[m].size() != bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("reduce: payload ", m, " has ", payloads[m].size(),
                       " bytes, payload 0 has ", bytes));
    }
  }
  std::string sum = payloads[0];
  const size_t n = bytes / width;
  for (size_t m = 1; m < payloads.size(); ++m) {
    if (width == 4) {
      AddInto<float>(sum.data(), payloads[m].data(), n);
    } else {
      AddInto<double>(sum.data(), payloads[m].data(), n);
    }
  }
  return sum;
}

}  // namespace fusionrl
