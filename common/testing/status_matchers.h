// GoogleTest matchers for absl::Status and absl::StatusOr: IsOk(), IsOkAndHolds(m) and
// StatusIs(code[, message_matcher]). Tests only; the Debian 12 Abseil has none.
#pragma once

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace pipetrain::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = ::pipetrain::testing::GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s.ToString();
  return s.ok();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code)) {
  const absl::Status& s = ::pipetrain::testing::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(s.message()),
                                       result_listener);
}

// IsOkAndHolds(m): an OK StatusOr whose value matches m.
MATCHER_P(IsOkAndHolds, value_matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

// StatusIs(code): any message.
inline auto StatusIs(absl::StatusCode code) { return StatusIs(code, ::testing::_); }

}  // namespace pipetrain::testing
