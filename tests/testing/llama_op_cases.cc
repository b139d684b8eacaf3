// The Llama ops' rows of the backend conformance tables (op_cases.cc, bad_op_cases.cc):
// RMSNorm, rotary embeddings, SwiGLU and the grouped-query head copies, at odd sizes,
// one element, Llama-3.2-1B's widths (C = 2048, F = 8192, hs = 64, 32 query heads over 8
// key/value heads), Rotary in place on part of a row, and the bad calls each check refuses.
//
// Budgets: the suite's fp32 rule (kFp32Tolerance = 1e-5, backend_testing.h) holds every
// row, and these ops are far inside it: Rotary, SwiGLU and the head copies are a handful
// of float roundings an element (Rotary: two products and a sum, ~2u = 1.2e-7 relative;
// SwiGLU: FastExp's 2 ulp and four roundings, ~4e-7; SumKvGroups: G - 1 float
// additions, 7 at most here; RepeatKv copies, so its rows are held to exact equality),
// and RMSNorm's row statistic is summed in double on every backend, leaving a few
// roundings as well
// (its weight gradient sums rows in float: u sqrt(rows / 2), 3e-7 at 512 rows). Measured
// on the cpu backend at Llama-3.2-1B's widths (64 rows): relative L2 errors of 3e-8 to
// 6e-8 for every output but dweight (1.5e-7), i.e. 1 to 3 u (u = 2^-24 = 6e-8).
// None of them reads the products' precision, so their bf16 rows (the same rows, run
// with bf16 products) are held to fp32's rule too (Tolerance in the conformance test).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/op_case.h"

