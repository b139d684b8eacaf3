// OneDnnMatmul: matrix products through oneDNN's matmul primitive, on host memory.
// A primitive is made once per (shapes, strides, alpha, beta, operand precision) and kept,
// so a training step, which repeats the same products, makes none after its first.
//
//   c = alpha * op(a) @ op(b) + beta * c      for every (i, j) of batch0 x batch1
//
// Operands come in fp32. With `operands` kBF16 each is rounded to bf16 (nearest even,
// common/bf16.h) into a scratch buffer and the products are summed in fp32: the same
// numbers the reference backend's bf16 mode gives, at oneDNN's bf16 rate on a processor
// with bf16 instructions (and on its slower path on one without: see bf16_native()).
// Where this oneDNN has no bf16 product at all (2.6 on a processor without AVX-512),
// the rounded operands are widened back to fp32 (exactly) and multiplied by the fp32
// kernels: the same bf16 products, each exact in fp32, summed in fp32 in their order.
//
// Same shapes and thread count give the same bits run after run: oneDNN's matmul splits
// work by the shape and thread count only. Not thread-safe: one executor thread drives it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"
#include "stage_server/compute/products.h"

namespace pipetrain::compute {

class OneDnnMatmul : public Products {
 public:
  // `threads`: oneDNN's OpenMP thread count for every product this object runs.
  static absl::StatusOr<std::unique_ptr<OneDnnMatmul>> Create(int threads);
  ~OneDnnMatmul() override;

  std::string Name() const override { return "onednn"; }
  absl::Status Run(common::DType operands, const ProductShape& p, const float* a,
                   const float* b, float* c) override;
  absl::Status RunBf16(const ProductShape& p, Bf16Operand a, Bf16Operand b, float* c) override;

  size_t cached_primitives() const { return cache_.size(); }
  // Whether this processor has bf16 dot-product instructions (avx512_bf16 or amx).
  static bool bf16_native();

  struct Handles;  // oneDNN's engine and stream
  struct Entry;    // one cached product

 private:
  OneDnnMatmul(int threads, std::unique_ptr<Handles> handles);
  // `a_given`, `b_given`: that operand comes in bf16 as its view lays it out (not
  // rounded into dense scratch).
  absl::StatusOr<Entry*> EntryFor(common::DType operands, const ProductShape& p,
                                  bool a_given = false, bool b_given = false);
  // Makes the primitive of `p` on operands of `in` type laid out as sa and sb.
  absl::StatusOr<std::unique_ptr<Entry>> MakeEntry(const ProductShape& p, int in,
                                                   const MatrixStrides& sa,
                                                   const MatrixStrides& sb);
  // Runs a bf16 product: a and b are bf16 bits laid out as sa and sb.
  absl::Status ExecuteBf16(Entry* e, const ProductShape& p, const uint16_t* a,
                           const MatrixStrides& sa, const uint16_t* b, const MatrixStrides& sb,
                           float* c);
  absl::Status Execute(Entry* e, const void* a, const void* b, float* c);

  int threads_;
  std::unique_ptr<Handles> handles_;
  // Key: operand precision, a and b given in bf16, batches, sizes, the three views'
  // strides, alpha, beta.
  std::map<std::array<int64_t, 22>, std::unique_ptr<Entry>> cache_;
  std::vector<uint16_t> a16_, b16_;  // bf16 operands of the product being run
  std::vector<float> a32_, b32_;     // the same widened, where bf16 products are missing
};

}  // namespace pipetrain::compute
