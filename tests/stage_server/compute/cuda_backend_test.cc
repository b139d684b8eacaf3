// GPU tests (label `gpu`) of what is particular to the cuda backend: its caching
// allocator and device copies, host copies staged through pinned slots, a whole training
// step of a tiny GPT against the double-precision host backend (fp32, TF32 and bf16
// products), and the factory's errors. Its ops are held to the reference, shape by
// shape, by the conformance suite (backend_conformance_test.cc). Budgets are relative L2
// errors (backend_testing.h): fp32 1e-5, TF32 1e-3 per op; whole steps below. Every test
// that needs a GPU skips where none is usable.
#include "stage_server/compute/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_probe.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/compute/backend_buffer.h"
#include "stage_server/compute/host_backend.h"
#include "stage_server/compute/model_chunk.h"
#include "tests/testing/backend_testing.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::BackendTensors;
using ::pipetrain::testing::IsClose;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::kFp32Tolerance;
using ::pipetrain::testing::kTf32Tolerance;
using ::pipetrain::testing::NextSeed;
using ::pipetrain::testing::RandomIds;
using ::pipetrain::testing::RandomNormal;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

#define SKIP_WITHOUT_GPU()                                                       \
  do {                                                                           \
    if (!common::HasCudaDevice()) {                                              \
      GTEST_SKIP() << "no usable GPU: " << common::ProbeCuda().reason;           \
    }                                                                            \
  } while (false)

// A fixture holding a cuda backend and the device buffers a test uploads.
class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    // check_every_op: a fault is reported by the op that caused it.
    auto b = CreateCudaBackend(0, {.check_every_op = true});
    ASSERT_THAT(b, IsOk());
    gpu_ = std::move(*b);
    tensors_ = std::make_unique<BackendTensors>(gpu_.get());
  }

  std::unique_ptr<Backend> gpu_;
  // Destroyed before the backend it frees through.
  std::unique_ptr<BackendTensors> tensors_;
};

// ---- Memory -------------------------------------------------------------------------------

TEST_F(CudaBackendTest, MemoryRoundTripsZeroAndCopy) {
  EXPECT_EQ(gpu_->Name(), "cuda");
  auto null = gpu_->Allocate(0);
  ASSERT_THAT(null, IsOk());
  EXPECT_EQ(*null, nullptr);
  EXPECT_THAT(gpu_->Free(nullptr), IsOk());
  int foreign = 0;
  EXPECT_THAT(gpu_->Free(&foreign), StatusIs(absl::StatusCode::kInvalidArgument));
  // A freed block is cached and handed out again for the same size.
  auto first = gpu_->Allocate(1000);
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(gpu_->Free(*first), IsOk());
  EXPECT_THAT(gpu_->Free(*first), StatusIs(absl::StatusCode::kInvalidArgument));
  auto again = gpu_->Allocate(1000);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(*again, *first);
  ASSERT_THAT(gpu_->Free(*again), IsOk());

  const size_t n = 100003;
  std::vector<float> host = RandomNormal(n, NextSeed());
  float* a = tensors_->Upload(host);
  EXPECT_EQ(tensors_->Download(a, n), host);
  float* b = tensors_->Poisoned(n);
  ASSERT_THAT(gpu_->Copy(b, a, n * sizeof(float)), IsOk());
  EXPECT_EQ(tensors_->Download(b, n), host);
  ASSERT_THAT(gpu_->Zero(b, n * sizeof(float)), IsOk());
  EXPECT_EQ(tensors_->Download(b, n), std::vector<float>(n, 0.0f));
  EXPECT_THAT(gpu_->Synchronize(), IsOk());
}

// ---- Host copies (staged through pinned slots) --------------------------------------------

// n random bytes, never all zeros (a copy that wrote nothing into zeroed memory, or
// into a slot still holding a previous copy's bytes, must not pass).
std::vector<std::byte> RandomBytes(size_t n) {
  std::mt19937_64 rng(NextSeed());
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() % 255 + 1);
  return v;
}

// Both without check_every_op (copies to the device return before their last DMA, so
// the next copy must wait for its slots) and with it.
std::vector<std::unique_ptr<Backend>> CopyBackends() {
  std::vector<std::unique_ptr<Backend>> out;
  for (bool check : {false, true}) {
    auto b = CreateCudaBackend(0, {.check_every_op = check});
    EXPECT_THAT(b, IsOk());
    if (b.ok()) out.push_back(std::move(*b));
  }
  return out;
}

