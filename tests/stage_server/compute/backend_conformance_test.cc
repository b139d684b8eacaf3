// The conformance suite of the compute backends, in the manner of ggml's
// test-backend-ops: every case of one table (testing/op_cases.cc) runs on random inputs
// on every backend this machine has (the plain-loop `host` backend, `cpu`, and `cuda`
// where a GPU is present), in every dtype the backend computes in (F32, and BF16 products
// on all but the OpenBLAS engine), and is held to the plain-loop reference run in double
// on the same inputs, by one tolerance rule per dtype (testing/backend_testing.h). Then
// every backend must reject the calls of the bad-argument table with InvalidArgument.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_probe.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/compute/host_backend.h"
#include "stage_server/compute/reference_ops.h"
#include "tests/testing/backend_testing.h"
#include "tests/testing/op_case.h"

namespace pipetrain::testing {
namespace {

using compute::Backend;
using ::testing::HasSubstr;

// ---- Backends ---------------------------------------------------------------------------

// kCpu is the cpu backend as stages run it (oneDNN products); kCpuOpenBlas the same
// backend on its OpenBLAS baseline engine, which the compute bench measures against.
enum class Kind { kHost, kCpu, kCpuOpenBlas, kCuda };
constexpr Kind kKinds[] = {Kind::kHost, Kind::kCpu, Kind::kCpuOpenBlas, Kind::kCuda};

std::string KindName(Kind kind) {
  switch (kind) {
    case Kind::kHost: return "host";
    case Kind::kCpu: return "cpu";
    case Kind::kCpuOpenBlas: return "cpu_openblas";
    case Kind::kCuda: return "cuda";
  }
  return "?";
}

// One backend of each kind (and TF32 setting) for the whole run: creating a cuda backend
// costs a cuBLAS handle. They are never destroyed, so that none outlives the CUDA
// runtime at exit. nullptr with a skip message where the machine has none.
Backend* GetBackend(Kind kind, bool tf32, std::string* skip) {
  static auto* backends = new std::map<std::pair<Kind, bool>, std::unique_ptr<Backend>>;
  std::unique_ptr<Backend>& slot = (*backends)[{kind, tf32}];
  if (slot != nullptr) return slot.get();
  switch (kind) {
    case Kind::kHost:
      slot = std::make_unique<compute::HostBackend>();
      break;
    case Kind::kCpu:
    case Kind::kCpuOpenBlas: {
      auto cpu = compute::CpuBackend::Create(1, kind == Kind::kCpu
                                                    ? compute::CpuBackend::ProductEngine::kOneDnn
                                                    : compute::CpuBackend::ProductEngine::kOpenBlas);
      EXPECT_THAT(cpu, IsOk());
      if (cpu.ok()) slot = std::move(*cpu);
      break;
    }
    case Kind::kCuda: {
      if (!common::HasCudaDevice()) {
        *skip = absl::StrCat("no usable GPU: ", common::ProbeCuda().reason);
        return nullptr;
      }
      // check_every_op: a fault is reported by the op that caused it.
      auto cuda = compute::CreateCudaBackend(0, {.tf32 = tf32, .check_every_op = true});
      EXPECT_THAT(cuda, IsOk());
      if (cuda.ok()) slot = std::move(*cuda);
      break;
    }
  }
  return slot.get();
}

// The dtypes each backend computes in: the op cases it runs are those of these dtypes.
// bf16 is the precision of the products' operands (Backend::SetProductOperands); the
// OpenBLAS engine has no bf16 product. cuda's bf16 rows run on its fp32 backend (TF32
// is fp32's option, and the bf16 table has no TF32 rows).
std::vector<common::DType> DTypesOf(Kind kind) {
  if (kind == Kind::kCpuOpenBlas) return {common::DType::kF32};
  return {common::DType::kF32, common::DType::kBF16};
}

// The rule of the case's dtype: fp32's, or the looser TF32 one for cases whose matrix
// products run in TF32. A dtype without a rule fails the case.
double Tolerance(const OpCase& c) {
  if (c.dtype == common::DType::kF32) return c.tf32 ? kTf32Tolerance : kFp32Tolerance;
  if (c.dtype == common::DType::kBF16) {
    // Only attention rounds operands it computed itself (backend_testing.h).
    return absl::StartsWith(c.op, "Attention") ? kBf16Tolerance : kFp32Tolerance;
  }
  ADD_FAILURE() << "no tolerance for dtype " << common::DTypeName(c.dtype);
  return 0;
}

// ---- Host values of a case --------------------------------------------------------------

struct HostValues {
  std::map<std::string, std::vector<float>> reals;  // as the float backend gets them
  std::map<std::string, std::vector<int32_t>> ids;
};

HostValues MakeValues(const std::vector<TensorSpec>& specs, uint64_t seed) {
  HostValues v;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    const uint64_t stream = seed * 64 + i;
    switch (s.role) {
      case Role::kIds:
        v.ids[s.name] = s.ids.empty() ? RandomIds(s.size, s.vocab, stream) : s.ids;
        break;
      case Role::kInput:
      case Role::kInOut:
        v.reals[s.name] = RandomNormal(s.size, stream, s.scale, s.offset);
        break;
      case Role::kDerived:
        v.reals[s.name] = std::vector<float>(s.size, 0.0f);
        break;
      case Role::kOutput:
        v.reals[s.name] = std::vector<float>(s.size, std::numeric_limits<float>::quiet_NaN());
        break;
      case Role::kResult:
        break;
    }
  }
  return v;
}

// The same values in double on the host, and the Tensors that point at them.
struct DoubleValues {
  std::map<std::string, std::vector<double>> reals;
  std::map<std::string, std::vector<int32_t>> ids;
  Tensors<double> tensors;
};

std::unique_ptr<DoubleValues> InDouble(const HostValues& v) {
  auto d = std::make_unique<DoubleValues>();
  for (const auto& [name, values] : v.reals) d->reals[name] = ToDouble(values);
  d->ids = v.ids;
  for (auto& [name, values] : d->reals) d->tensors.SetReal(name, values.data());
  for (auto& [name, values] : d->ids) d->tensors.SetIds(name, values.data());
  return d;
}

// Uploads every tensor to `tensors`' backend.
Tensors<float> Upload(HostValues& v, BackendTensors& tensors) {
  Tensors<float> t;
  for (auto& [name, values] : v.reals) t.SetReal(name, tensors.Upload(values));
  for (auto& [name, values] : v.ids) t.SetIds(name, tensors.Upload(values));
  return t;
}

// ---- Every case on every backend --------------------------------------------------------
// One test per (backend, op): each runs every row of the table for that op, so that a
// ctest run starts one process per op rather than per row; a failure names its row.

// "cpu_Matmul_tf32": gtest names are letters, digits and '_'.
std::string TestName(Kind kind, const std::string& op, const std::string& variant) {
  const std::string name = absl::StrCat(KindName(kind), " ", op, " ", variant);
  std::string out;
  for (char ch : name) {
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      out += ch;
    } else if (ch == '<') {
      out += (out.empty() || out.back() == '_') ? "lt_" : "_lt_";
    } else if (ch == '-') {
      out += "minus";
    } else if ((ch == ' ' || ch == '.' || ch == '_') && !out.empty() && out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

struct OpParam {
  Kind kind;
  common::DType dtype;
  std::string op;
  bool tf32;                   // the rows in TF32 (cuda only), or the others
  std::vector<size_t> rows;    // into OpCases(dtype)
};

std::vector<OpParam> OpParams() {
  std::vector<OpParam> params;
  for (Kind kind : kKinds) {
    for (common::DType dtype : DTypesOf(kind)) {
      for (bool tf32 : {false, true}) {
        if (tf32 && kind != Kind::kCuda) continue;  // cuda's option
        for (size_t i = 0; i < OpCases(dtype).size(); ++i) {
          const OpCase& c = OpCases(dtype)[i];
          if (c.tf32 != tf32) continue;
          auto it = std::find_if(params.begin(), params.end(), [&](const OpParam& p) {
            return p.kind == kind && p.dtype == dtype && p.tf32 == tf32 && p.op == c.op;
          });
          if (it == params.end()) it = params.insert(params.end(), {kind, dtype, c.op, tf32, {}});
          it->rows.push_back(i);
        }
      }
    }
  }
  return params;
}

void PrintTo(const OpParam& p, std::ostream* os) {
  *os << p.op << " in " << common::DTypeName(p.dtype) << (p.tf32 ? " (TF32 products)" : "")
      << " on " << KindName(p.kind) << ", " << p.rows.size() << " rows";
}

// The test's name: the dtype is left out for F32, as the names were before other dtypes.
std::string ParamName(const OpParam& p) {
  std::string variant = p.dtype == common::DType::kF32 ? "" : common::DTypeName(p.dtype);
  if (p.tf32) absl::StrAppend(&variant, variant.empty() ? "" : " ", "tf32");
  return TestName(p.kind, p.op, variant);
}

// Row `index` of the dtype's table on `be`, against the reference.
void CheckRow(common::DType dtype, size_t index, Kind kind, Backend* be) {
  const OpCase& c = OpCases(dtype)[index];
  const std::string what =
      absl::StrCat(c.op, "(", c.shape, c.tf32 ? " tf32" : "", ") in ",
                   common::DTypeName(c.dtype), " on ", KindName(kind));
  SCOPED_TRACE(what);

  // Inputs in float, the derived ones computed from them in double and rounded, so that
  // both sides compute from exactly the same values.
  HostValues values = MakeValues(c.tensors, index + 1);
  if (c.prepare.has_value()) {
    std::unique_ptr<DoubleValues> d = InDouble(values);
    compute::HostBackendDouble host;
    ASSERT_THAT((*c.prepare)(host, d->tensors), IsOk()) << "prepare";
    for (const TensorSpec& s : c.tensors) {
      if (s.role == Role::kDerived) values.reals[s.name] = ToFloat(d->reals[s.name]);
    }
  }

  compute::HostBackendDouble reference;
  ASSERT_THAT(reference.SetProductOperands(c.dtype), IsOk());
  std::unique_ptr<DoubleValues> want = InDouble(values);
  ASSERT_THAT(c.run.on_reference(reference, want->tensors), IsOk()) << "reference";

  BackendTensors buffers(be);
  Tensors<float> got = Upload(values, buffers);
  ASSERT_THAT(be->SetProductOperands(c.dtype), IsOk());
  const absl::Status ran = c.run.on_backend(*be, got);
  ASSERT_THAT(be->SetProductOperands(common::DType::kF32), IsOk());  // shared backends
  ASSERT_THAT(ran, IsOk());

  std::map<std::string, std::vector<float>> outputs;
  for (const TensorSpec& s : c.tensors) {
    if (!s.compared) continue;
    if (s.role == Role::kResult) {
      const std::vector<double> result = {got.get_result(s.name)};
      const std::vector<double> expected = {want->tensors.get_result(s.name)};
      if (c.exact) {
        EXPECT_EQ(result, expected) << what << ": " << s.name;
      } else {
        EXPECT_TRUE(IsClose(result, expected, kFp64Tolerance)) << what << ": " << s.name;
      }
      continue;
    }
    std::vector<float> out = buffers.Download(got[s.name], s.size);
    const std::vector<double>& expected = want->reals[s.name];
    if (c.exact) {
      EXPECT_EQ(out, ToFloat(expected)) << what << ": " << s.name;
    } else {
      EXPECT_TRUE(IsClose(out, expected, Tolerance(c), kind != Kind::kCuda))
          << what << ": " << s.name;
    }
    outputs[s.name] = std::move(out);
  }
  for (const auto& [a, b] : c.identical) {
    EXPECT_EQ(outputs[a], outputs[b]) << what << ": " << a << " and " << b << " differ";
  }
}

class BackendConformanceTest : public ::testing::TestWithParam<OpParam> {};

TEST_P(BackendConformanceTest, MatchesReference) {
  std::string skip;
  Backend* be = GetBackend(GetParam().kind, GetParam().tf32, &skip);
  if (be == nullptr && !skip.empty()) GTEST_SKIP() << skip;
  ASSERT_NE(be, nullptr);
  for (size_t row : GetParam().rows) CheckRow(GetParam().dtype, row, GetParam().kind, be);
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendConformanceTest, ::testing::ValuesIn(OpParams()),
                         [](const ::testing::TestParamInfo<OpParam>& info) {
                           return ParamName(info.param);
                         });

// ---- Bad arguments on every backend -----------------------------------------------------

struct BadParam {
  Kind kind;
  std::string op;
  std::vector<size_t> rows;  // into AllBadCases()
};

std::vector<BadParam> BadParams() {
  std::vector<BadParam> params;
  for (Kind kind : kKinds) {
    for (size_t i = 0; i < AllBadCases().size(); ++i) {
      const BadCase& c = AllBadCases()[i];
      auto it = std::find_if(params.begin(), params.end(), [&](const BadParam& p) {
        return p.kind == kind && p.op == c.op;
      });
      if (it == params.end()) it = params.insert(params.end(), {kind, c.op, {}});
      it->rows.push_back(i);
    }
  }
  return params;
}

void PrintTo(const BadParam& p, std::ostream* os) {
  *os << p.op << " on " << KindName(p.kind) << ", " << p.rows.size() << " bad calls";
}

class BackendArgumentTest : public ::testing::TestWithParam<BadParam> {};

TEST_P(BackendArgumentTest, RejectsWithInvalidArgument) {
  std::string skip;
  Backend* be = GetBackend(GetParam().kind, /*tf32=*/false, &skip);
  if (be == nullptr && !skip.empty()) GTEST_SKIP() << skip;
  ASSERT_NE(be, nullptr);
  for (size_t row : GetParam().rows) {
    const BadCase& c = AllBadCases()[row];
    HostValues values = MakeValues(c.tensors, 1000 + row);
    BackendTensors buffers(be);
    Tensors<float> t = Upload(values, buffers);
    // The message names the backend and the op, and says what is wrong.
    EXPECT_THAT(c.run(*be, t),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(HasSubstr(absl::StrCat(be->Name(), " backend: ",
                                                                 c.op, "(")),
                                          HasSubstr(c.message))))
        << c.op << " with " << c.what << " on " << be->Name();
    // The backend stays usable after the error.
    EXPECT_THAT(be->Synchronize(), IsOk()) << c.op << " with " << c.what;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendArgumentTest, ::testing::ValuesIn(BadParams()),
                         [](const ::testing::TestParamInfo<BadParam>& info) {
                           return TestName(info.param.kind, info.param.op, "");
                         });

// ---- The reference itself ---------------------------------------------------------------
// Everything above trusts it, so it is held to properties of its own: LayerNorm output
// rows have mean 0 and variance ~1 with unit weight; softmax rows sum to 1; a
// hand-computed GELU value; the loss of a hand-computed softmax.
TEST(ReferenceOpsTest, Properties) {
  namespace reference = compute::reference;
  const int rows = 3, C = 16;
  auto x = ToDouble(RandomNormal(rows * C, 80, 5.0));
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
  reference::CrossEntropyForward<double>(1, 3, logits.data(), &target, probs.data(),
                                         loss.data());
  EXPECT_NEAR(probs[0] + probs[1] + probs[2], 1, 1e-15);
  EXPECT_NEAR(loss[0], std::log(std::exp(1) + std::exp(2) + std::exp(3)) - 3, 1e-12);
}

}  // namespace
}  // namespace pipetrain::testing
