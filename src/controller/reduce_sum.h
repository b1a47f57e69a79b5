// The arithmetic of a cross-node reduce round: the element-wise sum of the
// nodes' payloads, as a pure function (no lock, no job, no clock), so the
// bytes every node gets back can be tested on their own.
#ifndef FUSIONRL_CONTROLLER_REDUCE_SUM_H_
#define FUSIONRL_CONTROLLER_REDUCE_SUM_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/step_protocol.h"

namespace fusionrl {

// Bytes of one value of `dtype` (4 or 8).
size_t DtypeWidth(ReduceDtype dtype);

// "float32" / "float64".
const char* DtypeName(ReduceDtype dtype);

// The element-wise sum of `payloads` (little-endian values of `dtype`),
// accumulated in `dtype` in the order given: ((p0 + p1) + p2) + ..., so the
// same payloads in the same order always give the same bytes.
//   InvalidArgument: no payload; a payload that is not a whole number of
//     values; payloads of different lengths (the message names the first
//     one that differs from payload 0).
absl::StatusOr<std::string> SumPayloads(
    ReduceDtype dtype, const std::vector<std::string>& payloads);

}  // namespace fusionrl

#endif  // FUSIONRL_CONTROLLER_REDUCE_SUM_H_