// Sizes around the 64 KiB direct-copy threshold and the 4 MiB slot, and many slots.
constexpr size_t kMiB = size_t{1} << 20;
const size_t kCopySizes[] = {1,        (64 << 10) - 1, 64 << 10, 4 * kMiB - 1,
                             4 * kMiB, 4 * kMiB + 1,   37 * kMiB};

TEST(CudaHostCopyTest, RoundTripsAtSlotBoundaries) {
  SKIP_WITHOUT_GPU();
  for (auto& be : CopyBackends()) {
    for (size_t bytes : kCopySizes) {
      const std::string what = absl::StrCat(bytes, " bytes");
      const std::vector<std::byte> src = RandomBytes(bytes);
      auto dev = BackendBuffer<float>::Allocate(be.get(), bytes);
      ASSERT_THAT(dev, IsOk()) << what;
      ASSERT_THAT(be->CopyFromHost(dev->raw(), src.data(), bytes), IsOk()) << what;
      // One byte in, so the host side is not aligned; the bytes around must stay.
      std::vector<std::byte> back(bytes + 2, std::byte{0});
      ASSERT_THAT(be->CopyToHost(back.data() + 1, dev->raw(), bytes), IsOk()) << what;
      EXPECT_TRUE(std::equal(src.begin(), src.end(), back.begin() + 1)) << what;
      EXPECT_EQ(back.front(), std::byte{0}) << what;
      EXPECT_EQ(back.back(), std::byte{0}) << what;
    }
  }
}

TEST(CudaHostCopyTest, BackToBackCopiesDoNotOverwriteEachOther) {
  SKIP_WITHOUT_GPU();
  for (auto& be : CopyBackends()) {
    // Uploads issued without a wait in between reuse the same slots, and each source is
    // overwritten as soon as its copy returns (the caller may reuse it at once).
    std::vector<std::vector<std::byte>> expected;
    std::vector<BackendBuffer<float>> devs;
    for (size_t bytes : {9 * kMiB + 7, 5 * kMiB, 300 * size_t{1024}, 13 * kMiB + 1}) {
      expected.push_back(RandomBytes(bytes));
      std::vector<std::byte> src = expected.back();
      auto dev = BackendBuffer<float>::Allocate(be.get(), bytes);
      ASSERT_THAT(dev, IsOk());
      ASSERT_THAT(be->CopyFromHost(dev->raw(), src.data(), bytes), IsOk());
      std::fill(src.begin(), src.end(), std::byte{0});
      devs.push_back(std::move(*dev));
    }
    for (size_t i = 0; i < devs.size(); ++i) {
      std::vector<std::byte> back(devs[i].bytes());
      ASSERT_THAT(be->CopyToHost(back.data(), devs[i].raw(), back.size()), IsOk());
      EXPECT_TRUE(back == expected[i]) << "buffer " << i << " of " << back.size() << " bytes";
    }
  }
}

TEST(CudaHostCopyTest, CopyFromHostPiecesWithRandomLayouts) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(NextSeed());
  for (auto& be : CopyBackends()) {
    for (size_t total : {size_t{1}, size_t{40000}, 4 * kMiB, 11 * kMiB + 333}) {
      for (int layout = 0; layout < 3; ++layout) {
        const std::string what = absl::StrCat(total, " bytes, layout ", layout);
        const std::vector<std::byte> src = RandomBytes(total);
        const std::span<const std::byte> all(src);
        // Pieces from empty to 1.5 slots, with empty ones at both ends.
        std::vector<std::span<const std::byte>> pieces = {{}};
        const size_t max_piece = layout == 0 ? 64 : layout == 1 ? 100000 : 6 * kMiB;
        for (size_t at = 0; at < total;) {
          const size_t n = std::min<size_t>(rng() % (max_piece + 1), total - at);
          pieces.push_back(all.subspan(at, n));
          at += n;
        }
        pieces.emplace_back();
        auto dev = BackendBuffer<float>::Allocate(be.get(), total);
        ASSERT_THAT(dev, IsOk()) << what;
        ASSERT_THAT(be->CopyFromHostPieces(dev->raw(), pieces), IsOk()) << what;
        std::vector<std::byte> back(total);
        ASSERT_THAT(be->CopyToHost(back.data(), dev->raw(), total), IsOk()) << what;
        EXPECT_TRUE(back == src) << what << " in " << pieces.size() << " pieces";
      }
    }
  }
}

// ---- A whole training step ----------------------------------------------------------------

// The L2 norm of got - want.
template <typename T>
double L2Distance(const std::vector<T>& got, const std::vector<double>& want) {
  double sum = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    sum += d * d;
  }
  return std::sqrt(sum);
}

