// The table of the backend conformance suite: every op of backend.h with the shapes and
// options it is held to the reference at (odd sizes, one element, T = 1, one head, sizes
// past a kernel's block, every transpose and beta, in place, split backward halves),
// and the bad arguments every backend must reject.
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/op_case.h"

namespace pipetrain::testing {
namespace {

size_t Sz(int64_t a, int64_t b = 1, int64_t c = 1, int64_t d = 1) {
  return static_cast<size_t>(a * b * c * d);
}

// ---- Matrix product ---------------------------------------------------------------------

OpCase MatmulCase(bool ta, bool tb, int m, int n, int k, double beta, bool tf32) {
  OpCase c{.op = "Matmul",
           .shape = absl::StrCat("m=", m, " n=", n, " k=", k, " ta=", ta, " tb=", tb,
                                 " beta=", beta),
           .tf32 = tf32};
  // beta = 0 overwrites: c starts as NaN to prove every element is written.
  c.tensors = {In("a", Sz(m, k)), In("b", Sz(k, n)),
               beta == 0 ? Out("c", Sz(m, n)) : InOut("c", Sz(m, n))};
  c.run = Call([=](auto& be, auto& t) {
    return be.Matmul(ta, tb, m, n, k, t.Scalar(0.7), t["a"], t["b"], t.Scalar(beta), t["c"]);
  });
  return c;
}

// k = 0: c = beta * c, and beta = 0 clears garbage; a and b are not read.
OpCase MatmulEmptyInnerCase(int m, int n, double beta) {
  OpCase c{.op = "Matmul",
           .shape = absl::StrCat("m=", m, " n=", n, " k=0 beta=", beta, " a=b=null"),
           .exact = beta == 0};
  c.tensors = {beta == 0 ? Out("c", Sz(m, n)) : InOut("c", Sz(m, n))};
  c.run = Call([=](auto& be, auto& t) {
    return be.Matmul(false, false, m, n, 0, t.Scalar(1), nullptr, nullptr, t.Scalar(beta),
                     t["c"]);
  });
  return c;
}

void AddMatmulCases(std::vector<OpCase>& cases) {
  // The last is the head's product with GPT-2's vocabulary (logits of 6 tokens, C = 16).
  const int shapes[][3] = {{1, 1, 1},      {7, 5, 9},     {33, 65, 17}, {1, 50, 3},
                           {128, 96, 257}, {200, 31, 64}, {6, 50257, 16}};
  for (bool tf32 : {false, true}) {
    for (const auto& s : shapes) {
      // A TF32 product of k < 8 terms is dominated by the rounding of single operands
      // (up to 2^-11 each), so its relative error can reach the bound by chance; TF32
      // is held to its bound on the real-sized products.
      if (tf32 && s[2] < 8) continue;
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          for (double beta : {0.0, 0.5, 1.0}) {
            cases.push_back(MatmulCase(ta, tb, s[0], s[1], s[2], beta, tf32));
          }
        }
      }
    }
  }
  cases.push_back(MatmulEmptyInnerCase(3, 4, 0));
  cases.push_back(MatmulEmptyInnerCase(7, 5, 0));
  cases.push_back(MatmulEmptyInnerCase(3, 4, 0.5));
}

