// The bad-argument table of the backend conformance suite: at least one call per check of
// op_checks.cc, so that removing any check fails a test, plus the ids outside the
// vocabulary that the backends find in the data.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/op_case.h"

// Everything else about each call is valid and its buffers are real, so only the check
// stands between the call and a wrong result.

namespace pipetrain::testing {
namespace {

using compute::Backend;
using T = Tensors<float>;

BadCase Bad(std::string op, std::string what, std::vector<TensorSpec> tensors,
            OpFn<float> run, std::string message) {
  return {std::move(op), std::move(what), std::move(tensors), std::move(run),
          std::move(message)};
}

void AddElementwiseBadCases(std::vector<BadCase>& b) {
  const std::vector<TensorSpec> mat = {In("a", 64), In("b", 64), Out("c", 64)};
  b.push_back(Bad("Matmul", "m < 0", mat, [](Backend& be, T& t) {
    return be.Matmul(false, false, -1, 4, 2, 1, t["a"], t["b"], 0, t["c"]);
  }, "m = -1 is negative"));
  b.push_back(Bad("Matmul", "c null", mat, [](Backend& be, T& t) {
    return be.Matmul(false, false, 3, 4, 2, 1, t["a"], t["b"], 0, nullptr);
  }, "c is null"));
  b.push_back(Bad("Matmul", "a null with k > 0", mat, [](Backend& be, T& t) {
    return be.Matmul(false, true, 3, 4, 2, 1, nullptr, t["b"], 0, t["c"]);
  }, "a is null"));
  b.push_back(Bad("Matmul", "b null with k > 0", mat, [](Backend& be, T& t) {
    return be.Matmul(true, false, 3, 4, 2, 1, t["a"], nullptr, 0, t["c"]);
  }, "b is null"));
  // The weight's product copy: checked before the precision, so in fp32 too.
  b.push_back(Bad("MatmulByCopy", "k < 0", mat, [](Backend& be, T& t) {
    return be.MatmulByCopy(false, false, 3, 4, -2, 1, compute::Values<float>(t["a"]),
                           compute::CopyOf<float>(t["b"]), 0, t["c"]);
  }, "k = -2 is negative"));
  b.push_back(Bad("MatmulByCopy", "b null with k > 0", mat, [](Backend& be, T& t) {
    return be.MatmulByCopy(false, true, 3, 4, 2, 1, compute::Values<float>(t["a"]),
                           compute::CopyOf<float>(nullptr), 0, t["c"]);
  }, "b is null"));
  b.push_back(Bad("MatmulByCopy", "a null with k > 0", mat, [](Backend& be, T& t) {
    return be.MatmulByCopy(true, false, 3, 4, 2, 1, compute::CopyOf<float>(nullptr),
                           compute::Values<float>(t["b"]), 0, t["c"]);
  }, "a is null"));
  b.push_back(Bad("MakeProductCopy", "n < 0", mat, [](Backend& be, T& t) {
    return be.MakeProductCopy(-3, t["a"], t["b"]);
  }, "n = -3 is negative"));
  b.push_back(Bad("MakeProductCopy", "copy null", mat, [](Backend& be, T& t) {
    return be.MakeProductCopy(8, t["a"], nullptr);
  }, "copy is null"));
  const std::vector<TensorSpec> vec = {In("a", 16), In("b", 16), Out("out", 16)};
  b.push_back(Bad("Add", "n < 0", vec, [](Backend& be, T& t) {
    return be.Add(-1, t["a"], t["b"], t["out"]);
  }, "n = -1 is negative"));
  b.push_back(Bad("Add", "out null", vec, [](Backend& be, T& t) {
    return be.Add(16, t["a"], t["b"], nullptr);
  }, "out is null"));
  b.push_back(Bad("Axpy", "n < 0", vec, [](Backend& be, T& t) {
    return be.Axpy(-2, 0.5f, t["a"], t["out"]);
  }, "n = -2 is negative"));
  b.push_back(Bad("Axpy", "x null", vec, [](Backend& be, T& t) {
    return be.Axpy(16, 0.5f, nullptr, t["out"]);
  }, "x is null"));
  b.push_back(Bad("Scale", "n < 0", vec, [](Backend& be, T& t) {
    return be.Scale(-1, 2.0f, t["a"]);
  }, "n = -1 is negative"));
  b.push_back(Bad("Scale", "x null", vec, [](Backend& be, T&) {
    return be.Scale(16, 2.0f, nullptr);
  }, "x is null"));
  b.push_back(Bad("AddBias", "rows < 0", vec, [](Backend& be, T& t) {
    return be.AddBias(-4, 4, t["b"], t["a"]);
  }, "rows = -4 is negative"));
  b.push_back(Bad("AddBias", "bias null", vec, [](Backend& be, T& t) {
    return be.AddBias(4, 4, nullptr, t["a"]);
  }, "bias is null"));
  b.push_back(Bad("BiasGrad", "cols < 0", vec, [](Backend& be, T& t) {
    return be.BiasGrad(4, -4, t["a"], t["b"]);
  }, "cols = -4 is negative"));
  b.push_back(Bad("BiasGrad", "dbias null", vec, [](Backend& be, T& t) {
    return be.BiasGrad(4, 4, t["a"], nullptr);
  }, "dbias is null"));
  b.push_back(Bad("SumOfSquares", "n < 0", vec, [](Backend& be, T& t) {
    return be.SumOfSquares(-1, t["a"]).status();
  }, "n = -1 is negative"));
  b.push_back(Bad("SumOfSquares", "x null", vec, [](Backend& be, T&) {
    return be.SumOfSquares(16, nullptr).status();
  }, "x is null"));
  b.push_back(Bad("GeluForward", "n < 0", vec, [](Backend& be, T& t) {
    return be.GeluForward(-1, t["a"], t["out"]);
  }, "n = -1 is negative"));
  b.push_back(Bad("GeluForward", "out null", vec, [](Backend& be, T& t) {
    return be.GeluForward(16, t["a"], nullptr);
  }, "out is null"));
  b.push_back(Bad("GeluBackward", "n < 0", vec, [](Backend& be, T& t) {
    return be.GeluBackward(-1, t["a"], t["b"], t["out"]);
  }, "n = -1 is negative"));
  b.push_back(Bad("GeluBackward", "dout null", vec, [](Backend& be, T& t) {
    return be.GeluBackward(16, t["a"], nullptr, t["out"]);
  }, "dout is null"));
  // Copy2D: 4 rows of 4 from a (4, 4) source into a (4, 4) destination.
  b.push_back(Bad("Copy2D", "rows < 0", vec, [](Backend& be, T& t) {
    return be.Copy2D(-4, 4, t["a"], 4, t["out"], 4);
  }, "rows = -4 is negative"));
  b.push_back(Bad("Copy2D", "src_stride < cols", vec, [](Backend& be, T& t) {
    return be.Copy2D(4, 4, t["a"], 3, t["out"], 4);
  }, "src_stride is less than cols"));
  b.push_back(Bad("Copy2D", "dst_stride < cols", vec, [](Backend& be, T& t) {
    return be.Copy2D(4, 4, t["a"], 4, t["out"], 2);
  }, "dst_stride is less than cols"));
  b.push_back(Bad("Copy2D", "src null", vec, [](Backend& be, T& t) {
    return be.Copy2D(4, 4, nullptr, 4, t["out"], 4);
  }, "src is null"));
  b.push_back(Bad("Copy2D", "dst null", vec, [](Backend& be, T& t) {
    return be.Copy2D(4, 4, t["a"], 4, nullptr, 4);
  }, "dst is null"));
  b.push_back(Bad("Softmax", "cols < 0", vec, [](Backend& be, T& t) {
    return be.Softmax(4, -4, t["a"], t["out"]);
  }, "cols = -4 is negative"));
  b.push_back(Bad("Softmax", "x null", vec, [](Backend& be, T& t) {
    return be.Softmax(4, 4, nullptr, t["out"]);
  }, "x is null"));
  b.push_back(Bad("Softmax", "out null", vec, [](Backend& be, T& t) {
    return be.Softmax(4, 4, t["a"], nullptr);
  }, "out is null"));
  const std::vector<TensorSpec> adam = {InOut("p", 8), In("g", 8), InOut("m", 8, 0),
                                        InOut("v", 8, 0)};
  b.push_back(Bad("AdamW", "step 0", adam, [](Backend& be, T& t) {
    return be.AdamW(8, t["p"], t["g"], t["m"], t["v"], 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0);
  }, "step counts from 1"));
  b.push_back(Bad("AdamW", "n < 0", adam, [](Backend& be, T& t) {
    return be.AdamW(-8, t["p"], t["g"], t["m"], t["v"], 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
  }, "n = -8 is negative"));
  b.push_back(Bad("AdamW", "grad null", adam, [](Backend& be, T& t) {
    return be.AdamW(8, t["p"], nullptr, t["m"], t["v"], 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
  }, "grad is null"));
}

void AddLayerBadCases(std::vector<BadCase>& b) {
  // Embedding: B = 2, T = 3, C = 4, V = 5; the token at position 4 is outside [0, 5).
  for (int32_t bad : {5, -1}) {
    const std::vector<TensorSpec> emb = {GivenIds("tokens", {0, 1, 2, 3, bad, 4}),
                                         In("wte", 20), In("wpe", 12), Out("out", 24)};
    b.push_back(Bad("EmbeddingForward", absl::StrCat("token ", bad), emb,
                    [](Backend& be, T& t) {
                      return be.EmbeddingForward(2, 3, 4, 5, t.ids("tokens"), t["wte"],
                                                 t["wpe"], t["out"]);
                    },
                    absl::StrCat("tokens[4] = ", bad, " is outside")));
    b.push_back(Bad("EmbeddingBackward", absl::StrCat("token ", bad), emb,
                    [](Backend& be, T& t) {
                      return be.EmbeddingBackward(2, 3, 4, 5, t.ids("tokens"), t["out"],
                                                  t["wte"], t["wpe"]);
                    },
                    absl::StrCat("tokens[4] = ", bad, " is outside")));
  }
  const std::vector<TensorSpec> emb = {Ids("tokens", 6, 5), In("wte", 20), In("wpe", 12),
                                       Out("out", 24)};
  b.push_back(Bad("EmbeddingForward", "C < 0", emb, [](Backend& be, T& t) {
    return be.EmbeddingForward(2, 3, -4, 5, t.ids("tokens"), t["wte"], t["wpe"], t["out"]);
  }, "C = -4 is negative"));
  b.push_back(Bad("EmbeddingForward", "wte null", emb, [](Backend& be, T& t) {
    return be.EmbeddingForward(2, 3, 4, 5, t.ids("tokens"), nullptr, t["wpe"], t["out"]);
  }, "wte is null"));
  b.push_back(Bad("EmbeddingBackward", "B < 0", emb, [](Backend& be, T& t) {
    return be.EmbeddingBackward(-2, 3, 4, 5, t.ids("tokens"), t["out"], t["wte"], t["wpe"]);
  }, "B = -2 is negative"));
  b.push_back(Bad("EmbeddingBackward", "dout null", emb, [](Backend& be, T& t) {
    return be.EmbeddingBackward(2, 3, 4, 5, t.ids("tokens"), nullptr, t["wte"], t["wpe"]);
  }, "dout is null"));
  // LayerNorm: rows = 3, C = 4.
  const std::vector<TensorSpec> ln = {In("x", 12), In("w", 4), In("b", 4), Out("out", 12),
                                      InOut("mean", 3), InOut("rstd", 3, 0.1, 1)};
  b.push_back(Bad("LayerNormForward", "rows < 0", ln, [](Backend& be, T& t) {
    return be.LayerNormForward(-3, 4, t["x"], t["w"], t["b"], t["out"], t["mean"], t["rstd"]);
  }, "rows = -3 is negative"));
  b.push_back(Bad("LayerNormForward", "mean null", ln, [](Backend& be, T& t) {
    return be.LayerNormForward(3, 4, t["x"], t["w"], t["b"], t["out"], nullptr, t["rstd"]);
  }, "mean is null"));
  b.push_back(Bad("LayerNormBackward", "C < 0", ln, [](Backend& be, T& t) {
    return be.LayerNormBackward(3, -4, t["x"], t["x"], t["w"], t["mean"], t["rstd"],
                                t["out"], t["w"], t["b"]);
  }, "C = -4 is negative"));
  b.push_back(Bad("LayerNormBackward", "weight null with dx", ln, [](Backend& be, T& t) {
    return be.LayerNormBackward(3, 4, t["x"], t["x"], nullptr, t["mean"], t["rstd"],
                                t["out"], nullptr, nullptr);
  }, "weight is null"));
  b.push_back(Bad("LayerNormBackward", "rstd null", ln, [](Backend& be, T& t) {
    return be.LayerNormBackward(3, 4, t["x"], t["x"], t["w"], t["mean"], nullptr, nullptr,
                                t["w"], t["b"]);
  }, "rstd is null"));
  // Attention: B = 1, T = 2, C = 6.
  const std::vector<TensorSpec> att = {In("qkv", 36), Out("out", 12), Out("probs", 36),
                                       Out("dqkv", 36)};
  for (int NH : {4, 0}) {  // 4 first: without the check it computes garbage, 0 crashes
    b.push_back(Bad("AttentionForward", absl::StrCat("NH=", NH), att, [NH](Backend& be, T& t) {
      return be.AttentionForward(1, 2, 6, NH, t["qkv"], t["out"], t["probs"]);
    }, "NH must be positive and divide C"));
    b.push_back(Bad("AttentionBackward", absl::StrCat("NH=", NH), att, [NH](Backend& be, T& t) {
      return be.AttentionBackward(1, 2, 6, NH, t["out"], t["qkv"], t["probs"], t["dqkv"]);
    }, "NH must be positive and divide C"));
  }
  b.push_back(Bad("AttentionForward", "T < 0", att, [](Backend& be, T& t) {
    return be.AttentionForward(1, -2, 6, 3, t["qkv"], t["out"], t["probs"]);
  }, "T = -2 is negative"));
  b.push_back(Bad("AttentionForward", "probs null", att, [](Backend& be, T& t) {
    return be.AttentionForward(1, 2, 6, 3, t["qkv"], t["out"], nullptr);
  }, "probs is null"));
  b.push_back(Bad("AttentionBackward", "B < 0", att, [](Backend& be, T& t) {
    return be.AttentionBackward(-1, 2, 6, 3, t["out"], t["qkv"], t["probs"], t["dqkv"]);
  }, "B = -1 is negative"));
  b.push_back(Bad("AttentionBackward", "dqkv null", att, [](Backend& be, T& t) {
    return be.AttentionBackward(1, 2, 6, 3, t["out"], t["qkv"], t["probs"], nullptr);
  }, "dqkv is null"));
  // Cross-entropy: rows = 4, V = 6; the target at position 2 is outside [0, 6).
  for (int32_t bad : {6, -1}) {
    const std::vector<TensorSpec> ce = {In("logits", 24), GivenIds("targets", {0, 5, bad, 1}),
                                        Out("probs", 24), Out("loss", 1)};
    const std::string message = absl::StrCat("targets[2] = ", bad, " is outside");
    b.push_back(Bad("CrossEntropyForward", absl::StrCat("target ", bad), ce,
                    [](Backend& be, T& t) {
                      return be.CrossEntropyForward(4, 6, t["logits"], t.ids("targets"),
                                                    t["probs"], t["loss"]);
                    },
                    message));
    b.push_back(Bad("CrossEntropyBackward", absl::StrCat("target ", bad), ce,
                    [](Backend& be, T& t) {
                      return be.CrossEntropyBackward(4, 6, t["logits"], t.ids("targets"),
                                                     1.0f, t["probs"]);
                    },
                    message));
  }
  const std::vector<TensorSpec> ce = {In("logits", 24), Ids("targets", 4, 6), Out("probs", 24),
                                      Out("loss", 1)};
  b.push_back(Bad("CrossEntropyForward", "rows 0", ce, [](Backend& be, T& t) {
    return be.CrossEntropyForward(0, 6, t["logits"], t.ids("targets"), t["probs"], t["loss"]);
  }, "the mean loss needs rows > 0 and V > 0"));
  b.push_back(Bad("CrossEntropyForward", "V < 0", ce, [](Backend& be, T& t) {
    return be.CrossEntropyForward(4, -6, t["logits"], t.ids("targets"), t["probs"], t["loss"]);
  }, "V = -6 is negative"));
  b.push_back(Bad("CrossEntropyForward", "loss null", ce, [](Backend& be, T& t) {
    return be.CrossEntropyForward(4, 6, t["logits"], t.ids("targets"), t["probs"], nullptr);
  }, "loss is null"));
  b.push_back(Bad("CrossEntropyBackward", "rows < 0", ce, [](Backend& be, T& t) {
    return be.CrossEntropyBackward(-4, 6, t["probs"], t.ids("targets"), 1.0f, t["logits"]);
  }, "rows = -4 is negative"));
  b.push_back(Bad("CrossEntropyBackward", "targets null", ce, [](Backend& be, T& t) {
    return be.CrossEntropyBackward(4, 6, t["probs"], nullptr, 1.0f, t["logits"]);
  }, "targets is null"));
}

}  // namespace

const std::vector<BadCase>& AllBadCases() {
  static const std::vector<BadCase>* cases = [] {
    auto* all = new std::vector<BadCase>;
    AddElementwiseBadCases(*all);
    AddLayerBadCases(*all);
    AddLlamaBadCases(*all);
    return all;
  }();
  return *cases;
}

}  // namespace pipetrain::testing
