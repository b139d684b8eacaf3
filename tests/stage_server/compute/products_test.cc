// The cpu backend's product engines (stage_server/compute/products.h): each engine's
// strided, batched, transposed, scaled and accumulating products against a double-
// precision loop, bf16 operands rounded where common/bf16.h rounds them, and oneDNN's
// primitives made once per shape and giving the same bits run after run.
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "stage_server/compute/onednn_matmul.h"
#include "stage_server/compute/openblas_products.h"
#include "tests/testing/backend_testing.h"
#include "tests/testing/tolerance.h"

namespace pipetrain::compute {
namespace {

using common::DType;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::RandomNormal;

float At(const std::vector<float>& x, const MatrixStrides& s, int i, int j, int r, int c) {
  return x[i * s.batch0 + j * s.batch1 + r * s.row + c * s.col];
}

// c as the product's definition gives it, in double, from operands rounded as `operands`
// says; also sum |alpha a b| + |beta c| per element, the magnitude its rounding bound
// scales with.
struct Expected {
  std::vector<double> value, magnitude;
};
Expected Reference(DType operands, const ProductShape& p, const std::vector<float>& a,
                   const std::vector<float>& b, const std::vector<float>& c) {
  auto round = [&](float x) -> double {
    return operands == DType::kBF16 ? common::RoundToBf16(x) : x;
  };
  Expected e{std::vector<double>(c.size()), std::vector<double>(c.size())};
  for (int i = 0; i < p.batch0; ++i) {
    for (int j = 0; j < p.batch1; ++j) {
      for (int r = 0; r < p.m; ++r) {
        for (int col = 0; col < p.n; ++col) {
          double sum = 0, mag = 0;
          for (int q = 0; q < p.k; ++q) {
            const double t = round(At(a, p.a, i, j, r, q)) * round(At(b, p.b, i, j, q, col));
            sum += t;
            mag += std::fabs(t);
          }
          const size_t at = i * p.c.batch0 + j * p.c.batch1 + r * p.c.row + col * p.c.col;
          const double old = p.beta == 0 ? 0 : double{p.beta} * c[at];
          e.value[at] = p.alpha * sum + old;
          e.magnitude[at] = std::fabs(p.alpha) * mag + std::fabs(old);
        }
      }
    }
  }
  return e;
}

// Every element within the bound of an fp32 sum of k + 2 terms (the products, alpha's
// scaling and beta's term) of that magnitude: bf16 x bf16 products are exact in fp32, so
// bf16 operands leave only the summation's rounding, as fp32 ones do.
void ExpectNear(const std::vector<float>& got, const Expected& want, int k,
                const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = ::pipetrain::testing::ReorderedSumTolerance(k + 2, want.magnitude[i]) +
                       want.magnitude[i] * ::pipetrain::testing::kFloatEps;
    ASSERT_NEAR(got[i], want.value[i], tol) << what << " element " << i;
  }
}

std::unique_ptr<Products> Engine(const std::string& name) {
  if (name == "onednn") {
    auto e = OneDnnMatmul::Create(2);
    EXPECT_THAT(e, IsOk());
    return e.ok() ? std::move(*e) : nullptr;
  }
  auto e = OpenBlasProducts::Create(2);
  EXPECT_THAT(e, IsOk());
  return e.ok() ? std::move(*e) : nullptr;
}

// Attention's shape: (B, NH) heads, q and k^T read in place from a (B, T, 3C) tensor.
ProductShape HeadsShape(int B, int NH, int T, int hs, float alpha, float beta) {
  const int C = NH * hs;
  return {.batch0 = B, .batch1 = NH, .m = T, .n = T, .k = hs,
          .a = {int64_t{T} * 3 * C, hs, 3 * C, 1},  // q
          .b = {int64_t{T} * 3 * C, hs, 1, 3 * C},  // k^T, offset by C
          .c = {int64_t{NH} * T * T, int64_t{T} * T, T, 1},
          .alpha = alpha, .beta = beta};
}

class ProductsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ProductsTest, PlainProductsInEveryTransposeMatchTheDefinition) {
  std::unique_ptr<Products> engine = Engine(GetParam());
  ASSERT_NE(engine, nullptr);
  // Odd sizes (the kernels' tails), and one row, where a transposed view's strides are
  // both 1 and the engine must still read it right.
  for (auto [m, n, k] : {std::array{37, 29, 53}, std::array{1, 50, 3}})
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        const ProductShape p =
            ProductShape::RowMajor(ta, tb, m, n, k, ta ? m : k, tb ? k : n, n, 0.75f, beta);
        const auto a = RandomNormal(m * k, 10 + ta);
        const auto b = RandomNormal(k * n, 20 + tb);
        auto c = RandomNormal(m * n, 30);
        const Expected want = Reference(DType::kF32, p, a, b, c);
        ASSERT_THAT(engine->Run(DType::kF32, p, a.data(), b.data(), c.data()), IsOk());
        ExpectNear(c, want, k, absl::StrCat(m, "x", n, "x", k, " ta ", ta, " tb ", tb, " beta ", beta));
      }
    }
  }
}