// How far AdamW's first step may move the updated parameters apart, from the difference
// of the two sides' (clipped) gradients alone. The first step moves each weight by
// lr * g / (|g| + eps) (plus weight decay, the same on both sides): a function of g whose
// slope is eps / (|g| + eps)^2, at most 1 / eps. So two gradients that differ by dg
// give steps at most lr * |dg| / eps apart, element by element, and in L2. An element
// whose gradient is small against eps (a bias that is nearly zero in exact arithmetic)
// turns the products' rounding error (TF32's 1e-3 relative, on the whole tensor) into a
// visible share of its tiny step; this bound is what that arithmetic allows, with 25%
// for fp32's own rounding of the update.
double AdamFirstStepBound(const std::vector<float>& dev_grad, const std::vector<double>& ref_grad,
                          double dev_scale, double ref_scale, const OptimizerSettings& adam) {
  double sum = 0;
  for (size_t i = 0; i < ref_grad.size() && i < dev_grad.size(); ++i) {
    const double d = dev_scale * dev_grad[i] - ref_scale * ref_grad[i];
    sum += d * d;
  }
  return 1.25 * adam.lr / adam.eps * std::sqrt(sum);
}

// Two micro-batches through the whole tiny model (embedding, 2 blocks, head), gradients
// accumulated, clipped AdamW step: loss, every gradient and every updated parameter of
// the cuda backend against the same step in double on the host backend, both with the
// products' operands in `products`. The first micro-batch runs the fused backward, the
// second the split one (backward-input, then backward-weight: the ops' nullptr
// outputs), as zero-bubble schedules do.
void CheckTrainingStep(Backend* gpu, double budget, ChunkOptions gpu_options,
                       common::DType products = common::DType::kF32) {
  model::TransformerConfig config;
  config.vocab_size = 67;
  config.seq_len = 13;
  config.d_model = 24;
  config.n_heads = 3;
  config.n_layers = 2;
  const int B = 3, M = 2, L = config.num_pipeline_layers();
  const uint64_t seed = 1234;
  std::vector<std::vector<int32_t>> tokens, targets;
  for (int mb = 0; mb < M; ++mb) {
    tokens.push_back(RandomIds(size_t(B) * config.seq_len, config.vocab_size, NextSeed()));
    targets.push_back(RandomIds(size_t(B) * config.seq_len, config.vocab_size, NextSeed()));
  }
  OptimizerSettings adam;
  adam.lr = 1e-2f;
  adam.weight_decay = 0.1f;
  adam.grad_clip_norm = 0.5f;  // small enough to clip
  // AdamW's first step moves each weight by about lr * g / (|g| + eps): for gradients
  // that are zero in exact arithmetic (the key part of c_attn.bias: softmax ignores a
  // shift of every key) fp32 rounding noise of 1e-9 would become a full step with the
  // default eps. A larger eps keeps the comparison about the arithmetic, not that noise.
  adam.eps = 1e-4f;

  HostBackendDouble host;
  ASSERT_THAT(host.SetProductOperands(products), IsOk());
  ASSERT_THAT(gpu->SetProductOperands(products), IsOk());
  auto ref = ModelChunkT<double>::Create(config, 0, L, &host);
  ASSERT_THAT(ref, IsOk());
  auto dev = ModelChunk::Create(config, 0, L, gpu, gpu_options);
  ASSERT_THAT(dev, IsOk());
  ASSERT_THAT((*ref)->Initialize(seed), IsOk());
  ASSERT_THAT((*dev)->Initialize(seed), IsOk());

  std::vector<double> ref_loss(M);
  std::vector<float> dev_loss(M);
  for (int mb = 0; mb < M; ++mb) {
    // Inputs in each backend's memory (the host backend's memory is host memory).
    const size_t nt = tokens[mb].size();
    auto ht = BackendBuffer<double>::Allocate(&host, nt * sizeof(int32_t));
    auto hy = BackendBuffer<double>::Allocate(&host, nt * sizeof(int32_t));
    auto hl = BackendBuffer<double>::Allocate(&host, sizeof(double));
    auto dt = BackendBuffer<float>::Allocate(gpu, nt * sizeof(int32_t));
    auto dy = BackendBuffer<float>::Allocate(gpu, nt * sizeof(int32_t));
    auto dl = BackendBuffer<float>::Allocate(gpu, sizeof(float));
    ASSERT_TRUE(ht.ok() && hy.ok() && hl.ok() && dt.ok() && dy.ok() && dl.ok());
    ASSERT_THAT(host.CopyFromHost(ht->raw(), tokens[mb].data(), nt * 4), IsOk());
    ASSERT_THAT(host.CopyFromHost(hy->raw(), targets[mb].data(), nt * 4), IsOk());
    ASSERT_THAT(gpu->CopyFromHost(dt->raw(), tokens[mb].data(), nt * 4), IsOk());
    ASSERT_THAT(gpu->CopyFromHost(dy->raw(), targets[mb].data(), nt * 4), IsOk());
    ASSERT_THAT((*ref)->Forward(mb, B, ht->raw(), hy->ints(), hl->data()), IsOk());
    ASSERT_THAT((*dev)->Forward(mb, B, dt->raw(), dy->ints(), dl->data()), IsOk());
    if (mb == 0) {
      ASSERT_THAT((*ref)->Backward(mb, nullptr, nullptr, 1.0 / M), IsOk());
      ASSERT_THAT((*dev)->Backward(mb, nullptr, nullptr, 1.0f / M), IsOk());
    } else {
      ASSERT_THAT((*ref)->BackwardInput(mb, nullptr, nullptr, 1.0 / M), IsOk());
      ASSERT_THAT((*dev)->BackwardInput(mb, nullptr, nullptr, 1.0f / M), IsOk());
      ASSERT_THAT((*ref)->BackwardWeight(mb), IsOk());
      ASSERT_THAT((*dev)->BackwardWeight(mb), IsOk());
    }
    ASSERT_THAT(host.CopyToHost(&ref_loss[mb], hl->raw(), sizeof(double)), IsOk());
    ASSERT_THAT(gpu->CopyToHost(&dev_loss[mb], dl->raw(), sizeof(float)), IsOk());
    ASSERT_THAT(gpu->Synchronize(), IsOk());
  }
  EXPECT_TRUE(IsClose(dev_loss, ref_loss, budget, false)) << "losses of the micro-batches";
  for (const model::ParamSpec& spec : (*ref)->Params()) {
    auto want = (*ref)->GetGrad(spec.name);
    auto got = (*dev)->GetGrad(spec.name);
    ASSERT_THAT(want, IsOk());
    ASSERT_THAT(got, IsOk());
    // Zero-initialised biases of LayerNorm get non-zero gradients; every gradient here
    // is non-zero, so the relative error is meaningful.
    EXPECT_TRUE(IsClose(*got, *want, budget, false)) << "gradient of " << spec.name;
  }
  std::map<std::string, std::pair<std::vector<float>, std::vector<double>>> grads;
  for (const model::ParamSpec& spec : (*ref)->Params()) {
    grads[spec.name] = {*(*dev)->GetGrad(spec.name), *(*ref)->GetGrad(spec.name)};
  }
  auto ref_norm = (*ref)->OptimizerStep(adam);
  auto dev_norm = (*dev)->OptimizerStep(adam);
  ASSERT_THAT(ref_norm, IsOk());
  ASSERT_THAT(dev_norm, IsOk());
  EXPECT_NEAR(*dev_norm, *ref_norm, budget * *ref_norm);
  EXPECT_GT(*ref_norm, adam.grad_clip_norm) << "the step should clip";
  // Clipping scales every gradient by clip / norm on each side.
  const double ref_scale = adam.grad_clip_norm / *ref_norm;
  const double dev_scale = adam.grad_clip_norm / *dev_norm;
  for (const model::ParamSpec& spec : (*ref)->Params()) {
    auto want = (*ref)->GetParam(spec.name);
    auto got = (*dev)->GetParam(spec.name);
    ASSERT_THAT(want, IsOk());
    ASSERT_THAT(got, IsOk());
    const auto& [dev_grad, ref_grad] = grads[spec.name];
    const double bound = AdamFirstStepBound(dev_grad, ref_grad, dev_scale, ref_scale, adam);
    EXPECT_TRUE(IsClose(*got, *want, budget, false) || L2Distance(*got, *want) <= bound)
        << "updated " << spec.name << ": L2 distance " << L2Distance(*got, *want)
        << ", AdamW's bound from the gradients' own difference " << bound;
  }
}

