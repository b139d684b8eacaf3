// Every CpuBackend op against its plain-loop reference (in double) on fresh random
// inputs, plus a few properties the reference itself must have.
#include "stage_server/compute/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "common/model/init.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/compute/reference_ops.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;

std::vector<float> Randn(size_t n, uint64_t seed, double scale = 1.0) {
  std::vector<float> v(n);
  const uint64_t key = model::InitStreamKey(seed, 1000, 0);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * model::NormalAt(key, i));
  return v;
}
std::vector<double> D(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<int32_t> Tokens(size_t n, int V, uint64_t seed) {
  std::vector<int32_t> t(n);
  const uint64_t key = model::InitStreamKey(seed, 2000, 0);
  for (size_t i = 0; i < n; ++i) {
    t[i] = static_cast<int32_t>(std::fabs(model::NormalAt(key, i)) * 1e6) % V;
  }
  return t;
}

// Max |a - b| relative to max |b| (so tiny entries of a big tensor do not dominate).
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want,
                 double tol = 2e-5) {
  ASSERT_EQ(got.size(), want.size());
  double max_ref = 1e-30, max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(want[i]));
    max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(max_diff / max_ref, tol) << "max diff " << max_diff << " max ref " << max_ref;
  EXPECT_GT(max_ref, 1e-6) << "reference is all zeros: the test proves nothing";
}

class CpuBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CpuBackend::Create(1);
    ASSERT_THAT(b, IsOk());
    cpu_ = std::move(*b);
  }
  std::unique_ptr<CpuBackend> cpu_;
};

TEST_F(CpuBackendTest, MatmulAllTransposesAndBeta) {
  const int m = 7, n = 5, k = 9;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      auto a = Randn(m * k, 1), b = Randn(k * n, 2), c = Randn(m * n, 3);
      auto cd = D(c);
      reference::Matmul<double>(ta, tb, m, n, k, 0.7, D(a).data(), D(b).data(), 0.3,
                                cd.data());
      ASSERT_THAT(cpu_->Matmul(ta, tb, m, n, k, 0.7f, a.data(), b.data(), 0.3f, c.data()),
                  IsOk());
      ExpectClose(c, cd);
    }
  }
  // beta = 0 overwrites garbage.
  std::vector<float> a = Randn(m * k, 4), b = Randn(k * n, 5), c(m * n, NAN);
  std::vector<double> cd(m * n, 0);
  reference::Matmul<double>(false, false, m, n, k, 1, D(a).data(), D(b).data(), 0,
                            cd.data());
  ASSERT_THAT(cpu_->Matmul(false, false, m, n, k, 1, a.data(), b.data(), 0, c.data()),
              IsOk());
  ExpectClose(c, cd);
  // An empty inner dimension still honours beta = 0 (BLAS would skip c).
  std::fill(c.begin(), c.end(), NAN);
  ASSERT_THAT(cpu_->Matmul(false, false, m, n, 0, 1, a.data(), b.data(), 0, c.data()),
              IsOk());
  EXPECT_EQ(c, std::vector<float>(m * n, 0.0f));
  EXPECT_THAT(cpu_->Matmul(false, false, -1, n, k, 1, a.data(), b.data(), 0, c.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CpuBackendTest, ElementwiseBiasAndReductions) {
  const int rows = 6, cols = 11, n = rows * cols;
  auto a = Randn(n, 10), b = Randn(n, 11), bias = Randn(cols, 12);
  std::vector<float> out(n);
  ASSERT_THAT(cpu_->Add(n, a.data(), b.data(), out.data()), IsOk());
  std::vector<double> want(n);
  reference::Add<double>(n, D(a).data(), D(b).data(), want.data());
  ExpectClose(out, want);

  auto y = b;
  auto yd = D(b);
  ASSERT_THAT(cpu_->Axpy(n, 0.25f, a.data(), y.data()), IsOk());
  reference::Axpy<double>(n, 0.25, D(a).data(), yd.data());
  ExpectClose(y, yd);

  ASSERT_THAT(cpu_->Scale(n, -1.5f, y.data()), IsOk());
  reference::Scale<double>(n, -1.5, yd.data());
  ExpectClose(y, yd);

  auto x = a;
  auto xd = D(a);
  ASSERT_THAT(cpu_->AddBias(rows, cols, bias.data(), x.data()), IsOk());
  reference::AddBias<double>(rows, cols, D(bias).data(), xd.data());
  ExpectClose(x, xd);

  auto db = Randn(cols, 13);
  auto dbd = D(db);
  ASSERT_THAT(cpu_->BiasGrad(rows, cols, a.data(), db.data()), IsOk());
  reference::BiasGrad<double>(rows, cols, D(a).data(), dbd.data());
  ExpectClose(db, dbd);

  auto ss = cpu_->SumOfSquares(n, a.data());
  ASSERT_THAT(ss, IsOk());
  EXPECT_NEAR(*ss, reference::SumOfSquares<double>(n, D(a).data()), 1e-5 * *ss);
}

TEST_F(CpuBackendTest, Embedding) {
  const int B = 2, T = 5, C = 8, V = 13;
  auto tokens = Tokens(B * T, V, 20);
  auto wte = Randn(V * C, 21), wpe = Randn(T * C, 22), dout = Randn(B * T * C, 23);
  std::vector<float> out(B * T * C);
  std::vector<double> want(out.size());
  ASSERT_THAT(cpu_->EmbeddingForward(B, T, C, V, tokens.data(), wte.data(), wpe.data(),
                                     out.data()),
              IsOk());
  ASSERT_THAT(reference::EmbeddingForward<double>(
                  B, T, C, V, tokens.data(), D(wte).data(), D(wpe).data(), want.data()),
              IsOk());
  ExpectClose(out, want);
  auto dwte = Randn(V * C, 24), dwpe = Randn(T * C, 25);
  auto dwte_d = D(dwte), dwpe_d = D(dwpe);
  ASSERT_THAT(cpu_->EmbeddingBackward(B, T, C, V, tokens.data(), dout.data(), dwte.data(),
                                      dwpe.data()),
              IsOk());
  ASSERT_THAT(
      reference::EmbeddingBackward<double>(B, T, C, V, tokens.data(), D(dout).data(),
                                           dwte_d.data(), dwpe_d.data()),
      IsOk());
  ExpectClose(dwte, dwte_d);
  ExpectClose(dwpe, dwpe_d);
  tokens[3] = V;
  EXPECT_THAT(
      cpu_->EmbeddingForward(B, T, C, V, tokens.data(), wte.data(), wpe.data(),
                             out.data()),
      StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("tokens[3]")));
}

