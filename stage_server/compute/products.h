// Products: the engine behind the cpu backend's matrix products, one interface over
// oneDNN (onednn_matmul.h, the default) and OpenBLAS (openblas_products.h, today's
// fp32 baseline the compute bench measures against in the same run).
//
//   c = alpha * op(a) @ op(b) + beta * c      for every (i, j) of batch0 x batch1
//
// where every operand is a strided view, so one call covers a plain product, a
// transposed one and all heads of an attention product at once.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tensor.h"

namespace pipetrain::compute {

// Element strides of a matrix view: between batch0 items, batch1 items, rows, columns.
// A transposed operand is a view whose row stride is 1.
struct MatrixStrides {
  int64_t batch0 = 0, batch1 = 0, row = 0, col = 1;
};

struct ProductShape {
  int batch0 = 1, batch1 = 1;
  int m = 0, n = 0, k = 0;
  MatrixStrides a, b, c;  // op(a) (m, k), op(b) (k, n), c (m, n)
  float alpha = 1, beta = 0;

  // A plain row-major product, as cblas_sgemm(CblasRowMajor, ...) takes it.
  static ProductShape RowMajor(bool trans_a, bool trans_b, int m, int n, int k, int64_t lda,
                               int64_t ldb, int64_t ldc, float alpha, float beta);
};

// An operand of Products::RunBf16: fp32 values, or bf16 bits (exactly one is set).
struct Bf16Operand {
  const float* values = nullptr;
  const uint16_t* bits = nullptr;
};

class Products {
 public:
  virtual ~Products() = default;
  // "onednn" or "openblas".
  virtual std::string Name() const = 0;
  // `operands`: kF32, or kBF16 (each operand rounded to bf16, nearest even, as
  // common/bf16.h does, and the products summed in fp32). Shapes are the caller's to
  // check (op_checks.h); k > 0.
  virtual absl::Status Run(common::DType operands, const ProductShape& p, const float* a,
                           const float* b, float* c) = 0;
  // The bf16 product with each operand given as fp32 values (rounded as Run rounds them)
  // or already as bf16 bits laid out as its view says (a product copy): the same numbers
  // as Run(kBF16, ...) on the values the bits were made from. This default is an engine
  // without bf16 products.
  virtual absl::Status RunBf16(const ProductShape& p, Bf16Operand a, Bf16Operand b, float* c) {
    return absl::UnimplementedError(absl::StrCat(Name(), " products: no bf16 products"));
  }
};

}  // namespace pipetrain::compute
