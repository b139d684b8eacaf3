// Llama's backend ops on the plain-loop reference in double, held to properties of
// their own (the conformance suite holds every other backend to this reference): each
// backward against central finite differences of its forward, Rotary's inverse as the
// transpose of its rotation, RepeatKv and SumKvGroups as an adjoint pair, and values
// worked by hand in Hugging Face's conventions (rotate_half, repeat_kv, LlamaRMSNorm).
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/model/init.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/compute/host_backend.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;

std::vector<double> Randn(size_t n, uint64_t seed, double scale = 1, double offset = 0) {
  std::vector<double> v(n);
  const uint64_t key = model::InitStreamKey(seed, 5000, 0);
  for (size_t i = 0; i < n; ++i) v[i] = offset + scale * model::NormalAt(key, i);
  return v;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of `objective` in each entry of `values`, step 1e-5. For the
// smooth objectives here (a few dozen terms of size ~1) the truncation error h^2/6 f'''
// is ~1e-11 and the rounding error 2^-53 |L| / h ~1e-10, so 1e-8 of the largest entry
// (or of 1) leaves a margin of ~100, while a wrong term in a gradient formula misses by
// a fraction of an entry.
void CheckGradient(const char* what, const std::vector<double>& analytic,
                   std::vector<double>& values, const std::function<double()>& objective) {
  constexpr double kStep = 1e-5;
  ASSERT_EQ(analytic.size(), values.size()) << what;
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double saved = values[i];
    values[i] = saved + kStep;
    const double plus = objective();
    values[i] = saved - kStep;
    const double minus = objective();
    values[i] = saved;
    const double numeric = (plus - minus) / (2 * kStep);
    max_ref = std::max(max_ref, std::fabs(numeric));
    max_diff = std::max(max_diff, std::fabs(analytic[i] - numeric));
  }
  EXPECT_GT(max_ref, 1e-3) << what << ": the gradient is ~zero, the check proves nothing";
  EXPECT_LE(max_diff, 1e-8 * std::max(1.0, max_ref)) << what;
}

TEST(LlamaOpsTest, RmsNormBackwardMatchesFiniteDifferences) {
  HostBackendDouble be;
  // eps = 0.3 against a mean square of ~1: a gradient that forgot eps would miss.
  const int rows = 3, C = 7;
  const float eps = 0.3f;
  std::vector<double> x = Randn(rows * C, 1, 1.0, 0.2), w = Randn(C, 2, 0.3, 1.0);
  const std::vector<double> r = Randn(rows * C, 3);  // L = sum(out * r)
  std::vector<double> out(rows * C), rstd(rows);
  auto objective = [&] {
    EXPECT_THAT(be.RmsNormForward(rows, C, eps, x.data(), w.data(), out.data(), rstd.data()),
                IsOk());
    return Dot(out, r);
  };
  objective();
  std::vector<double> dx(rows * C, 0.0), dw(C, 0.0);
  ASSERT_THAT(be.RmsNormBackward(rows, C, r.data(), x.data(), w.data(), rstd.data(), dx.data(),
                                 dw.data()), IsOk());
  CheckGradient("dx", dx, x, objective);
  CheckGradient("dweight", dw, w, objective);
  // Both accumulate: a second call adds the same again.
  std::vector<double> dx2 = dx, dw2 = dw;
  ASSERT_THAT(be.RmsNormBackward(rows, C, r.data(), x.data(), w.data(), rstd.data(), dx2.data(),
                                 dw2.data()), IsOk());
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_DOUBLE_EQ(dx2[i], 2 * dx[i]);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_DOUBLE_EQ(dw2[i], 2 * dw[i]);
}

TEST(LlamaOpsTest, SwiGluBackwardMatchesFiniteDifferences) {
  HostBackendDouble be;
  const int rows = 3, F = 5;
  std::vector<double> gu = Randn(rows * 2 * F, 4, 2.0);
  const std::vector<double> r = Randn(rows * F, 5);
  std::vector<double> out(rows * F);
  auto objective = [&] {
    EXPECT_THAT(be.SwiGluForward(rows, F, gu.data(), out.data()), IsOk());
    return Dot(out, r);
  };
  std::vector<double> dgu(rows * 2 * F, 99.0);  // overwritten, not accumulated into
  ASSERT_THAT(be.SwiGluBackward(rows, F, gu.data(), r.data(), dgu.data()), IsOk());
  CheckGradient("dgu", dgu, gu, objective);
}

