#include "common/error_context.h"

#include "absl/strings/str_cat.h"

namespace pipetrain::common {

std::string ErrorContext::Text() const {
  std::string out = what_;
  auto field = [&out](absl::string_view text) {
    if (!out.empty()) out += ' ';
    absl::StrAppend(&out, text);
  };
  if (job_) {
    if (!out.empty()) out += " of";
    field(absl::StrCat("job '", *job_, "'"));
  }
  if (stage_) field(absl::StrCat("stage ", *stage_));
  if (replica_) field(absl::StrCat("replica ", *replica_));
  if (step_) field(absl::StrCat("step ", *step_));
  if (micro_batch_) field(absl::StrCat("micro-batch ", *micro_batch_));
  if (chunk_) field(absl::StrCat("chunk ", *chunk_));
  return out;
}

absl::Status ErrorContext::Wrap(const absl::Status& status) const {
  if (status.ok()) return status;
  return Error(status.code(), status.message());
}

absl::Status ErrorContext::Wrap(const absl::Status& status, absl::string_view doing) const {
  if (status.ok()) return status;
  return Error(status.code(), absl::StrCat(doing, ": ", status.message()));
}

absl::Status ErrorContext::Error(absl::StatusCode code, absl::string_view message) const {
  const std::string text = Text();
  if (text.empty()) return absl::Status(code, message);
  return absl::Status(code, absl::StrCat(text, ": ", message));
}

}  // namespace pipetrain::common