// A product by product copies (bf16 only: fp32 products keep none): a (an activation
// kept for a weight gradient), b (a weight) or both given as copies made by
// MakeProductCopy must give Matmul's bits on the tensors themselves (c_matmul, computed
// beside it from the same c).
OpCase MatmulByCopyCase(bool ta, bool tb, int m, int n, int k, double beta, bool copy_a,
                        bool copy_b) {
  OpCase c{.op = "MatmulByCopy",
           .shape = absl::StrCat("m=", m, " n=", n, " k=", k, " ta=", ta, " tb=", tb,
                                 " beta=", beta, copy_a ? " a=copy" : "",
                                 copy_b ? " b=copy" : "")};
  c.tensors = {In("a", Sz(m, k)), In("b", Sz(k, n)),
               beta == 0 ? Out("c", Sz(m, n)) : InOut("c", Sz(m, n)), Out("c_matmul", Sz(m, n))};
  c.run = Call([=](auto& be, auto& t) -> absl::Status {
    using Real = std::remove_pointer_t<decltype(t["a"])>;
    if (beta != 0) {
      absl::Status s = be.Copy(t["c_matmul"], t["c"], Sz(m, n) * sizeof(Real));
      if (!s.ok()) return s;
    }
    // Each operand as values, or as a copy in memory the case allocates and frees.
    std::vector<void*> copies;
    const auto operand = [&](Real* values, int64_t elements,
                             bool as_copy) -> absl::StatusOr<compute::ProductOperand<Real>> {
      if (!as_copy) return compute::Values<Real>(values);
      absl::StatusOr<void*> copy =
          be.Allocate(static_cast<size_t>(be.ProductCopyBytes(elements)));
      if (!copy.ok()) return copy.status();
      copies.push_back(*copy);
      absl::Status s = be.MakeProductCopy(elements, values, *copy);
      if (!s.ok()) return s;
      return compute::CopyOf<Real>(*copy);
    };
    absl::StatusOr<compute::ProductOperand<Real>> a = operand(t["a"], int64_t{m} * k, copy_a);
    absl::StatusOr<compute::ProductOperand<Real>> b = operand(t["b"], int64_t{k} * n, copy_b);
    absl::Status s = a.ok() ? b.status() : a.status();
    if (s.ok()) s = be.MatmulByCopy(ta, tb, m, n, k, t.Scalar(0.7), *a, *b, t.Scalar(beta), t["c"]);
    if (s.ok()) s = be.Synchronize();
    for (void* copy : copies) {
      if (absl::Status freed = be.Free(copy); s.ok()) s = freed;
    }
    if (!s.ok()) return s;
    return be.Matmul(ta, tb, m, n, k, t.Scalar(0.7), t["a"], t["b"], t.Scalar(beta),
                     t["c_matmul"]);
  });
  c.identical = {{"c", "c_matmul"}};
  return c;
}

void AddProductCopyCases(std::vector<OpCase>& cases) {
  // The shapes of a layer's products, small, and the head's (vocab 50257): the weight as
  // b (forward, backward-input), the activation as a transposed a (weight gradient), both.
  const int shapes[][3] = {{1, 1, 1}, {7, 5, 9}, {33, 65, 17}, {6, 50257, 16}};
  for (const auto& s : shapes) {
    for (bool tb : {false, true}) {
      for (double beta : {0.0, 1.0}) {
        cases.push_back(MatmulByCopyCase(false, tb, s[0], s[1], s[2], beta, false, true));
      }
    }
    cases.push_back(MatmulByCopyCase(true, false, s[2], s[1], s[0], 1.0, true, false));
  }
  cases.push_back(MatmulByCopyCase(true, false, 12, 20, 8, 0.5, true, true));
  cases.push_back(MatmulByCopyCase(false, true, 12, 20, 8, 0.0, true, true));
}

// ---- Elementwise, bias, reductions ------------------------------------------------------

