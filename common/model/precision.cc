#include "common/model/precision.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/state_bytes.h"

namespace pipetrain::model {

const std::vector<Precision>& PrecisionTable() {
  static const auto* table = new std::vector<Precision>{
      {"fp32", common::DType::kF32, common::DType::kF32, "fp32 everywhere (the default)"},
      {"bf16", common::DType::kBF16, common::DType::kBF16,
       "matrix products with bf16 operands summed in fp32, activations and gradients "
       "between layers and stages in bf16; fp32 master weights, gradients and moments"},
  };
  return *table;
}

PrecisionBytes BytesOf(const Precision& precision) {
  return {.per_parameter = StateBytesPerParam(precision.products),
          .activation_stored = common::DTypeSize(common::DType::kF32),
          .activation_stored_for_products = common::DTypeSize(precision.products),
          .activation_wire = common::DTypeSize(precision.activations)};
}

absl::StatusOr<Precision> PrecisionNamed(absl::string_view name) {
  if (name.empty()) return PrecisionTable().front();
  for (const Precision& p : PrecisionTable()) {
    if (p.name == name) return p;
  }
  return absl::NotFoundError(
      absl::StrCat("unknown precision '", name, "'; accepted: ", PrecisionNames()));
}

std::string PrecisionHelp() {
  std::string out;
  for (const Precision& p : PrecisionTable()) {
    absl::StrAppend(&out, "  ", p.name, std::string(13 - p.name.size(), ' '), p.description,
                    "\n");
  }
  return out;
}

std::string PrecisionNames() {
  std::vector<absl::string_view> names;
  for (const Precision& p : PrecisionTable()) names.push_back(p.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace pipetrain::model