TEST_F(CpuBackendTest, LayerNorm) {
  const int rows = 9, C = 24;
  auto x = Randn(rows * C, 30, 3.0), w = Randn(C, 31), b = Randn(C, 32);
  auto dout = Randn(rows * C, 33);
  std::vector<float> out(rows * C), mean(rows), rstd(rows);
  std::vector<double> out_d(rows * C), mean_d(rows), rstd_d(rows);
  ASSERT_THAT(cpu_->LayerNormForward(rows, C, x.data(), w.data(), b.data(), out.data(),
                                     mean.data(), rstd.data()),
              IsOk());
  reference::LayerNormForward<double>(rows, C, D(x).data(), D(w).data(), D(b).data(),
                                      out_d.data(), mean_d.data(), rstd_d.data());
  ExpectClose(out, out_d);
  ExpectClose(mean, mean_d);
  ExpectClose(rstd, rstd_d);
  auto dx = Randn(rows * C, 34), dw = Randn(C, 35), db = Randn(C, 36);
  auto dx_d = D(dx), dw_d = D(dw), db_d = D(db);
  ASSERT_THAT(
      cpu_->LayerNormBackward(rows, C, dout.data(), x.data(), w.data(), mean.data(),
                              rstd.data(), dx.data(), dw.data(), db.data()),
      IsOk());
  reference::LayerNormBackward<double>(rows, C, D(dout).data(), D(x).data(), D(w).data(),
                                       mean_d.data(), rstd_d.data(), dx_d.data(),
                                       dw_d.data(), db_d.data());
  ExpectClose(dx, dx_d, 1e-4);
  ExpectClose(dw, dw_d, 1e-4);
  ExpectClose(db, db_d);
}

