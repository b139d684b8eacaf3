// OpenBlasProducts: the Products engine on OpenBLAS's sgemm, one call per batch item.
// fp32 operands only. It was the cpu backend's only engine; it stays as the baseline
// the compute bench measures oneDNN against in the same run (`--products openblas`),
// and as a second engine when oneDNN cannot make a product.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "stage_server/compute/products.h"

namespace pipetrain::compute {

class OpenBlasProducts : public Products {
 public:
  // `threads` is OpenBLAS's pthread count, a process-wide setting.
  static absl::StatusOr<std::unique_ptr<OpenBlasProducts>> Create(int threads);
  std::string Name() const override { return "openblas"; }
  absl::Status Run(common::DType operands, const ProductShape& p, const float* a,
                   const float* b, float* c) override;

 private:
  OpenBlasProducts() = default;
};

}  // namespace pipetrain::compute
