// Reading `pipetrain status --json` answers, for the end-to-end tests and benchmarks.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "nlohmann/json.hpp"

namespace pipetrain::testing {

// An integer field, written as a number or (int64 in proto3 JSON) as a string; 0 when
// absent or not a number.
inline int64_t JsonInt(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return 0;
  if (j[key].is_number()) return j[key].get<int64_t>();
  int64_t v = 0;
  if (j[key].is_string()) (void)absl::SimpleAtoi(j[key].get<std::string>(), &v);
  return v;
}

// Whether the job has ended (not QUEUED, RUNNING or RECOVERING).
inline bool JobHasEnded(const nlohmann::json& s) {
  return s.contains("state") && s["state"] != "QUEUED" && s["state"] != "RUNNING" &&
         s["state"] != "RECOVERING";
}

}  // namespace pipetrain::testing
