// Reading the fields of a Hugging Face config.json, shared by the model families' halves
// of Hugging Face folders (hf_gpt2.h, hf_llama.h). Errors (InvalidArgument) start with
// `source` and name the field.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace pipetrain::model::hf {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view source, absl::string_view message);
// An optional field; absent and null read as nullptr.
const Json* Field(const Json& j, const char* name);
// A positive integer field (at most 2^30); `missing_hint` follows "NAME is missing".
absl::StatusOr<int> PositiveInt(const Json& j, const char* name, absl::string_view source,
                                absl::string_view missing_hint);
absl::StatusOr<bool> OptionalBool(const Json& j, const char* name, bool fallback,
                                  absl::string_view source);
// A boolean that must hold `required` (when present) because the model computes only that.
absl::Status RequireBool(const Json& j, const char* name, bool required, absl::string_view why,
                         absl::string_view source);
// A positive finite number field, `fallback` when absent.
absl::StatusOr<double> PositiveNumber(const Json& j, const char* name, double fallback,
                                      absl::string_view source);

}  // namespace pipetrain::model::hf
