// What is particular to the cpu backend; its ops are held to the reference by the
// conformance suite (backend_conformance_test.cc): the default CopyFromHostPieces it
// inherits, and a property of its attention.
#include "stage_server/compute/cpu_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "common/model/init.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/backend_testing.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::RandomNormal;

class CpuBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CpuBackend::Create(1);
    ASSERT_THAT(b, IsOk());
    cpu_ = std::move(*b);
  }
  std::unique_ptr<CpuBackend> cpu_;
};

TEST_F(CpuBackendTest, AttentionFirstPositionIsItsOwnValue) {
  // The first position attends only to itself: its output is its own v.
  const int B = 2, T = 7, C = 12, NH = 3;
  auto qkv = RandomNormal(B * T * 3 * C, 50);
  std::vector<float> out(B * T * C), probs(B * NH * T * T, std::numeric_limits<float>::quiet_NaN());
  ASSERT_THAT(cpu_->AttentionForward(B, T, C, NH, qkv.data(), out.data(), probs.data()), IsOk());
  for (int i = 0; i < C; ++i) EXPECT_FLOAT_EQ(out[i], qkv[2 * C + i]);
}

// The default CopyFromHostPieces: pieces land back to back, empty ones take no room,
// and nothing past the last piece is written.
TEST_F(CpuBackendTest, CopyFromHostPiecesPlacesPiecesConsecutively) {
  std::vector<std::byte> src(1000);
  const uint64_t key = model::InitStreamKey(77, 3000, 0);
  for (size_t i = 0; i < src.size(); ++i) {
    src[i] =
        static_cast<std::byte>(static_cast<uint64_t>(std::fabs(model::NormalAt(key, i)) * 1e6));
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

// Every op other than the products splits only what it computes independently (rows,
// columns, elements) among its threads, so two threads give one thread's bits. The sizes
// are large enough that every op does split (parallel_ranges.h: 16k elements a piece).
TEST(CpuBackendThreadsTest, TheLoopsGiveTheSameBitsOnOneThreadAndOnTwo) {
  auto one = CpuBackend::Create(1);
  auto two = CpuBackend::Create(2);
  ASSERT_THAT(one, IsOk());
  ASSERT_THAT(two, IsOk());
  const int rows = 512, C = 256, V = 300, B = 8, T = 64;
  const int64_t n = int64_t{rows} * C;
  const auto x = RandomNormal(n, 101), d = RandomNormal(n, 102), w = RandomNormal(C, 103);
  const auto bias = RandomNormal(C, 104), logits = RandomNormal(int64_t{rows} * V, 105);
  const auto targets = pipetrain::testing::RandomIds(rows, V, 106);
  const auto tokens = pipetrain::testing::RandomIds(B * T, V, 107);
  const auto wte = RandomNormal(int64_t{V} * C, 108), wpe = RandomNormal(int64_t{T} * C, 109);
  // Runs every loop op on `b` and returns all it wrote, in order.
  auto run = [&](CpuBackend& b) {
    std::vector<float> all;
    auto keep = [&](const std::vector<float>& v) { all.insert(all.end(), v.begin(), v.end()); };
    std::vector<float> out(n), mean(rows), rstd(rows), dx(n, 0.5f), dw(C, 0.25f), db(C, 0.125f);
    EXPECT_THAT(b.LayerNormForward(rows, C, x.data(), w.data(), bias.data(), out.data(),
                                   mean.data(), rstd.data()), IsOk());
    EXPECT_THAT(b.LayerNormBackward(rows, C, d.data(), x.data(), w.data(), mean.data(),
                                    rstd.data(), dx.data(), dw.data(), db.data()), IsOk());
    keep(out), keep(mean), keep(rstd), keep(dx), keep(dw), keep(db);
    std::vector<float> g(n), dg(n), sum(n), y = d, z = x;
    EXPECT_THAT(b.GeluForward(n, x.data(), g.data()), IsOk());
    EXPECT_THAT(b.GeluBackward(n, x.data(), d.data(), dg.data()), IsOk());
    EXPECT_THAT(b.Add(n, x.data(), d.data(), sum.data()), IsOk());
    EXPECT_THAT(b.Axpy(n, 0.3f, x.data(), y.data()), IsOk());
    EXPECT_THAT(b.Scale(n, 0.7f, z.data()), IsOk());
    EXPECT_THAT(b.AddBias(rows, C, bias.data(), z.data()), IsOk());
    std::vector<float> bg(C, 1.0f);
    EXPECT_THAT(b.BiasGrad(rows, C, d.data(), bg.data()), IsOk());
    keep(g), keep(dg), keep(sum), keep(y), keep(z), keep(bg);
    std::vector<float> probs(logits.size()), loss(1), dlogits(logits.size()), soft(logits.size());
    EXPECT_THAT(b.CrossEntropyForward(rows, V, logits.data(), targets.data(), probs.data(),
                                      loss.data()), IsOk());
    EXPECT_THAT(b.CrossEntropyBackward(rows, V, probs.data(), targets.data(), 1.0f / rows,
                                       dlogits.data()), IsOk());
    EXPECT_THAT(b.Softmax(rows, V, logits.data(), soft.data()), IsOk());
    keep(probs), keep(loss), keep(dlogits), keep(soft);
    std::vector<float> emb(int64_t{B} * T * C), p = x, m(n, 0.01f), v(n, 0.02f);
    EXPECT_THAT(b.EmbeddingForward(B, T, C, V, tokens.data(), wte.data(), wpe.data(),
                                   emb.data()), IsOk());
    EXPECT_THAT(b.AdamW(n, p.data(), d.data(), m.data(), v.data(), 1e-3f, 0.9f, 0.95f, 1e-8f,
                        0.1f, 3), IsOk());
    keep(emb), keep(p), keep(m), keep(v);
    // Llama's ops (cpu_backend_llama.cc): x as (rows, C) for RMSNorm, as q|k|v rows of
    // 4 query and 2 key/value heads of 32 for rotary (wpe and wte as its tables) and the
    // head copies, as gate|up of F = C / 2 for SwiGLU.
    const int F = C / 2, NH = 4, NKV = 2, hs = 32;
    std::vector<float> rms(n), rs(rows), rdx(n, 0.5f), rdw(C, 0.25f), rot = x;
    EXPECT_THAT(b.RmsNormForward(rows, C, 1e-5f, x.data(), w.data(), rms.data(), rs.data()),
                IsOk());
    EXPECT_THAT(b.RmsNormBackward(rows, C, d.data(), x.data(), w.data(), rs.data(), rdx.data(),
                                  rdw.data()), IsOk());
    EXPECT_THAT(b.Rotary(rows, T, NH + NKV, hs, C, wpe.data(), wte.data(), false, rot.data()),
                IsOk());
    EXPECT_THAT(b.Rotary(rows, T, NKV, hs, C, wpe.data(), wte.data(), true,
                         rot.data() + NH * hs), IsOk());
    keep(rms), keep(rs), keep(rdx), keep(rdw), keep(rot);
    std::vector<float> glu(int64_t{rows} * F), dgu(n), full(int64_t{rows} * 3 * NH * hs),
        packed(n);
    EXPECT_THAT(b.SwiGluForward(rows, F, x.data(), glu.data()), IsOk());
    EXPECT_THAT(b.SwiGluBackward(rows, F, x.data(), d.data(), dgu.data()), IsOk());
    EXPECT_THAT(b.RepeatKv(rows, NH, NKV, hs, x.data(), full.data()), IsOk());
    EXPECT_THAT(b.SumKvGroups(rows, NH, NKV, hs, full.data(), packed.data()), IsOk());
    keep(glu), keep(dgu), keep(full), keep(packed);
    return all;
  };
  const std::vector<float> a = run(**one), b = run(**two);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i])) << "value " << i;
  }
}

}  // namespace
}  // namespace pipetrain::compute
