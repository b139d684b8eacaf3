#include "stage_server/compute/products.h"

namespace pipetrain::compute {

ProductShape ProductShape::RowMajor(bool trans_a, bool trans_b, int m, int n, int k,
                                    int64_t lda, int64_t ldb, int64_t ldc, float alpha,
                                    float beta) {
  return {.m = m,
          .n = n,
          .k = k,
          .a = trans_a ? MatrixStrides{0, 0, 1, lda} : MatrixStrides{0, 0, lda, 1},
          .b = trans_b ? MatrixStrides{0, 0, 1, ldb} : MatrixStrides{0, 0, ldb, 1},
          .c = MatrixStrides{0, 0, ldc, 1},
          .alpha = alpha,
          .beta = beta};
}

}  // namespace pipetrain::compute
