// One way to say what an error is about: "WHAT of job 'ID' stage S step N micro-batch M
// chunk C", built field by field and put in front of a status's message, so that no
// module writes that prefix (or `absl::Status(s.code(), StrCat(prefix, s.message()))`)
// by hand.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::common {

class ErrorContext {
 public:
  // `what` names the operation ("configure", "snapshot push"); may be empty.
  explicit ErrorContext(absl::string_view what = "") : what_(what) {}

  ErrorContext& Job(absl::string_view job_id) {
    job_ = std::string(job_id);
    return *this;
  }
  ErrorContext& Stage(int64_t stage) { return Set(stage_, stage); }
  ErrorContext& Replica(int64_t replica) { return Set(replica_, replica); }
  ErrorContext& Step(int64_t step) { return Set(step_, step); }
  ErrorContext& MicroBatch(int64_t micro_batch) { return Set(micro_batch_, micro_batch); }
  ErrorContext& Chunk(int64_t chunk) { return Set(chunk_, chunk); }

  // "configure of job 'a' stage 2", "job 'a' step 7", "snapshot" (fields in that order).
  std::string Text() const;

  // The same code with "TEXT: " before the message; OK stays OK.
  absl::Status Wrap(const absl::Status& status) const;
  // The same with what was being done: "TEXT: DOING: message".
  absl::Status Wrap(const absl::Status& status, absl::string_view doing) const;
  template <typename T>
  absl::StatusOr<T> Wrap(absl::StatusOr<T> value) const {
    if (value.ok()) return value;
    return Wrap(value.status());
  }
  // A new error "TEXT: message".
  absl::Status Error(absl::StatusCode code, absl::string_view message) const;

 private:
  ErrorContext& Set(std::optional<int64_t>& field, int64_t value) {
    field = value;
    return *this;
  }

  std::string what_;
  std::optional<std::string> job_;
  std::optional<int64_t> stage_, replica_, step_, micro_batch_, chunk_;
};

}  // namespace pipetrain::common