void AddElementwiseCases(std::vector<OpCase>& cases) {
  for (int64_t n : {int64_t{1}, int64_t{66}, int64_t{1000}, int64_t{(1 << 20) + 3}}) {
    const std::string shape = absl::StrCat("n=", n);
    const size_t N = Sz(n);
    cases.push_back({.op = "Add", .shape = shape,
                     .tensors = {In("a", N), In("b", N), Out("out", N)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.Add(n, t["a"], t["b"], t["out"]);
                     })});
    cases.push_back({.op = "Add", .shape = shape + " out=a",
                     .tensors = {InOut("a", N), In("b", N)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.Add(n, t["a"], t["b"], t["a"]);
                     })});
    cases.push_back({.op = "Axpy", .shape = shape,
                     .tensors = {In("x", N), InOut("y", N)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.Axpy(n, t.Scalar(-0.3), t["x"], t["y"]);
                     })});
    cases.push_back({.op = "Scale", .shape = shape,
                     .tensors = {InOut("x", N)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.Scale(n, t.Scalar(1.7), t["x"]);
                     })});
    cases.push_back({.op = "RoundToBf16", .shape = shape,
                     .tensors = {InOut("x", N, 3.0)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.RoundToBf16(n, t["x"]);
                     })});
  }
  for (int64_t n : {int64_t{1}, int64_t{257}, int64_t{1001}, int64_t{1 << 20}}) {
    const std::string shape = absl::StrCat("n=", n);
    const size_t N = Sz(n);
    cases.push_back({.op = "GeluForward", .shape = shape,
                     .tensors = {In("x", N, 2.0), Out("out", N)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.GeluForward(n, t["x"], t["out"]);
                     })});
    cases.push_back({.op = "GeluForward", .shape = shape + " out=x",
                     .tensors = {InOut("x", N, 2.0)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.GeluForward(n, t["x"], t["x"]);
                     })});
    cases.push_back({.op = "GeluBackward", .shape = shape,
                     .tensors = {In("x", N, 2.0), In("dout", N), Out("dx", N)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.GeluBackward(n, t["x"], t["dout"], t["dx"]);
                     })});
    cases.push_back({.op = "GeluBackward", .shape = shape + " dx=dout",
                     .tensors = {In("x", N, 2.0), InOut("dout", N)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.GeluBackward(n, t["x"], t["dout"], t["dout"]);
                     })});
  }
  const int bias_shapes[][2] = {{1, 1}, {6, 11}, {37, 19}, {4096, 96}, {3, 1000}, {1000, 33}};
  for (const auto& s : bias_shapes) {
    const int rows = s[0], cols = s[1];
    const std::string shape = absl::StrCat("rows=", rows, " cols=", cols);
    cases.push_back({.op = "AddBias", .shape = shape,
                     .tensors = {In("bias", Sz(cols)), InOut("x", Sz(rows, cols))},
                     .run = Call([=](auto& be, auto& t) {
                       return be.AddBias(rows, cols, t["bias"], t["x"]);
                     })});
    cases.push_back({.op = "BiasGrad", .shape = shape,  // += onto what is there
                     .tensors = {In("dout", Sz(rows, cols)), InOut("dbias", Sz(cols))},
                     .run = Call([=](auto& be, auto& t) {
                       return be.BiasGrad(rows, cols, t["dout"], t["dbias"]);
                     })});
  }
  for (int64_t n : {int64_t{1}, int64_t{66}, int64_t{1000}, int64_t{3 * (1 << 20) + 7}}) {
    cases.push_back({.op = "SumOfSquares", .shape = absl::StrCat("n=", n),
                     .tensors = {In("x", Sz(n)), Result("sum")},
                     .run = Call([=](auto& be, auto& t) -> absl::Status {
                       auto sum = be.SumOfSquares(n, t["x"]);
                       if (sum.ok()) t.result("sum") = *sum;
                       return sum.status();
                     })});
  }
  cases.push_back({.op = "SumOfSquares", .shape = "n=0 x=null",
                   .tensors = {Result("sum")},
                   .run = Call([=](auto& be, auto& t) -> absl::Status {
                     auto sum = be.SumOfSquares(0, nullptr);
                     if (sum.ok()) t.result("sum") = *sum;
                     return sum.status();
                   }),
                   .exact = true});
}

// ---- Embedding --------------------------------------------------------------------------

