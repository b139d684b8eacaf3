// The precision table: what `training.precision` names. One row per precision says in
// which dtype the matrix products take their operands; the spec's check, its error
// message, `pipetrain plan` and the stage's configure take their lists from here.
//
// Today "bf16" rounds every product's operands to bf16 and sums in fp32
// (compute::Backend::SetProductOperands); weights, gradients, optimizer moments,
// activations and what travels between stages stay fp32, so the memory and wire figures
// (state_bytes.h) are fp32's for both rows. docs/USAGE.md, "Precision", keeps the list.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace pipetrain::model {

struct Precision {
  absl::string_view name;         // "fp32", "bf16"
  common::DType products;        // the products' operands
  absl::string_view description;  // one line, for --help and docs
};

// Every precision, the default ("fp32") first.
const std::vector<Precision>& PrecisionTable();
// The row named `name`; "" is the default. NotFound names the accepted values.
absl::StatusOr<Precision> PrecisionNamed(absl::string_view name);
// "fp32, bf16": the accepted names, for messages.
std::string PrecisionNames();
// One line per precision, "  NAME  description", for --help.
std::string PrecisionHelp();

}  // namespace pipetrain::model