namespace pipetrain::testing {
namespace {

size_t Sz(int64_t a, int64_t b = 1, int64_t c = 1) { return static_cast<size_t>(a * b * c); }

// ---- RMSNorm ----------------------------------------------------------------------------

void AddRmsNormCases(std::vector<OpCase>& cases) {
  // (rows, C, scale of x, eps). eps matters only where mean(x^2) is not much larger: the
  // rows with x of scale 0.01 (mean square 1e-4 against eps 1e-5) and eps 0.5 would show
  // an eps left out or misplaced, which at scale 1.5 sits below the budget.
  const struct { int rows, C; double x_scale; float eps; } shapes[] = {
      {1, 8, 1.5, 1e-5f},   {9, 24, 0.01, 1e-5f}, {37, 33, 1.5, 0.5f}, {512, 768, 1.5, 1e-5f},
      {4, 2048, 1.0, 1e-5f}, {5, 1000, 0.01, 1e-6f}, {3, 1, 1.5, 1e-5f}};
  for (const auto& s : shapes) {
    const int rows = s.rows, C = s.C;
    const float eps = s.eps;
    const size_t N = Sz(rows, C);
    const std::string shape = absl::StrCat("rows=", rows, " C=", C, " eps=", eps);
    const std::vector<TensorSpec> params = {In("x", N, s.x_scale, s.x_scale / 5),
                                            In("weight", Sz(C), 0.5, 1.0)};
    OpCase fwd{.op = "RmsNormForward", .shape = shape, .tensors = params};
    fwd.tensors.insert(fwd.tensors.end(), {Out("out", N), Out("rstd", Sz(rows))});
    fwd.run = Call([=](auto& be, auto& t) {
      return be.RmsNormForward(rows, C, eps, t["x"], t["weight"], t["out"], t["rstd"]);
    });
    cases.push_back(std::move(fwd));
    // Backward from the forward's rstd, as both sides get it in float: both gradients,
    // dx alone (backward-input), dweight alone (backward-weight, which needs no weight).
    for (int which : {3, 1, 2}) {
      const bool dx = which & 1, dw = which & 2;
      OpCase c{.op = "RmsNormBackward",
               .shape = absl::StrCat(shape, dx ? " dx" : "", dw ? " dweight" : "",
                                     dx ? "" : " weight=null")};
      c.tensors = params;
      c.tensors.insert(c.tensors.end(),
                       {Derived("norm", N), Derived("rstd", Sz(rows)), In("dout", N)});
      if (dx) c.tensors.push_back(InOut("dx", N));
      if (dw) c.tensors.push_back(InOut("dweight", Sz(C)));
      c.prepare = [=](compute::BackendT<double>& be, Tensors<double>& t) {
        return be.RmsNormForward(rows, C, eps, t["x"], t["weight"], t["norm"], t["rstd"]);
      };
      c.run = Call([=](auto& be, auto& t) {
        return be.RmsNormBackward(rows, C, t["dout"], t["x"], dx ? t["weight"] : nullptr,
                                  t["rstd"], dx ? t["dx"] : nullptr, dw ? t["dweight"] : nullptr);
      });
      cases.push_back(std::move(c));
    }
  }
}

// ---- Rotary embeddings ------------------------------------------------------------------

void AddRotaryCases(std::vector<OpCase>& cases) {
  // (rows, T, heads, hs, stride, offset): x is (rows, offset + stride) and the op gets
  // x + offset, as a layer rotates q at 0 and k at NH hs of a q|k|v row; columns past
  // heads * hs (the rest of the row, v) must come back untouched. Rows past T wrap.
  // cos and sin are random, not a rotation's: the op is linear in x for any table.
  const struct { int rows, T, heads, hs; int64_t stride, offset; } shapes[] = {
      {1, 1, 1, 2, 2, 0},      {10, 5, 3, 8, 24, 0},      {14, 7, 4, 16, 128, 0},
      {14, 7, 2, 16, 128, 64}, {10, 4, 2, 6, 13, 1},      {128, 64, 8, 64, 768, 0},
      {64, 64, 8, 64, 768, 512}};
  for (const auto& s : shapes) {
    for (bool inverse : {false, true}) {
      const int rows = s.rows, T = s.T, heads = s.heads, hs = s.hs;
      const int64_t stride = s.stride, offset = s.offset;
      cases.push_back(
          {.op = "Rotary",
           .shape = absl::StrCat("rows=", rows, " T=", T, " heads=", heads, " hs=", hs,
                                 " stride=", stride, " x+", offset, inverse ? " inverse" : ""),
           .tensors = {InOut("x", Sz(rows, stride) + offset), In("cos", Sz(T, hs / 2)),
                       In("sin", Sz(T, hs / 2))},
           .run = Call([=](auto& be, auto& t) {
             return be.Rotary(rows, T, heads, hs, stride, t["cos"], t["sin"], inverse,
                              t["x"] + offset);
           })});
    }
  }
}

// ---- SwiGLU -----------------------------------------------------------------------------

void AddSwiGluCases(std::vector<OpCase>& cases) {
  // (rows, F, scale of gu): gates past |g| = 20 (silu saturated at both ends) at scale 10.
  const struct { int rows, F; double scale; } shapes[] = {
      {1, 1, 2.0}, {3, 7, 2.0}, {16, 257, 3.0}, {64, 1024, 2.0}, {5, 8192, 2.0}, {9, 100, 10.0}};
  for (const auto& s : shapes) {
    const int rows = s.rows, F = s.F;
    const std::string shape = absl::StrCat("rows=", rows, " F=", F, " scale=", s.scale);
    cases.push_back({.op = "SwiGluForward", .shape = shape,
                     .tensors = {In("gu", Sz(rows, 2, F), s.scale), Out("out", Sz(rows, F))},
                     .run = Call([=](auto& be, auto& t) {
                       return be.SwiGluForward(rows, F, t["gu"], t["out"]);
                     })});
    cases.push_back({.op = "SwiGluBackward", .shape = shape,
                     .tensors = {In("gu", Sz(rows, 2, F), s.scale), In("dout", Sz(rows, F)),
                                 Out("dgu", Sz(rows, 2, F))},
                     .run = Call([=](auto& be, auto& t) {
                       return be.SwiGluBackward(rows, F, t["gu"], t["dout"], t["dgu"]);
                     })});
  }
}

// ---- Grouped-query heads ----------------------------------------------------------------

void AddKvGroupCases(std::vector<OpCase>& cases) {
  // (rows, NH, NKV, hs): one of everything, groups of 2 and 3, one key/value head for all
  // (multi-query), NKV = NH (plain multi-head: copies), odd hs, Llama-3.2-1B's 32 over 8.
  const int shapes[][4] = {{1, 1, 1, 2},  {5, 4, 2, 8},  {7, 6, 2, 4},    {9, 8, 1, 16},
                           {6, 4, 4, 8},  {3, 12, 4, 5}, {16, 32, 8, 64}};
  for (const auto& s : shapes) {
    const int rows = s[0], NH = s[1], NKV = s[2], hs = s[3];
    const std::string shape = absl::StrCat("rows=", rows, " NH=", NH, " NKV=", NKV, " hs=", hs);
    const size_t packed = Sz(rows, NH + 2 * NKV, hs), full = Sz(rows, 3 * NH, hs);
    cases.push_back({.op = "RepeatKv", .shape = shape,
                     .tensors = {In("qkv", packed), Out("out", full)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.RepeatKv(rows, NH, NKV, hs, t["qkv"], t["out"]);
                     }),
                     .exact = true});
    cases.push_back({.op = "SumKvGroups", .shape = shape,
                     .tensors = {In("dfull", full), Out("dqkv", packed)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.SumKvGroups(rows, NH, NKV, hs, t["dfull"], t["dqkv"]);
                     })});
  }
}