TEST_F(CudaBackendTest, TrainingStepMatchesDoublePrecisionHostFp32) {
  CheckTrainingStep(gpu_.get(), kFp32Tolerance, {});
}

TEST_F(CudaBackendTest, TrainingStepMatchesDoublePrecisionHostTf32) {
  // The same step without check_every_op, so ops overlap as they do in training, and
  // with recomputation (which must change nothing).
  auto be = CreateCudaBackend(0, {.tf32 = true});
  ASSERT_THAT(be, IsOk());
  // About ten matrix products lie between the loss and the embedding's gradients, each
  // adding TF32's ~3e-4 relative error; hence a wider budget than for one op. The
  // updated biases whose gradients are small against eps may miss it and still pass
  // AdamFirstStepBound (the first H200 run, 2026-12-04: h.0.mlp.c_proj.bias at 0.023).
  ChunkOptions recompute;
  recompute.recompute = true;
  CheckTrainingStep(be->get(), 5 * kTf32Tolerance, recompute);
}

// In bf16 both sides round the same operands, but an operand computed from earlier
// products (a float here, a double in the reference) lands on the other side of a bf16
// rounding boundary now and then, and the two then differ by one bf16 ulp (2^-8) there;
// AdamW turns the gradients that are zero in exact arithmetic into visible steps. The
// cpu backend, which does the same arithmetic (bf16 operands, fp32 sums), held to this
// reference on 200 random steps: median 6e-6, 90th percentile 9e-4, largest 3.2e-3,
// always in an updated bias. Hence 1e-2. A wrong stride or scratch buffer is off by
// order one; the rounding itself is held per op by the conformance suite (1e-5 for
// Matmul, where both sides round the same inputs).
constexpr double kBf16StepBudget = 1e-2;

