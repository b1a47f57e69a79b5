// Small status helpers (Abseil 20220623 ships none).
#ifndef FUSIONRL_CORE_STATUS_MACROS_H_
#define FUSIONRL_CORE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FUSIONRL_STATUS_CONCAT_INNER_(a, b) a##b
#define FUSIONRL_STATUS_CONCAT_(a, b) FUSIONRL_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define FUSIONRL_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::absl::Status _fusionrl_status = (expr);            \
    if (!_fusionrl_status.ok()) return _fusionrl_status; \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr<T>), or return its status.
#define FUSIONRL_ASSIGN_OR_RETURN(lhs, expr) \
  FUSIONRL_ASSIGN_OR_RETURN_IMPL_(           \
      FUSIONRL_STATUS_CONCAT_(_fusionrl_statusor_, __LINE__), lhs, expr)
#define FUSIONRL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return tmp.status();                   \
  lhs = std::move(tmp).value()

#endif  // FUSIONRL_CORE_STATUS_MACROS_H_
