#include "common/model/hf_config_json.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::model::hf {

absl::Status Invalid(absl::string_view source, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", message));
}

const Json* Field(const Json& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<int> PositiveInt(const Json& j, const char* name, absl::string_view source,
                                absl::string_view missing_hint) {
  const Json* v = Field(j, name);
  if (v == nullptr) return Invalid(source, absl::StrCat(name, " is missing ", missing_hint));
  if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > (int64_t{1} << 30)) {
    return Invalid(source, absl::StrCat(name, " must be a positive integer (got ", v->dump(), ")"));
  }
  return static_cast<int>(v->get<int64_t>());
}

absl::StatusOr<bool> OptionalBool(const Json& j, const char* name, bool fallback,
                                  absl::string_view source) {
  const Json* v = Field(j, name);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) {
    return Invalid(source, absl::StrCat(name, " must be true or false (got ", v->dump(), ")"));
  }
  return v->get<bool>();
}

absl::Status RequireBool(const Json& j, const char* name, bool required, absl::string_view why,
                         absl::string_view source) {
  ASSIGN_OR_RETURN(const bool value, OptionalBool(j, name, required, source));
  if (value == required) return absl::OkStatus();
  return Invalid(source, absl::StrCat(name, " is ", value ? "true" : "false", "; ", why));
}

absl::StatusOr<double> PositiveNumber(const Json& j, const char* name, double fallback,
                                      absl::string_view source) {
  const Json* v = Field(j, name);
  if (v == nullptr) return fallback;
  if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>())) {
    return Invalid(source, absl::StrCat(name, " must be a positive number (got ", v->dump(), ")"));
  }
  return v->get<double>();
}

}  // namespace pipetrain::model::hf