void AddEmbeddingCases(std::vector<OpCase>& cases) {
  // (B, T, C, V, rows of wpe): wpe may have more rows than T.
  // The last two: GPT-2's vocabulary, and llm.c's padding of it to 50,304.
  const int shapes[][5] = {{1, 1, 8, 5, 4},        {2, 5, 8, 13, 5}, {3, 17, 33, 50, 20},
                           {4, 64, 96, 256, 67},   {2, 5, 7, 3, 8},  {2, 8, 16, 50257, 8},
                           {1, 4, 8, 50304, 4}};
  for (const auto& s : shapes) {
    const int B = s[0], T = s[1], C = s[2], V = s[3], P = s[4];
    const std::string shape = absl::StrCat("B=", B, " T=", T, " C=", C, " V=", V, " P=", P);
    cases.push_back({.op = "EmbeddingForward", .shape = shape,
                     .tensors = {Ids("tokens", Sz(B, T), V), In("wte", Sz(V, C)),
                                 In("wpe", Sz(P, C)), Out("out", Sz(B, T, C))},
                     .run = Call([=](auto& be, auto& t) {
                       return be.EmbeddingForward(B, T, C, V, t.ids("tokens"), t["wte"],
                                                  t["wpe"], t["out"]);
                     })});
    // Both gradients, then either alone (nullptr for the other).
    for (int which : {3, 1, 2}) {
      const bool wte = which & 1, wpe = which & 2;
      OpCase c{.op = "EmbeddingBackward",
               .shape = absl::StrCat(shape, wte ? " dwte" : "", wpe ? " dwpe" : "")};
      c.tensors = {Ids("tokens", Sz(B, T), V), In("dout", Sz(B, T, C))};
      if (wte) c.tensors.push_back(InOut("dwte", Sz(V, C)));
      if (wpe) c.tensors.push_back(InOut("dwpe", Sz(P, C)));
      c.run = Call([=](auto& be, auto& t) {
        return be.EmbeddingBackward(B, T, C, V, t.ids("tokens"), t["dout"],
                                    wte ? t["dwte"] : nullptr, wpe ? t["dwpe"] : nullptr);
      });
      cases.push_back(std::move(c));
    }
  }
}

// ---- LayerNorm --------------------------------------------------------------------------

void AddLayerNormCases(std::vector<OpCase>& cases) {
  // (rows, C, scale of x): with C = 1 the output is exactly the bias and dx exactly
  // what was there, so those are not compared (the float rounding of x - mean is all
  // the backend has left).
  const struct { int rows, C; double x_scale; } shapes[] = {
      {1, 8, 1.5}, {9, 24, 3.0}, {37, 33, 1.5}, {512, 768, 1.5}, {5, 1000, 1.5}, {3, 1, 1.5}};
  for (const auto& s : shapes) {
    const int rows = s.rows, C = s.C;
    const size_t N = Sz(rows, C);
    const std::string shape = absl::StrCat("rows=", rows, " C=", C);
    auto maybe = [&](TensorSpec t) { return C > 1 ? t : Unchecked(t); };
    const std::vector<TensorSpec> params = {In("x", N, s.x_scale, 0.3),
                                            In("weight", Sz(C), 0.5, 1.0),
                                            In("bias", Sz(C), 0.1)};
    OpCase fwd{.op = "LayerNormForward", .shape = shape, .tensors = params};
    fwd.tensors.insert(fwd.tensors.end(),
                       {maybe(Out("out", N)), Out("mean", Sz(rows)), Out("rstd", Sz(rows))});
    fwd.run = Call([=](auto& be, auto& t) {
      return be.LayerNormForward(rows, C, t["x"], t["weight"], t["bias"], t["out"], t["mean"],
                                 t["rstd"]);
    });
    cases.push_back(std::move(fwd));
    // Backward from the mean and rstd of the forward, as both sides get them in float.
    // All three gradients, dx alone (backward-input), dweight and dbias alone
    // (backward-weight, which needs no weight).
    for (int which : {7, 1, 6}) {
      const bool dx = which & 1, dw = which & 2, db = which & 4;
      OpCase c{.op = "LayerNormBackward",
               .shape = absl::StrCat(shape, dx ? " dx" : "", dw ? " dweight" : "",
                                     db ? " dbias" : "", dx ? "" : " weight=null")};
      c.tensors = params;
      c.tensors.insert(c.tensors.end(), {Derived("ln", N), Derived("mean", Sz(rows)),
                                         Derived("rstd", Sz(rows)), In("dout", N)});
      if (dx) c.tensors.push_back(maybe(InOut("dx", N)));
      if (dw) c.tensors.push_back(InOut("dweight", Sz(C)));
      if (db) c.tensors.push_back(InOut("dbias", Sz(C)));
      c.prepare = [=](compute::BackendT<double>& be, Tensors<double>& t) {
        return be.LayerNormForward(rows, C, t["x"], t["weight"], t["bias"], t["ln"],
                                   t["mean"], t["rstd"]);
      };
      c.run = Call([=](auto& be, auto& t) {
        return be.LayerNormBackward(rows, C, t["dout"], t["x"], dx ? t["weight"] : nullptr,
                                    t["mean"], t["rstd"], dx ? t["dx"] : nullptr,
                                    dw ? t["dweight"] : nullptr, db ? t["dbias"] : nullptr);
      });
      cases.push_back(std::move(c));
    }
  }
}

