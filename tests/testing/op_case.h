// The vocabulary of the backend conformance suite (backend_conformance_test.cc): an op
// case is one call of a backend op with its shapes and options, the dtype the backend
// computes it in, the tensors it reads and writes, and the call itself written once for
// any scalar type, so that the same text runs on a backend under test and on the
// plain-loop reference (double).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor.h"
#include "gtest/gtest.h"
#include "stage_server/compute/backend.h"

namespace pipetrain::testing {

enum class Role {
  kInput,    // random, read by the op
  kIds,      // random ids in [0, vocab), or the given ones
  kDerived,  // an input computed from the others by the case's `prepare`, in double
  kOutput,   // NaN before the op, so an element it fails to write shows
  kInOut,    // random before the op (accumulated into, or updated in place)
  kResult,   // a double the op returns on the host
};

struct TensorSpec {
  std::string name = {};
  Role role = Role::kInput;
  size_t size = 1;
  double scale = 1, offset = 0;  // kInput, kInOut: offset + scale * N(0, 1)
  int vocab = 0;                 // kIds
  std::vector<int32_t> ids = {}; // kIds: these instead of random ones
  bool compared = false;         // held to the reference after the op
};

inline TensorSpec In(std::string name, size_t size, double scale = 1, double offset = 0) {
  return {.name = std::move(name), .role = Role::kInput, .size = size, .scale = scale,
          .offset = offset};
}
inline TensorSpec Ids(std::string name, size_t size, int vocab) {
  return {.name = std::move(name), .role = Role::kIds, .size = size, .vocab = vocab};
}
inline TensorSpec GivenIds(std::string name, std::vector<int32_t> ids) {
  const size_t size = ids.size();
  return {.name = std::move(name), .role = Role::kIds, .size = size, .ids = std::move(ids)};
}
inline TensorSpec Derived(std::string name, size_t size) {
  return {.name = std::move(name), .role = Role::kDerived, .size = size};
}
inline TensorSpec Out(std::string name, size_t size) {
  return {.name = std::move(name), .role = Role::kOutput, .size = size, .compared = true};
}
inline TensorSpec InOut(std::string name, size_t size, double scale = 1, double offset = 0) {
  return {.name = std::move(name), .role = Role::kInOut, .size = size, .scale = scale,
          .offset = offset, .compared = true};
}
inline TensorSpec Result(std::string name) {
  return {.name = std::move(name), .role = Role::kResult, .compared = true};
}
// Not compared: where the reference is exact and any rounding of a backend is noise
// relative to it (the output of a LayerNorm over one column is its bias).
inline TensorSpec Unchecked(TensorSpec t) {
  t.compared = false;
  return t;
}
inline TensorSpec Checked(TensorSpec t) {
  t.compared = true;
  return t;
}

// The tensors of one case as one side sees them: pointers into that side's memory
// (device memory for a cuda backend), by name. Missing names fail the test and give
// nullptr, which every backend rejects.
template <typename Real>
class Tensors {
 public:
  Real* operator[](const std::string& name) const { return Find(reals_, name); }
  const int32_t* ids(const std::string& name) const { return Find(ids_, name); }
  double& result(const std::string& name) { return results_[name]; }
  // A scalar argument as both sides get it: rounded to float first, so that the
  // reference computes on exactly the values the float backend sees.
  static Real Scalar(double v) { return static_cast<Real>(static_cast<float>(v)); }

  void SetReal(const std::string& name, Real* p) { reals_[name] = p; }
  void SetIds(const std::string& name, int32_t* p) { ids_[name] = p; }
  double get_result(const std::string& name) const {
    auto it = results_.find(name);
    return it == results_.end() ? 0 : it->second;
  }

 private:
  template <typename P>
  static P* Find(const std::map<std::string, P*>& m, const std::string& name) {
    auto it = m.find(name);
    EXPECT_NE(it, m.end()) << "the case has no tensor " << name;
    return it == m.end() ? nullptr : it->second;
  }

  std::map<std::string, Real*> reals_;
  std::map<std::string, int32_t*> ids_;
  std::map<std::string, double> results_;
};

template <typename Real>
using OpFn = std::function<absl::Status(compute::BackendT<Real>&, Tensors<Real>&)>;

// One op call for both sides: the backend under test, with tensors of the case's dtype
// (F32: float), and the double reference. Built from one generic lambda by Call.
struct OpBody {
  OpFn<float> on_backend;
  OpFn<double> on_reference;
};
template <typename Fn>
OpBody Call(Fn fn) {
  return {fn, fn};
}

struct OpCase {
  std::string op = {};     // "Matmul"
  std::string shape = {};  // sizes and options: "m=7 n=5 k=9 ta=1 tb=0 beta=0.5"
  bool tf32 = false;  // matrix products in TF32: a cuda option, run on cuda only
  std::vector<TensorSpec> tensors = {};
  std::optional<OpFn<double>> prepare = {};  // fills the kDerived tensors
  OpBody run = {};
  // Compared for equality with the reference, not closeness (a result that is exactly
  // zero, where a relative error means nothing).
  bool exact = false;
  // Pairs of outputs the backend must make bitwise equal (in place and out of place).
  std::vector<std::pair<std::string, std::string>> identical = {};
  // What the backend computes the case in: its tensors' dtype, and the tolerance's.
  common::DType dtype = common::DType::kF32;
};

// A call every backend must reject with InvalidArgument. The message names the backend,
// the op and `message`.
struct BadCase {
  std::string op;    // "Add"
  std::string what;  // "n < 0"
  std::vector<TensorSpec> tensors;
  OpFn<float> run;
  std::string message;
};

// The tables (op_cases.cc, bad_op_cases.cc): the cases of one dtype (each backend runs
// those of every dtype it computes in; F32 only today), and the bad calls.
const std::vector<OpCase>& OpCases(common::DType dtype);
const std::vector<BadCase>& AllBadCases();

// Llama's rows of both tables (llama_op_cases.cc), which the two tables take in.
void AddLlamaOpCases(std::vector<OpCase>& cases);
void AddLlamaBadCases(std::vector<BadCase>& cases);

}  // namespace pipetrain::testing
