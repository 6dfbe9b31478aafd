// core/text/jinja/status_macros.h: early returns for absl::Status(Or) inside the renderer
// (Abseil does not ship its status_macros.h publicly).
#ifndef KVGUARD_CORE_TEXT_JINJA_STATUS_MACROS_H_
#define KVGUARD_CORE_TEXT_JINJA_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"

#define JINJA_CONCAT_INNER(a, b) a##b
#define JINJA_CONCAT(a, b) JINJA_CONCAT_INNER(a, b)

// JINJA_ASSIGN_OR_RETURN(lhs, expr): evaluates the StatusOr `expr`; returns its status on
// error, else moves its value into `lhs` (a declaration or an lvalue).
#define JINJA_ASSIGN_OR_RETURN(lhs, expr) \
  JINJA_ASSIGN_OR_RETURN_IMPL(JINJA_CONCAT(jinja_status_or_, __LINE__), lhs, expr)
#define JINJA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = *std::move(tmp)

#define JINJA_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                               \
    if (absl::Status jinja_status = (expr); !jinja_status.ok()) return jinja_status; \
  } while (0)

#endif  // KVGUARD_CORE_TEXT_JINJA_STATUS_MACROS_H_