// ---- Attention --------------------------------------------------------------------------

void AddAttentionCases(std::vector<OpCase>& cases) {
  // (B, T, C, NH): T = 1, one head (the plain-sgemm path), odd sizes, longer sequences.
  const int shapes[][4] = {{1, 1, 8, 2},  {2, 7, 12, 3},   {3, 33, 64, 4},
                           {1, 65, 48, 1}, {2, 128, 96, 2}, {1, 200, 40, 5}};
  for (bool tf32 : {false, true}) {
    for (const auto& s : shapes) {
      const int B = s[0], T = s[1], C = s[2], NH = s[3];
      const std::string shape = absl::StrCat("B=", B, " T=", T, " C=", C, " NH=", NH);
      const size_t nqkv = Sz(B, T, 3, C), nout = Sz(B, T, C), nprobs = Sz(B, NH, T, T);
      cases.push_back({.op = "AttentionForward", .shape = shape, .tf32 = tf32,
                       .tensors = {In("qkv", nqkv), Out("out", nout), Out("probs", nprobs)},
                       .run = Call([=](auto& be, auto& t) {
                         return be.AttentionForward(B, T, C, NH, t["qkv"], t["out"],
                                                    t["probs"]);
                       })});
      OpCase bwd{.op = "AttentionBackward", .shape = shape, .tf32 = tf32,
                 .tensors = {In("qkv", nqkv), Derived("out", nout), Derived("probs", nprobs),
                             In("dout", nout), Out("dqkv", nqkv)}};
      bwd.prepare = [=](compute::BackendT<double>& be, Tensors<double>& t) {
        return be.AttentionForward(B, T, C, NH, t["qkv"], t["out"], t["probs"]);
      };
      bwd.run = Call([=](auto& be, auto& t) {
        return be.AttentionBackward(B, T, C, NH, t["dout"], t["qkv"], t["probs"], t["dqkv"]);
      });
      cases.push_back(std::move(bwd));
    }
  }
}

// ---- Strided copy and softmax (the key-value cache of generation) ----------------------