TEST_F(CudaBackendTest, TrainingStepMatchesDoublePrecisionHostBf16) {
  CheckTrainingStep(gpu_.get(), kBf16StepBudget, {}, common::DType::kBF16);
}

TEST_F(CudaBackendTest, Bf16ProductsIgnoreTheTf32Option) {
  // bf16 operands are exact in TF32 and the products sum in fp32, so a TF32 backend's
  // bf16 step is held to the same budget; without check_every_op and with
  // recomputation, as in training.
  auto be = CreateCudaBackend(0, {.tf32 = true});
  ASSERT_THAT(be, IsOk());
  ChunkOptions recompute;
  recompute.recompute = true;
  CheckTrainingStep(be->get(), kBf16StepBudget, recompute, common::DType::kBF16);
}

TEST_F(CudaBackendTest, ProductOperandsAreF32OrBf16) {
  EXPECT_THAT(gpu_->SetProductOperands(common::DType::kBF16), IsOk());
  EXPECT_EQ(gpu_->product_operands(), common::DType::kBF16);
  EXPECT_THAT(gpu_->SetProductOperands(common::DType::kI32),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cuda backend")));
  EXPECT_EQ(gpu_->product_operands(), common::DType::kBF16);
  EXPECT_THAT(gpu_->SetProductOperands(common::DType::kF32), IsOk());
}

// ---- The bf16 operands' spans (no GPU needed) ---------------------------------------------

TEST(RowMajorSpanTest, CoversWhatAProductReads) {
  // One (3, 4) matrix, rows 4 apart: 12 elements; rows 10 apart: up to the last row's end.
  EXPECT_EQ(RowMajorSpan(3, 4, 4, 0, 1), 12);
  EXPECT_EQ(RowMajorSpan(3, 4, 10, 0, 1), 24);
  // Attention's q of one batch row: NH heads of (T, hs), rows 3C apart, heads hs apart,
  // so the span ends with the last head's last row, at C into the last (T, 3C) row.
  const int T = 7, C = 12, NH = 3, hs = C / NH;
  EXPECT_EQ(RowMajorSpan(T, hs, 3 * C, hs, NH), int64_t{T - 1} * 3 * C + C);
  // probs of one batch row: NH (T, T) matrices back to back.
  EXPECT_EQ(RowMajorSpan(T, T, T, int64_t{T} * T, NH), int64_t{NH} * T * T);
  // Past 2^31 elements without overflow.
  EXPECT_EQ(RowMajorSpan(65536, 65536, 65536, 0, 1), int64_t{1} << 32);
}

// ---- Without a GPU ------------------------------------------------------------------------

TEST(CudaBackendFactoryTest, FailsCleanlyWithoutAGpu) {
  if (common::HasCudaDevice()) GTEST_SKIP() << "a GPU is present";
  EXPECT_THAT(CreateCudaBackend(0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr("no usable GPU"),
                                        HasSubstr("use --device cpu"))));
}

TEST(CudaBackendFactoryTest, RejectsADeviceThatDoesNotExist) {
  SKIP_WITHOUT_GPU();
  EXPECT_THAT(CreateCudaBackend(1000), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pipetrain::compute