// Random tables (not a rotation's): the identities below hold for any cos and sin.
TEST(LlamaOpsTest, RotaryInverseIsTheTransposeAndLeavesTheRestAlone) {
  HostBackendDouble be;
  const int rows = 10, T = 4, heads = 3, hs = 6;
  const int64_t stride = 23;  // 18 rotated columns, 5 left alone
  const std::vector<double> cos = Randn(T * hs / 2, 6), sin = Randn(T * hs / 2, 7);
  const std::vector<double> x = Randn(rows * stride, 8), y = Randn(rows * stride, 9);
  std::vector<double> rx = x, ry = y;
  ASSERT_THAT(be.Rotary(rows, T, heads, hs, stride, cos.data(), sin.data(), false, rx.data()),
              IsOk());
  ASSERT_THAT(be.Rotary(rows, T, heads, hs, stride, cos.data(), sin.data(), true, ry.data()),
              IsOk());
  // <R x, y> = <x, R^T y>: sums of ~200 products of size ~1, equal to ~1e-14.
  EXPECT_NEAR(Dot(rx, y), Dot(x, ry), 1e-12 * std::sqrt(Dot(x, x) * Dot(y, y)));
  for (int r = 0; r < rows; ++r) {
    for (int64_t c = int64_t{heads} * hs; c < stride; ++c) {
      EXPECT_EQ(rx[r * stride + c], x[r * stride + c]) << "row " << r << " column " << c;
      EXPECT_EQ(ry[r * stride + c], y[r * stride + c]) << "row " << r << " column " << c;
    }
  }
}

TEST(LlamaOpsTest, RotaryOfRealAnglesIsUndoneByItsInverse) {
  HostBackendDouble be;
  const int rows = 6, T = 3, heads = 2, hs = 8, half = hs / 2;
  std::vector<double> cos(T * half), sin(T * half);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      const double angle = t * std::pow(10000.0, -2.0 * i / hs);
      cos[t * half + i] = std::cos(angle);
      sin[t * half + i] = std::sin(angle);
    }
  }
  const std::vector<double> x = Randn(rows * heads * hs, 10);
  std::vector<double> y = x;
  ASSERT_THAT(be.Rotary(rows, T, heads, hs, heads * hs, cos.data(), sin.data(), false, y.data()),
              IsOk());
  EXPECT_NEAR(Dot(y, y), Dot(x, x), 1e-12 * Dot(x, x));  // a rotation keeps the norm
  // Position 0 (rows 0 and 3) is the identity.
  for (int i = 0; i < heads * hs; ++i) EXPECT_NEAR(y[i], x[i], 1e-15) << i;
  ASSERT_THAT(be.Rotary(rows, T, heads, hs, heads * hs, cos.data(), sin.data(), true, y.data()),
              IsOk());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-14) << i;
}

// Hugging Face's apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, with cos and sin
// the (T, hs/2) tables repeated twice along the head and rotate_half(q) = [-q2, q1].
TEST(LlamaOpsTest, RotaryIsHuggingFacesRotateHalf) {
  HostBackendDouble be;
  const double c[] = {0.6, -0.28}, s[] = {0.8, 0.96};  // one position, hs = 4
  std::vector<double> q = {1, 2, 3, 4};
  ASSERT_THAT(be.Rotary(1, 1, 1, 4, 4, c, s, false, q.data()), IsOk());
  const std::vector<double> want = {1 * 0.6 - 3 * 0.8, 2 * -0.28 - 4 * 0.96,
                                    3 * 0.6 + 1 * 0.8, 4 * -0.28 + 2 * 0.96};
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(q[i], want[i]) << i;
}

TEST(LlamaOpsTest, RepeatKvAndSumKvGroupsAreAdjoint) {
  HostBackendDouble be;
  const int rows = 5, NH = 6, NKV = 2, hs = 3;
  const std::vector<double> x = Randn(rows * (NH + 2 * NKV) * hs, 11);
  const std::vector<double> y = Randn(rows * 3 * NH * hs, 12);
  std::vector<double> rx(y.size()), sy(x.size());
  ASSERT_THAT(be.RepeatKv(rows, NH, NKV, hs, x.data(), rx.data()), IsOk());
  ASSERT_THAT(be.SumKvGroups(rows, NH, NKV, hs, y.data(), sy.data()), IsOk());
  EXPECT_NEAR(Dot(rx, y), Dot(x, sy), 1e-12 * std::sqrt(Dot(rx, rx) * Dot(y, y)));
}

