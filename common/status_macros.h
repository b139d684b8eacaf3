// Early-return helpers for absl::Status and absl::StatusOr, used across every module.
// (The Abseil in Debian 12 predates its own status macros.)
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PIPETRAIN_CONCAT_INNER_(a, b) a##b
#define PIPETRAIN_CONCAT_(a, b) PIPETRAIN_CONCAT_INNER_(a, b)

// RETURN_IF_ERROR(expr): returns the status of expr from the enclosing function if it
// is not OK. expr may be an absl::Status or an absl::StatusOr<T>.
#define RETURN_IF_ERROR(expr)                                              \
  do {                                                                     \
    if (auto _pt_status = ::pipetrain::internal::AsStatus((expr));         \
        !_pt_status.ok()) {                                                \
      return _pt_status;                                                   \
    }                                                                      \
  } while (false)

// ASSIGN_OR_RETURN(lhs, expr): evaluates expr (an absl::StatusOr<T>); on error returns
// its status, else moves the value into lhs, which may be a declaration (`auto x`).
#define ASSIGN_OR_RETURN(lhs, expr) \
  PIPETRAIN_ASSIGN_OR_RETURN_IMPL_(PIPETRAIN_CONCAT_(_pt_statusor_, __LINE__), lhs, expr)

#define PIPETRAIN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                     \
  if (!tmp.ok()) return std::move(tmp).status();         \
  lhs = *std::move(tmp)

namespace pipetrain::internal {
inline absl::Status AsStatus(absl::Status s) { return s; }
template <typename T>
absl::Status AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace pipetrain::internal