TEST_F(CpuBackendTest, Gelu) {
  const int n = 257;
  auto x = Randn(n, 40, 2.0), dout = Randn(n, 41);
  std::vector<float> out(n), dx(n);
  std::vector<double> out_d(n), dx_d(n);
  ASSERT_THAT(cpu_->GeluForward(n, x.data(), out.data()), IsOk());
  reference::GeluForward<double>(n, D(x).data(), out_d.data());
  ExpectClose(out, out_d);
  ASSERT_THAT(cpu_->GeluBackward(n, x.data(), dout.data(), dx.data()), IsOk());
  reference::GeluBackward<double>(n, D(x).data(), D(dout).data(), dx_d.data());
  ExpectClose(dx, dx_d);
}

TEST_F(CpuBackendTest, Attention) {
  const int B = 2, T = 7, C = 12, NH = 3;
  auto qkv = Randn(B * T * 3 * C, 50), dout = Randn(B * T * C, 51);
  std::vector<float> out(B * T * C), probs(B * NH * T * T, NAN), dqkv(B * T * 3 * C, NAN);
  std::vector<double> out_d(out.size()), probs_d(probs.size()), dqkv_d(dqkv.size());
  ASSERT_THAT(cpu_->AttentionForward(B, T, C, NH, qkv.data(), out.data(), probs.data()),
              IsOk());
  reference::AttentionForward<double>(B, T, C, NH, D(qkv).data(), out_d.data(),
                                      probs_d.data());
  ExpectClose(out, out_d);
  ExpectClose(probs, probs_d);
  ASSERT_THAT(cpu_->AttentionBackward(B, T, C, NH, dout.data(), qkv.data(), probs.data(),
                                      dqkv.data()),
              IsOk());
  reference::AttentionBackward<double>(B, T, C, NH, D(dout).data(), D(qkv).data(),
                                       probs_d.data(), dqkv_d.data());
  ExpectClose(dqkv, dqkv_d, 1e-4);
  // The first position attends only to itself: its output is its own v.
  for (int i = 0; i < C; ++i) EXPECT_FLOAT_EQ(out[i], qkv[2 * C + i]);
}

TEST_F(CpuBackendTest, CrossEntropy) {
  const int rows = 6, V = 17;
  auto logits = Randn(rows * V, 60, 3.0);
  auto targets = Tokens(rows, V, 61);
  std::vector<float> probs(rows * V), loss(1), dlogits(rows * V);
  std::vector<double> probs_d(probs.size()), loss_d(1), dlogits_d(probs.size());
  ASSERT_THAT(cpu_->CrossEntropyForward(rows, V, logits.data(), targets.data(),
                                        probs.data(), loss.data()),
              IsOk());
  ASSERT_THAT(
      reference::CrossEntropyForward<double>(rows, V, D(logits).data(), targets.data(),
                                             probs_d.data(), loss_d.data()),
      IsOk());
  ExpectClose(probs, probs_d);
  ExpectClose(loss, loss_d);
  ASSERT_THAT(cpu_->CrossEntropyBackward(rows, V, probs.data(), targets.data(), 0.5f,
                                         dlogits.data()),
              IsOk());
  ASSERT_THAT(reference::CrossEntropyBackward<double>(
                  rows, V, probs_d.data(), targets.data(), 0.5, dlogits_d.data()),
              IsOk());
  ExpectClose(dlogits, dlogits_d);
  // In place (probs aliasing logits) gives the same loss.
  auto inplace = logits;
  std::vector<float> loss2(1);
  ASSERT_THAT(cpu_->CrossEntropyForward(rows, V, inplace.data(), targets.data(),
                                        inplace.data(), loss2.data()),
              IsOk());
  EXPECT_FLOAT_EQ(loss2[0], loss[0]);
  targets[2] = -1;
  EXPECT_THAT(
      cpu_->CrossEntropyForward(rows, V, logits.data(), targets.data(), probs.data(),
                                loss.data()),
      StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("targets[2]")));
}