void AddCopyAndSoftmaxCases(std::vector<OpCase>& cases) {
  // (rows, cols, src_stride, dst_stride): one element, dense rows, the cache's scatter of
  // 2 NH head rows of hs into (2 NH, T, hs), odd strides on both sides. dst starts random
  // so that a write outside the copied columns shows; a copy is exact.
  const int64_t shapes[][4] = {{1, 1, 1, 1}, {3, 8, 8, 8}, {8, 16, 16, 64 * 16},
                               {7, 5, 9, 6}, {33, 65, 65, 100}};
  for (const auto& s : shapes) {
    const int rows = static_cast<int>(s[0]), cols = static_cast<int>(s[1]);
    const int64_t ss = s[2], ds = s[3];
    cases.push_back(
        {.op = "Copy2D",
         .shape = absl::StrCat("rows=", rows, " cols=", cols, " src_stride=", ss,
                               " dst_stride=", ds),
         .tensors = {In("src", Sz(rows, ss)), InOut("dst", Sz(rows, ds))},
         .run = Call([=](auto& be, auto& t) {
           return be.Copy2D(rows, cols, t["src"], ss, t["dst"], ds);
         }),
         .exact = true});
  }
  const int softmax_shapes[][2] = {{1, 1}, {4, 7}, {6, 257}, {3, 1000}, {12, 64}};
  for (const auto& s : softmax_shapes) {
    const int rows = s[0], cols = s[1];
    const size_t N = Sz(rows, cols);
    const std::string shape = absl::StrCat("rows=", rows, " cols=", cols);
    cases.push_back({.op = "Softmax", .shape = shape,
                     .tensors = {In("x", N, 3.0), Out("out", N)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.Softmax(rows, cols, t["x"], t["out"]);
                     })});
    cases.push_back({.op = "Softmax", .shape = shape + " out=x",
                     .tensors = {InOut("x", N, 3.0)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.Softmax(rows, cols, t["x"], t["x"]);
                     })});
  }
}

// ---- Cross-entropy ----------------------------------------------------------------------

void AddCrossEntropyCases(std::vector<OpCase>& cases) {
  const int shapes[][2] = {{1, 5},  {6, 17},      {37, 256},
                           {256, 1000}, {3, 2}, {5, 50257}, {2, 50304}};  // GPT-2, llm.c's padding
  for (const auto& s : shapes) {
    const int rows = s[0], V = s[1];
    const size_t N = Sz(rows, V);
    const std::string shape = absl::StrCat("rows=", rows, " V=", V);
    cases.push_back({.op = "CrossEntropyForward", .shape = shape,
                     .tensors = {In("logits", N, 3.0), Ids("targets", Sz(rows), V),
                                 Out("probs", N), Out("loss", 1)},
                     .run = Call([=](auto& be, auto& t) {
                       return be.CrossEntropyForward(rows, V, t["logits"], t.ids("targets"),
                                                     t["probs"], t["loss"]);
                     })});
    // Out of place, then in place (probs aliasing logits): the same loss, to the bit.
    cases.push_back(
        {.op = "CrossEntropyForward", .shape = shape + " probs=logits",
         .tensors = {InOut("logits", N, 3.0), Ids("targets", Sz(rows), V), Out("probs", N),
                     Out("loss", 1), Out("loss_in_place", 1)},
         .run = Call([=](auto& be, auto& t) -> absl::Status {
           const absl::Status s = be.CrossEntropyForward(rows, V, t["logits"],
                                                         t.ids("targets"), t["probs"],
                                                         t["loss"]);
           if (!s.ok()) return s;
           return be.CrossEntropyForward(rows, V, t["logits"], t.ids("targets"),
                                         t["logits"], t["loss_in_place"]);
         }),
         .identical = {{"loss", "loss_in_place"}}});
    // Backward from the probabilities of the forward; dlogits may alias probs.
    for (bool in_place : {false, true}) {
      OpCase c{.op = "CrossEntropyBackward",
               .shape = absl::StrCat(shape, in_place ? " dlogits=probs" : "")};
      c.tensors = {In("logits", N, 3.0), Ids("targets", Sz(rows), V),
                   in_place ? Checked(Derived("probs", N)) : Derived("probs", N),
                   Derived("loss", 1)};
      if (!in_place) c.tensors.push_back(Out("dlogits", N));
      c.prepare = [=](compute::BackendT<double>& be, Tensors<double>& t) {
        return be.CrossEntropyForward(rows, V, t["logits"], t.ids("targets"), t["probs"],
                                      t["loss"]);
      };
      c.run = Call([=](auto& be, auto& t) {
        return be.CrossEntropyBackward(rows, V, t["probs"], t.ids("targets"),
                                       t.Scalar(1.0 / rows),
                                       in_place ? t["probs"] : t["dlogits"]);
      });
      cases.push_back(std::move(c));
    }
  }
}