TEST_P(ProductsTest, AllHeadsOfAttentionInOneStridedProduct) {
  std::unique_ptr<Products> engine = Engine(GetParam());
  ASSERT_NE(engine, nullptr);
  const int B = 3, NH = 4, T = 9, hs = 5, C = NH * hs;
  const ProductShape p = HeadsShape(B, NH, T, hs, 0.25f, 0.0f);
  const auto qkv = RandomNormal(B * T * 3 * C, 40);
  // c starts as NaN: beta 0 overwrites whatever it held.
  std::vector<float> c(B * NH * T * T, std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> k_view(qkv.begin() + C, qkv.end());
  const Expected want = Reference(DType::kF32, p, qkv, k_view, std::vector<float>(c.size()));
  ASSERT_THAT(engine->Run(DType::kF32, p, qkv.data(), qkv.data() + C, c.data()), IsOk());
  ExpectNear(c, want, hs, "heads");
}

INSTANTIATE_TEST_SUITE_P(Engines, ProductsTest, ::testing::Values("onednn", "openblas"),
                         [](const auto& info) { return info.param; });

TEST(OneDnnMatmulTest, Bf16OperandsAreRoundedToNearestEvenAndSummedInFp32) {
  auto engine = OneDnnMatmul::Create(2);
  ASSERT_THAT(engine, IsOk());
  const int m = 64, n = 48, k = 96;
  for (int ta = 0; ta < 2; ++ta) {
    const ProductShape p = ProductShape::RowMajor(ta, true, m, n, k, ta ? m : k, k, n, 1, 1);
    const auto a = RandomNormal(m * k, 50 + ta);
    const auto b = RandomNormal(k * n, 60);
    auto c = RandomNormal(m * n, 70);
    const Expected want = Reference(DType::kBF16, p, a, b, c);
    ASSERT_THAT((*engine)->Run(DType::kBF16, p, a.data(), b.data(), c.data()), IsOk());
    ExpectNear(c, want, k, absl::StrCat("bf16 ta ", ta));
  }
  // And the rounding matters: the same product of the unrounded operands is far off
  // (bf16 keeps 8 significant bits, so the difference is about 2^-9 of each term).
  const ProductShape p = ProductShape::RowMajor(false, false, m, n, k, k, n, n, 1, 0);
  const auto a = RandomNormal(m * k, 80);
  const auto b = RandomNormal(k * n, 81);
  std::vector<float> c(m * n);
  ASSERT_THAT((*engine)->Run(DType::kBF16, p, a.data(), b.data(), c.data()), IsOk());
  const Expected fp32 = Reference(DType::kF32, p, a, b, c);
  double worst = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    worst = std::max(worst, std::fabs(c[i] - fp32.value[i]) / fp32.magnitude[i]);
  }
  EXPECT_GT(worst, 1e-4) << "bf16 operands gave fp32's result: were they rounded?";
}

TEST(OneDnnMatmulTest, APrimitiveIsMadeOncePerShapeAndRepeatsGiveTheSameBits) {
  auto engine = OneDnnMatmul::Create(2);
  ASSERT_THAT(engine, IsOk());
  const int B = 2, NH = 3, T = 16, hs = 8, C = NH * hs;
  const ProductShape p = HeadsShape(B, NH, T, hs, 0.5f, 0.0f);
  const auto qkv = RandomNormal(B * T * 3 * C, 90);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    std::vector<float> first(B * NH * T * T), again(first.size());
    ASSERT_THAT((*engine)->Run(dt, p, qkv.data(), qkv.data() + C, first.data()), IsOk());
    const size_t made = (*engine)->cached_primitives();
    for (int rep = 0; rep < 3; ++rep) {
      ASSERT_THAT((*engine)->Run(dt, p, qkv.data(), qkv.data() + C, again.data()), IsOk());
      ASSERT_EQ(first, again) << common::DTypeName(dt) << " repeat " << rep;
    }
    EXPECT_EQ((*engine)->cached_primitives(), made);
  }
  EXPECT_EQ((*engine)->cached_primitives(), 2u);  // one fp32, one bf16
}

TEST(OneDnnMatmulTest, RefusesAnOperandPrecisionItDoesNotHave) {
  auto engine = OneDnnMatmul::Create(1);
  ASSERT_THAT(engine, IsOk());
  const ProductShape p = ProductShape::RowMajor(false, false, 2, 2, 2, 2, 2, 2, 1, 0);
  std::vector<float> a(4, 1), b(4, 1), c(4);
  const absl::Status s = (*engine)->Run(DType::kF16, p, a.data(), b.data(), c.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("f16"), std::string::npos) << s;
  EXPECT_EQ(OneDnnMatmul::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::compute
