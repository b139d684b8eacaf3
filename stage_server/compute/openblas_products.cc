#include "stage_server/compute/openblas_products.h"

#include <cblas.h>

#include "absl/strings/str_cat.h"

namespace pipetrain::compute {

namespace {
// How sgemm takes a (rows, cols) view: row-major (column stride 1, rows at least cols
// apart) or transposed (row stride 1, columns at least rows apart). A one-row or
// one-column view may be both; either reading is then right.
struct BlasView {
  bool ok = false;
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  int64_t leading = 0;
};
BlasView ViewOf(const MatrixStrides& s, int rows, int cols) {
  if (s.col == 1 && s.row >= cols) return {true, CblasNoTrans, s.row};
  if (s.row == 1 && s.col >= rows) return {true, CblasTrans, s.col};
  return {};
}
}  // namespace

absl::StatusOr<std::unique_ptr<OpenBlasProducts>> OpenBlasProducts::Create(int threads) {
  if (threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("openblas products: threads must be >= 1 (got ", threads, ")"));
  }
  openblas_set_num_threads(threads);
  return std::unique_ptr<OpenBlasProducts>(new OpenBlasProducts());
}

absl::Status OpenBlasProducts::Run(common::DType operands, const ProductShape& p,
                                   const float* a, const float* b, float* c) {
  if (operands != common::DType::kF32) {
    return absl::UnimplementedError(absl::StrCat(
        "openblas products: only f32 operands (got ", common::DTypeName(operands), ")"));
  }
  const BlasView a_view = ViewOf(p.a, p.m, p.k), b_view = ViewOf(p.b, p.k, p.n);
  if (!a_view.ok || !b_view.ok || p.c.col != 1 || p.c.row < p.n) {
    return absl::InvalidArgumentError("openblas products: a view sgemm cannot take");
  }
  for (int i = 0; i < p.batch0; ++i) {
    for (int j = 0; j < p.batch1; ++j) {
      cblas_sgemm(CblasRowMajor, a_view.trans, b_view.trans, p.m, p.n, p.k, p.alpha,
                  a + i * p.a.batch0 + j * p.a.batch1, a_view.leading,
                  b + i * p.b.batch0 + j * p.b.batch1, b_view.leading, p.beta,
                  c + i * p.c.batch0 + j * p.c.batch1, p.c.row);
    }
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::compute
