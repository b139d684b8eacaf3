// The precision table: what `training.precision` names. One row per precision says in
// which dtype the matrix products take their operands and in which the residual stream
// between layers (hence between stages) is held; the spec's check, its error message,
// `pipetrain plan`, the stage's configure and the wire take their lists from here.
//
// "bf16" rounds every product's operands to bf16 and sums in fp32
// (compute::Backend::SetProductOperands), and rounds each layer's output activation and
// each gradient it passes down to bf16 (compute::ChunkOptions::boundary), so that they
// travel between stages in 2 bytes an element. Master weights, gradients and optimizer
// moments stay fp32. docs/USAGE.md, "Precision", keeps the list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace pipetrain::model {

struct Precision {
  absl::string_view name;         // "fp32", "bf16"
  common::DType products;        // the products' operands
  common::DType activations;     // the residual stream between layers and stages
  absl::string_view description;  // one line, for --help and docs
};

// What a precision costs in bytes (docs/USAGE.md, "Precision", has the table): the
// training state of one parameter (state_bytes.h: fp32 master weight, gradient and
// AdamW's two moments, and with bf16 products the weight's bf16 copy), one activation
// element stored for the backward (fp32), one stored only as an operand of the
// backward's products (as a product copy: 2 bytes in bf16), and one crossing a stage
// boundary (the activations' dtype).
struct PrecisionBytes {
  uint64_t per_parameter = 0;
  uint64_t activation_stored = 0;
  uint64_t activation_stored_for_products = 0;
  uint64_t activation_wire = 0;
};
PrecisionBytes BytesOf(const Precision& precision);

// Every precision, the default ("fp32") first.
const std::vector<Precision>& PrecisionTable();
// The row named `name`; "" is the default. NotFound names the accepted values.
absl::StatusOr<Precision> PrecisionNamed(absl::string_view name);
// "fp32, bf16": the accepted names, for messages.
std::string PrecisionNames();
// One line per precision, "  NAME  description", for --help.
std::string PrecisionHelp();

}  // namespace pipetrain::model