// Hugging Face's repeat_kv: key/value head j serves query heads j G .. j G + G - 1.
TEST(LlamaOpsTest, RepeatKvGivesEachQueryHeadItsGroupsHead) {
  HostBackendDouble be;
  // NH = 4, NKV = 2, hs = 1: q0..q3 | k0 k1 | v0 v1.
  const std::vector<double> qkv = {10, 11, 12, 13, 20, 21, 30, 31};
  std::vector<double> out(12);
  ASSERT_THAT(be.RepeatKv(1, 4, 2, 1, qkv.data(), out.data()), IsOk());
  EXPECT_EQ(out, (std::vector<double>{10, 11, 12, 13, 20, 20, 21, 21, 30, 30, 31, 31}));
  std::vector<double> back(8);
  ASSERT_THAT(be.SumKvGroups(1, 4, 2, 1, out.data(), back.data()), IsOk());
  EXPECT_EQ(back, (std::vector<double>{10, 11, 12, 13, 40, 42, 60, 62}));
}

// Hugging Face's LlamaRMSNorm and SiLU on values worked by hand.
TEST(LlamaOpsTest, RmsNormAndSwiGluByHand) {
  HostBackendDouble be;
  const double x[] = {3, 4}, w[] = {1, 2};
  double out[2], rstd[1];
  ASSERT_THAT(be.RmsNormForward(1, 2, 0.5f, x, w, out, rstd), IsOk());
  // mean(x^2) = 12.5; + eps 0.5 = 13.
  EXPECT_DOUBLE_EQ(rstd[0], 1 / std::sqrt(13.0));
  EXPECT_DOUBLE_EQ(out[0], 3 / std::sqrt(13.0));
  EXPECT_DOUBLE_EQ(out[1], 8 / std::sqrt(13.0));
  const double gu[] = {1, -2, 3, 5};  // gate 1, -2 | up 3, 5
  double glu[2];
  ASSERT_THAT(be.SwiGluForward(1, 2, gu, glu), IsOk());
  EXPECT_NEAR(glu[0], 0.7310585786300049 * 3, 1e-15);   // silu(1) = 1 / (1 + e^-1)
  EXPECT_NEAR(glu[1], -0.2384058440442351 * 5, 1e-15);  // silu(-2) = -2 / (1 + e^2)
}

// An empty call touches nothing and needs no pointers; the checks still come first.
TEST(LlamaOpsTest, EmptyCallsAreValidAndChecksComeFirst) {
  HostBackendDouble be;
  EXPECT_THAT(be.RmsNormForward(0, 8, 1e-5f, nullptr, nullptr, nullptr, nullptr), IsOk());
  EXPECT_THAT(be.RmsNormBackward(4, 8, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
              IsOk());
  EXPECT_THAT(be.Rotary(4, 2, 0, 8, 8, nullptr, nullptr, false, nullptr), IsOk());
  EXPECT_THAT(be.SwiGluForward(0, 4, nullptr, nullptr), IsOk());
  EXPECT_THAT(be.SwiGluBackward(3, 0, nullptr, nullptr, nullptr), IsOk());
  EXPECT_THAT(be.RepeatKv(0, 4, 2, 8, nullptr, nullptr), IsOk());
  EXPECT_THAT(be.SumKvGroups(3, 4, 2, 0, nullptr, nullptr), IsOk());
  EXPECT_THAT(be.RmsNormForward(0, 8, 0.0f, nullptr, nullptr, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("host-double backend: RmsNormForward(rows=0 C=8): "
                                            "eps = 0 must be finite and positive")));
  EXPECT_THAT(be.RepeatKv(0, 4, 3, 8, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("RepeatKv(rows=0 NH=4 NKV=3 hs=8): NH and NKV")));
  EXPECT_THAT(be.Rotary(4, 2, 2, 8, 12, nullptr, nullptr, false, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("Rotary(rows=4 T=2 heads=2 hs=8 stride=12): "
                                            "heads * hs = 16 is more than stride")));
}

}  // namespace
}  // namespace pipetrain::compute