// ---- Bad calls --------------------------------------------------------------------------

using compute::Backend;
using T = Tensors<float>;

BadCase Bad(std::string op, std::string what, std::vector<TensorSpec> tensors, OpFn<float> run,
            std::string message) {
  return {std::move(op), std::move(what), std::move(tensors), std::move(run), std::move(message)};
}

void AddRmsNormAndRotaryBadCases(std::vector<BadCase>& b) {
  // RMSNorm: rows = 3, C = 4.
  const std::vector<TensorSpec> rms = {In("x", 12), In("w", 4), Out("out", 12),
                                       InOut("rstd", 3, 0.1, 1), Out("dx", 12), Out("dw", 4)};
  b.push_back(Bad("RmsNormForward", "rows < 0", rms, [](Backend& be, T& t) {
    return be.RmsNormForward(-3, 4, 1e-5f, t["x"], t["w"], t["out"], t["rstd"]);
  }, "rows = -3 is negative"));
  for (float eps : {0.0f, -1e-5f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    b.push_back(Bad("RmsNormForward", absl::StrCat("eps ", eps), rms, [eps](Backend& be, T& t) {
      return be.RmsNormForward(3, 4, eps, t["x"], t["w"], t["out"], t["rstd"]);
    }, "must be finite and positive"));
  }
  b.push_back(Bad("RmsNormForward", "rstd null", rms, [](Backend& be, T& t) {
    return be.RmsNormForward(3, 4, 1e-5f, t["x"], t["w"], t["out"], nullptr);
  }, "rstd is null"));
  b.push_back(Bad("RmsNormForward", "weight null", rms, [](Backend& be, T& t) {
    return be.RmsNormForward(3, 4, 1e-5f, t["x"], nullptr, t["out"], t["rstd"]);
  }, "weight is null"));
  b.push_back(Bad("RmsNormBackward", "C < 0", rms, [](Backend& be, T& t) {
    return be.RmsNormBackward(3, -4, t["out"], t["x"], t["w"], t["rstd"], t["dx"], t["dw"]);
  }, "C = -4 is negative"));
  b.push_back(Bad("RmsNormBackward", "weight null with dx", rms, [](Backend& be, T& t) {
    return be.RmsNormBackward(3, 4, t["out"], t["x"], nullptr, t["rstd"], t["dx"], nullptr);
  }, "weight is null"));
  b.push_back(Bad("RmsNormBackward", "x null", rms, [](Backend& be, T& t) {
    return be.RmsNormBackward(3, 4, t["out"], nullptr, t["w"], t["rstd"], nullptr, t["dw"]);
  }, "x is null"));
  // Rotary: rows = 4, T = 2, 2 heads of 4 in rows of 8.
  const std::vector<TensorSpec> rot = {InOut("x", 32), In("cos", 4), In("sin", 4)};
  b.push_back(Bad("Rotary", "rows < 0", rot, [](Backend& be, T& t) {
    return be.Rotary(-4, 2, 2, 4, 8, t["cos"], t["sin"], false, t["x"]);
  }, "rows = -4 is negative"));
  b.push_back(Bad("Rotary", "stride < 0", rot, [](Backend& be, T& t) {
    return be.Rotary(4, 2, 2, 4, -8, t["cos"], t["sin"], false, t["x"]);
  }, "stride = -8 is negative"));
  b.push_back(Bad("Rotary", "hs odd", rot, [](Backend& be, T& t) {
    return be.Rotary(4, 2, 2, 3, 8, t["cos"], t["sin"], false, t["x"]);
  }, "hs must be even"));
  b.push_back(Bad("Rotary", "heads * hs > stride", rot, [](Backend& be, T& t) {
    return be.Rotary(4, 2, 3, 4, 8, t["cos"], t["sin"], true, t["x"]);
  }, "heads * hs = 12 is more than stride"));
  b.push_back(Bad("Rotary", "T = 0", rot, [](Backend& be, T& t) {
    return be.Rotary(4, 0, 2, 4, 8, t["cos"], t["sin"], false, t["x"]);
  }, "T must be positive"));
  b.push_back(Bad("Rotary", "sin null", rot, [](Backend& be, T& t) {
    return be.Rotary(4, 2, 2, 4, 8, t["cos"], nullptr, false, t["x"]);
  }, "sin is null"));
  b.push_back(Bad("Rotary", "x null", rot, [](Backend& be, T& t) {
    return be.Rotary(4, 2, 2, 4, 8, t["cos"], t["sin"], true, nullptr);
  }, "x is null"));
}

void AddSwiGluAndKvBadCases(std::vector<BadCase>& b) {
  // SwiGLU: rows = 2, F = 4.
  const std::vector<TensorSpec> glu = {In("gu", 16), In("dout", 8), Out("out", 16)};
  b.push_back(Bad("SwiGluForward", "F < 0", glu, [](Backend& be, T& t) {
    return be.SwiGluForward(2, -4, t["gu"], t["out"]);
  }, "F = -4 is negative"));
  b.push_back(Bad("SwiGluForward", "out null", glu, [](Backend& be, T& t) {
    return be.SwiGluForward(2, 4, t["gu"], nullptr);
  }, "out is null"));
  b.push_back(Bad("SwiGluForward", "out = gu", glu, [](Backend& be, T& t) {
    return be.SwiGluForward(2, 4, t["gu"], t["gu"]);
  }, "out must not overlap gu"));
  b.push_back(Bad("SwiGluBackward", "rows < 0", glu, [](Backend& be, T& t) {
    return be.SwiGluBackward(-2, 4, t["gu"], t["dout"], t["out"]);
  }, "rows = -2 is negative"));
  b.push_back(Bad("SwiGluBackward", "dout null", glu, [](Backend& be, T& t) {
    return be.SwiGluBackward(2, 4, t["gu"], nullptr, t["out"]);
  }, "dout is null"));
  b.push_back(Bad("SwiGluBackward", "dgu = gu", glu, [](Backend& be, T& t) {
    return be.SwiGluBackward(2, 4, t["gu"], t["dout"], t["gu"]);
  }, "dgu must not alias gu"));
  b.push_back(Bad("SwiGluBackward", "dgu = dout", glu, [](Backend& be, T& t) {
    return be.SwiGluBackward(2, 4, t["gu"], t["out"], t["out"]);
  }, "dgu must not alias dout"));
  // Grouped-query heads: rows = 2, NH = 4, NKV = 2, hs = 2: packed (2, 16), full (2, 24).
  const std::vector<TensorSpec> kv = {In("packed", 32), In("full", 48), Out("out", 48)};
  const char* kHeads = "NH and NKV must be positive and NKV must divide NH";
  for (const auto& heads : {std::pair{4, 3}, std::pair{4, 0}, std::pair{0, 2},
                            std::pair{2, 4}}) {
    const int NH = heads.first, NKV = heads.second;
    const std::string what = absl::StrCat("NH=", NH, " NKV=", NKV);
    b.push_back(Bad("RepeatKv", what, kv, [NH, NKV](Backend& be, T& t) {
      return be.RepeatKv(2, NH, NKV, 2, t["packed"], t["out"]);
    }, kHeads));
    b.push_back(Bad("SumKvGroups", what, kv, [NH, NKV](Backend& be, T& t) {
      return be.SumKvGroups(2, NH, NKV, 2, t["full"], t["out"]);
    }, kHeads));
  }
  b.push_back(Bad("RepeatKv", "hs < 0", kv, [](Backend& be, T& t) {
    return be.RepeatKv(2, 4, 2, -2, t["packed"], t["out"]);
  }, "hs = -2 is negative"));
  b.push_back(Bad("RepeatKv", "qkv null", kv, [](Backend& be, T& t) {
    return be.RepeatKv(2, 4, 2, 2, nullptr, t["out"]);
  }, "qkv is null"));
  b.push_back(Bad("RepeatKv", "out = qkv", kv, [](Backend& be, T& t) {
    return be.RepeatKv(2, 4, 2, 2, t["out"], t["out"]);
  }, "out must not overlap qkv"));
  b.push_back(Bad("SumKvGroups", "rows < 0", kv, [](Backend& be, T& t) {
    return be.SumKvGroups(-2, 4, 2, 2, t["full"], t["out"]);
  }, "rows = -2 is negative"));
  b.push_back(Bad("SumKvGroups", "dqkv null", kv, [](Backend& be, T& t) {
    return be.SumKvGroups(2, 4, 2, 2, t["full"], nullptr);
  }, "dqkv is null"));
  b.push_back(Bad("SumKvGroups", "dqkv = dfull", kv, [](Backend& be, T& t) {
    return be.SumKvGroups(2, 4, 2, 2, t["out"], t["out"]);
  }, "dqkv must not overlap dfull"));
}

}  // namespace

void AddLlamaOpCases(std::vector<OpCase>& cases) {
  AddRmsNormCases(cases);
  AddRotaryCases(cases);
  AddSwiGluCases(cases);
  AddKvGroupCases(cases);
}

void AddLlamaBadCases(std::vector<BadCase>& cases) {
  AddRmsNormAndRotaryBadCases(cases);
  AddSwiGluAndKvBadCases(cases);
}

}  // namespace pipetrain::testing
