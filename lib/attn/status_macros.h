// Local status macros: Abseil 20220623 (Debian 12) ships none.
//
// RETURN_IF_ERROR(expr): returns the absl::Status of `expr` from the enclosing
// function when it is not OK.
// ASSIGN_OR_RETURN(lhs, expr): evaluates an absl::StatusOr, returns its status
// when not OK, else assigns (or declares) `lhs` from its value.
#ifndef ATTN_STATUS_MACROS_H_
#define ATTN_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define ATTN_STATUS_CONCAT_INNER(a, b) a##b
#define ATTN_STATUS_CONCAT(a, b) ATTN_STATUS_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    const ::absl::Status attn_status_ = (expr);       \
    if (!attn_status_.ok()) return attn_status_;      \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ATTN_ASSIGN_OR_RETURN_IMPL(ATTN_STATUS_CONCAT(attn_statusor_, __LINE__), lhs, expr)

#define ATTN_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                               \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()

#endif  // ATTN_STATUS_MACROS_H_
