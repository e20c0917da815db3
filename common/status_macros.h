// Status propagation macros. Debian's abseil (20220623) ships none, so meshrun has its own.
//
//   RETURN_IF_ERROR(DoThing());                 // returns the status if it is not OK
//   ASSIGN_OR_RETURN(auto value, MakeValue());  // unwraps a StatusOr or returns its status
//
// Both evaluate their argument exactly once. Thread-safe as the expressions they wrap.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MESHRUN_STATUS_CONCAT_INNER(a, b) a##b
#define MESHRUN_STATUS_CONCAT(a, b) MESHRUN_STATUS_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                                \
  do {                                                       \
    ::absl::Status meshrun_status_ = (expr);                 \
    if (!meshrun_status_.ok()) return meshrun_status_;       \
  } while (false)

#define MESHRUN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  MESHRUN_ASSIGN_OR_RETURN_IMPL(MESHRUN_STATUS_CONCAT(meshrun_statusor_, __LINE__), lhs, expr)