TEST_F(CpuBackendTest, AdamW) {
  const int n = 50;
  auto p = Randn(n, 70), g = Randn(n, 71), m = Randn(n, 72, 0.1), v = Randn(n, 73, 0.1);
  for (float& x : v) x = x * x;  // second moments are non-negative
  auto pd = D(p), md = D(m), vd = D(v);
  for (int step = 1; step <= 3; ++step) {
    ASSERT_THAT(cpu_->AdamW(n, p.data(), g.data(), m.data(), v.data(), 1e-2f, 0.9f, 0.95f,
                            1e-8f, 0.1f, step),
                IsOk());
    reference::AdamW<double>(n, pd.data(), D(g).data(), md.data(), vd.data(), 1e-2f, 0.9f,
                             0.95f, 1e-8f, 0.1f, step);
  }
  ExpectClose(p, pd);
  ExpectClose(m, md);
  ExpectClose(v, vd);
  EXPECT_THAT(cpu_->AdamW(n, p.data(), g.data(), m.data(), v.data(), 1e-2f, 0.9f, 0.95f,
                          1e-8f, 0.1f, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// The reference itself: LayerNorm output rows have mean 0 and variance ~1 with unit
// weight; softmax rows sum to 1; a hand-computed GELU value.
// The default CopyFromHostPieces: pieces land back to back, empty ones take no room,
// and nothing past the last piece is written.
TEST_F(CpuBackendTest, CopyFromHostPiecesPlacesPiecesConsecutively) {
  std::vector<std::byte> src(1000);
  const uint64_t key = model::InitStreamKey(77, 3000, 0);
  for (size_t i = 0; i < src.size(); ++i) {
    src[i] = static_cast<std::byte>(static_cast<uint64_t>(std::fabs(model::NormalAt(key, i)) * 1e6));
  }
  // Lengths 0, 1, 0, 300, 0, 699, 0: empty pieces at both ends and in between.
  const std::span<const std::byte> all(src);
  const std::vector<std::span<const std::byte>> pieces = {
      all.subspan(0, 0),   all.subspan(0, 1),   all.subspan(1, 0), all.subspan(1, 300),
      all.subspan(301, 0), all.subspan(301, 699), {}};
  auto buf = cpu_->Allocate(src.size() + 8);
  ASSERT_THAT(buf, IsOk());
  auto* dst = static_cast<std::byte*>(*buf);
  std::fill(dst, dst + src.size() + 8, std::byte{0xEE});
  ASSERT_THAT(cpu_->CopyFromHostPieces(dst, pieces), IsOk());
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst));
  for (size_t i = src.size(); i < src.size() + 8; ++i) {
    EXPECT_EQ(dst[i], std::byte{0xEE}) << "byte " << i << " past the pieces was written";
  }
  EXPECT_THAT(cpu_->CopyFromHostPieces(dst, {}), IsOk());
  ASSERT_THAT(cpu_->Free(*buf), IsOk());
}

TEST(ReferenceOpsTest, Properties) {
  const int rows = 3, C = 16;
  auto x = D(Randn(rows * C, 80, 5.0));
  std::vector<double> w(C, 1.0), b(C, 0.0), out(rows * C), mean(rows), rstd(rows);
  reference::LayerNormForward<double>(rows, C, x.data(), w.data(), b.data(), out.data(),
                                      mean.data(), rstd.data());
  for (int r = 0; r < rows; ++r) {
    double s = 0, s2 = 0;
    for (int c = 0; c < C; ++c) {
      s += out[r * C + c];
      s2 += out[r * C + c] * out[r * C + c];
    }
    EXPECT_NEAR(s / C, 0, 1e-12);
    EXPECT_NEAR(s2 / C, 1, 1e-3);
  }
  const double one = 1.0;
  double g;
  reference::GeluForward<double>(1, &one, &g);
  EXPECT_NEAR(g, 0.8411919906082768, 1e-12);  // 0.5 (1 + tanh(sqrt(2/pi) 1.044715))
  std::vector<double> logits = {1, 2, 3}, probs(3), loss(1);
  const int32_t target = 2;
  ASSERT_THAT(reference::CrossEntropyForward<double>(1, 3, logits.data(), &target,
                                                     probs.data(), loss.data()),
              IsOk());
  EXPECT_NEAR(probs[0] + probs[1] + probs[2], 1, 1e-15);
  EXPECT_NEAR(loss[0], std::log(std::exp(1) + std::exp(2) + std::exp(3)) - 3, 1e-12);
}

}  // namespace
}  // namespace pipetrain::compute