// ---- AdamW ------------------------------------------------------------------------------

// Three steps with a fresh gradient each, from zero moments or from given ones (second
// moments squared, as they are never negative).
OpCase AdamWCase(int64_t n, float weight_decay, float beta2, bool given_moments) {
  const size_t N = Sz(n);
  OpCase c{.op = "AdamW",
           .shape = absl::StrCat("n=", n, " weight_decay=", weight_decay, " beta2=", beta2,
                                 given_moments ? " moments given" : "")};
  c.tensors = {InOut("param", N), In("g1", N), In("g2", N), In("g3", N)};
  if (given_moments) {
    c.tensors.insert(c.tensors.end(),
                     {InOut("m", N, 0.1), In("root_v", N, 0.1), Checked(Derived("v", N))});
    c.prepare = [=](compute::BackendT<double>&, Tensors<double>& t) {
      for (size_t i = 0; i < N; ++i) t["v"][i] = t["root_v"][i] * t["root_v"][i];
      return absl::OkStatus();
    };
  } else {
    c.tensors.insert(c.tensors.end(), {InOut("m", N, 0), InOut("v", N, 0)});
  }
  c.run = Call([=](auto& be, auto& t) -> absl::Status {
    for (int step = 1; step <= 3; ++step) {
      const absl::Status s =
          be.AdamW(n, t["param"], t[absl::StrCat("g", step)], t["m"], t["v"], 1e-2f, 0.9f,
                   beta2, 1e-8f, weight_decay, step);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
  return c;
}

void AddAdamWCases(std::vector<OpCase>& cases) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    for (float wd : {0.0f, 0.1f}) cases.push_back(AdamWCase(n, wd, 0.999f, false));
  }
  cases.push_back(AdamWCase(50, 0.1f, 0.95f, true));
}

// Every op in F32, the precision every backend has.
std::vector<OpCase>* F32Cases() {
  auto* all = new std::vector<OpCase>;
  AddMatmulCases(*all);
  AddElementwiseCases(*all);
  AddEmbeddingCases(*all);
  AddLayerNormCases(*all);
  AddAttentionCases(*all);
  AddLlamaOpCases(*all);
  AddCopyAndSoftmaxCases(*all);
  AddCrossEntropyCases(*all);
  AddAdamWCases(*all);
  for (OpCase& c : *all) c.dtype = common::DType::kF32;
  return all;
}

// Every op again with bf16 products: the products and attention round their operands,
// and every other op must be untouched by the setting; and the products by a weight's
// product copy, which exist only in bf16.
std::vector<OpCase>* Bf16Cases() {
  auto* all = F32Cases();
  for (OpCase& c : *all) c.dtype = common::DType::kBF16;
  std::erase_if(*all, [](const OpCase& c) { return c.tf32; });  // TF32 is fp32's option
  std::vector<OpCase> copies;
  AddProductCopyCases(copies);
  for (OpCase& c : copies) c.dtype = common::DType::kBF16;
  all->insert(all->end(), copies.begin(), copies.end());
  return all;
}

}  // namespace

const std::vector<OpCase>& OpCases(common::DType dtype) {
  static const std::vector<OpCase>* f32 = F32Cases();
  static const std::vector<OpCase>* bf16 = Bf16Cases();
  static const std::vector<OpCase>* none = new std::vector<OpCase>;
  if (dtype == common::DType::kF32) return *f32;
  return dtype == common::DType::kBF16 ? *bf16 : *none;
}

}  // namespace pipetrain::testing

