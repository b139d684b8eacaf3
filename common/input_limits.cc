#include "common/input_limits.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::common {

absl::Status CheckLength(absl::string_view field, absl::string_view value, int64_t limit) {
  if (static_cast<int64_t>(value.size()) <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", value.size(), " bytes; the limit is ", limit));
}

absl::Status CheckCount(absl::string_view field, int64_t count, int64_t limit) {
  if (count <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " has ", count, " entries; the limit is ", limit));
}

std::string Truncated(absl::string_view value) {
  constexpr size_t kShown = 64;
  if (value.size() <= kShown) return std::string(value);
  return absl::StrCat(value.substr(0, kShown), "... (", value.size(), " bytes)");
}

}  // namespace pipetrain::common
