#include "stage_server/compute/onednn_matmul.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/bf16.h"
#include "common/status_macros.h"
#include "stage_server/compute/cpu_wide_loops.h"
#include "oneapi/dnnl/dnnl.h"
#include "stage_server/compute/parallel_ranges.h"

namespace pipetrain::compute {

namespace {

absl::Status Check(dnnl_status_t s, absl::string_view doing) {
  if (s == dnnl_success) return absl::OkStatus();
  const absl::StatusCode code =
      s == dnnl_unimplemented ? absl::StatusCode::kUnimplemented
      : s == dnnl_out_of_memory ? absl::StatusCode::kResourceExhausted
                                : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat("oneDNN matmul: ", doing, " failed (dnnl status ",
                                         static_cast<int>(s), ")"));
}

// Owning wrappers for the C API's handles, destroyed in reverse order of creation.
template <typename H, dnnl_status_t (*Destroy)(H)>
struct Owned {
  H h = nullptr;
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (h != nullptr) Destroy(h);
  }
};
using OwnedPrimitive = Owned<dnnl_primitive_t, dnnl_primitive_destroy>;
using OwnedMemory = Owned<dnnl_memory_t, dnnl_memory_destroy>;
using OwnedAttr = Owned<dnnl_primitive_attr_t, dnnl_primitive_attr_destroy>;
using OwnedPostOps = Owned<dnnl_post_ops_t, dnnl_post_ops_destroy>;
using OwnedDesc = Owned<dnnl_primitive_desc_t, dnnl_primitive_desc_destroy>;

// A 4-d view (batch0, batch1, rows, cols) with the given element strides.
// A single product (both batches 1) is described as 2-d, which oneDNN's fastest kernels
// take; a batch of size 1 gets a stride past the matrix, which oneDNN accepts.
absl::StatusOr<dnnl_memory_desc_t> ViewDesc(int batch0, int batch1, int rows, int cols,
                                            MatrixStrides s, dnnl_data_type_t type) {
  dnnl_memory_desc_t md;
  if (batch0 == 1 && batch1 == 1) {
    const dnnl_dims_t dims = {rows, cols};
    const dnnl_dims_t strides = {s.row, s.col};
    RETURN_IF_ERROR(Check(dnnl_memory_desc_init_by_strides(&md, 2, dims, type, strides),
                          "describing an operand"));
    return md;
  }
  const int64_t extent = std::max(s.row * rows, s.col * cols);
  if (batch1 == 1) s.batch1 = extent;
  if (batch0 == 1) s.batch0 = std::max(s.batch1 * batch1, extent);
  const dnnl_dims_t dims = {batch0, batch1, rows, cols};
  const dnnl_dims_t strides = {s.batch0, s.batch1, s.row, s.col};
  RETURN_IF_ERROR(Check(dnnl_memory_desc_init_by_strides(&md, 4, dims, type, strides),
                        "describing an operand"));
  return md;
}

// Where a view's bf16 copy keeps its elements: densely, in the view's own memory order
// (a transposed view stays transposed), so that the copy reads and writes contiguous runs.
MatrixStrides Bf16Layout(int batch1, int rows, int cols, const MatrixStrides& s) {
  const int64_t matrix = int64_t{rows} * cols;
  if (s.col != 1 && s.row == 1) return {int64_t{batch1} * matrix, matrix, 1, rows};
  return {int64_t{batch1} * matrix, matrix, cols, 1};
}

// Writes the view `s` of x, rounded to bf16, into out laid out as Bf16Layout says: runs
// of the contiguous dimension, spread over `threads`.
void ToBf16(int threads, const float* x, int batch0, int batch1, int rows, int cols,
            const MatrixStrides& s, std::vector<uint16_t>& out) {
  const MatrixStrides d = Bf16Layout(batch1, rows, cols, s);
  const bool by_columns = d.row == 1;  // runs along a column
  const int runs = by_columns ? cols : rows, run = by_columns ? rows : cols;
  const int64_t in_step = by_columns ? s.row : s.col;  // 1 unless the view has no unit stride
  out.resize(size_t(batch0) * batch1 * rows * cols);
  uint16_t* o = out.data();
  const int64_t total = int64_t{batch0} * batch1 * runs;
  ForRanges(threads, total, MinItems(run), [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int64_t matrix = i / runs, r = i % runs;
      const int64_t b0 = matrix / batch1, b1 = matrix % batch1;
      const float* in =
          x + b0 * s.batch0 + b1 * s.batch1 + r * (by_columns ? s.col : s.row);
      uint16_t* to = o + b0 * d.batch0 + b1 * d.batch1 + r * (by_columns ? d.col : d.row);
      if (in_step == 1) {
        wide::FloatsToBf16Bits(run, in, to);
      } else {
        for (int j = 0; j < run; ++j) to[j] = common::FloatToBf16Bits(in[j * in_step]);
      }
    }
  });
}

// The view `s` of bf16 bits, widened (exactly) to fp32 into out laid out densely as
// Bf16Layout says for `like`.
void WidenBf16(const uint16_t* bits, int batch0, int batch1, int rows, int cols,
               const MatrixStrides& s, const MatrixStrides& like, std::vector<float>& out) {
  const MatrixStrides d = Bf16Layout(batch1, rows, cols, like);
  out.resize(size_t(batch0) * batch1 * rows * cols);
  for (int64_t b0 = 0; b0 < batch0; ++b0) {
    for (int64_t b1 = 0; b1 < batch1; ++b1) {
      const uint16_t* in = bits + b0 * s.batch0 + b1 * s.batch1;
      float* to = out.data() + b0 * d.batch0 + b1 * d.batch1;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          to[r * d.row + c * d.col] = common::Bf16BitsToFloat(in[r * s.row + c * s.col]);
        }
      }
    }
  }
}

}  // namespace

struct OneDnnMatmul::Handles {
  Owned<dnnl_engine_t, dnnl_engine_destroy> engine;
  Owned<dnnl_stream_t, dnnl_stream_destroy> stream;
};

struct OneDnnMatmul::Entry {
  OwnedPrimitive primitive;
  OwnedMemory a, b, c;  // their data handles are set before every run
  bool widened = false;  // a bf16 product run as fp32 on widened operands (no bf16 kernel)
};

absl::StatusOr<std::unique_ptr<OneDnnMatmul>> OneDnnMatmul::Create(int threads) {
  if (threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("oneDNN matmul: threads must be >= 1 (got ", threads, ")"));
  }
  auto handles = std::make_unique<Handles>();
  RETURN_IF_ERROR(Check(dnnl_engine_create(&handles->engine.h, dnnl_cpu, 0), "making the engine"));
  RETURN_IF_ERROR(Check(
      dnnl_stream_create(&handles->stream.h, handles->engine.h, dnnl_stream_default_flags),
      "making the stream"));
  return std::unique_ptr<OneDnnMatmul>(new OneDnnMatmul(threads, std::move(handles)));
}

OneDnnMatmul::OneDnnMatmul(int threads, std::unique_ptr<Handles> handles)
    : threads_(threads), handles_(std::move(handles)) {}

OneDnnMatmul::~OneDnnMatmul() = default;

bool OneDnnMatmul::bf16_native() {
  const int isa = static_cast<int>(dnnl_get_effective_cpu_isa());
  const int bf16 = static_cast<int>(dnnl_cpu_isa_avx512_core_bf16);
  return (isa & bf16) == bf16;
}

absl::StatusOr<OneDnnMatmul::Entry*> OneDnnMatmul::EntryFor(common::DType operands,
                                                           const ProductShape& p,
                                                           bool a_given, bool b_given) {
  const bool bf16 = operands == common::DType::kBF16;
  std::array<int64_t, 22> key = {bf16, a_given, b_given, p.batch0, p.batch1, p.m, p.n, p.k,
                              p.a.batch0, p.a.batch1, p.a.row, p.a.col,
                              p.b.batch0, p.b.batch1, p.b.row, p.b.col,
                              p.c.batch0, p.c.batch1, p.c.row, p.c.col,
                              std::bit_cast<int32_t>(p.alpha), std::bit_cast<int32_t>(p.beta)};
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second.get();

  // bf16 operands are rounded into dense scratch; fp32 ones are read where they are.
  const MatrixStrides sa = bf16 && !a_given ? Bf16Layout(p.batch1, p.m, p.k, p.a) : p.a;
  const MatrixStrides sb = bf16 && !b_given ? Bf16Layout(p.batch1, p.k, p.n, p.b) : p.b;
  absl::StatusOr<std::unique_ptr<Entry>> entry =
      MakeEntry(p, bf16 ? dnnl_bf16 : dnnl_f32, sa, sb);
  if (bf16 && absl::IsUnimplemented(entry.status())) {
    // No bf16 kernel here: fp32 ones on the widened operands, dense as the scratch.
    entry = MakeEntry(p, dnnl_f32, Bf16Layout(p.batch1, p.m, p.k, p.a),
                      Bf16Layout(p.batch1, p.k, p.n, p.b));
    if (entry.ok()) (*entry)->widened = true;
  }
  if (!entry.ok()) return entry.status();
  Entry* raw = entry->get();
  cache_.emplace(std::move(key), *std::move(entry));
  return raw;
}

absl::StatusOr<std::unique_ptr<OneDnnMatmul::Entry>> OneDnnMatmul::MakeEntry(
    const ProductShape& p, int in_type, const MatrixStrides& sa, const MatrixStrides& sb) {
  const auto in = static_cast<dnnl_data_type_t>(in_type);
  ASSIGN_OR_RETURN(dnnl_memory_desc_t a, ViewDesc(p.batch0, p.batch1, p.m, p.k, sa, in));
  ASSIGN_OR_RETURN(dnnl_memory_desc_t b, ViewDesc(p.batch0, p.batch1, p.k, p.n, sb, in));
  ASSIGN_OR_RETURN(dnnl_memory_desc_t c, ViewDesc(p.batch0, p.batch1, p.m, p.n, p.c, dnnl_f32));
  dnnl_matmul_desc_t desc;
  RETURN_IF_ERROR(Check(dnnl_matmul_desc_init(&desc, &a, &b, nullptr, &c), "describing"));
  OwnedAttr attr;
  OwnedPostOps post_ops;
  RETURN_IF_ERROR(Check(dnnl_primitive_attr_create(&attr.h), "making attributes"));
  if (p.alpha != 1.0f) {
    RETURN_IF_ERROR(Check(dnnl_primitive_attr_set_output_scales(attr.h, 1, 0, &p.alpha),
                          "setting alpha"));
  }
  if (p.beta != 0.0f) {
    RETURN_IF_ERROR(Check(dnnl_post_ops_create(&post_ops.h), "making post-ops"));
    RETURN_IF_ERROR(Check(dnnl_post_ops_append_sum(post_ops.h, p.beta), "setting beta"));
    RETURN_IF_ERROR(Check(dnnl_primitive_attr_set_post_ops(attr.h, post_ops.h), "setting beta"));
  }
  OwnedDesc pd;
  RETURN_IF_ERROR(Check(dnnl_primitive_desc_create(&pd.h, &desc, attr.h, handles_->engine.h,
                                                   nullptr),
                        absl::StrCat("making a ", in == dnnl_bf16 ? "bf16" : "fp32",
                                     " product of ", p.m, "x", p.k, " by ", p.k, "x", p.n)));
  auto entry = std::make_unique<Entry>();
  RETURN_IF_ERROR(Check(dnnl_primitive_create(&entry->primitive.h, pd.h), "making the primitive"));
  dnnl_engine_t eng = handles_->engine.h;
  RETURN_IF_ERROR(Check(dnnl_memory_create(&entry->a.h, &a, eng, DNNL_MEMORY_NONE), "memory"));
  RETURN_IF_ERROR(Check(dnnl_memory_create(&entry->b.h, &b, eng, DNNL_MEMORY_NONE), "memory"));
  RETURN_IF_ERROR(Check(dnnl_memory_create(&entry->c.h, &c, eng, DNNL_MEMORY_NONE), "memory"));
  return entry;
}

absl::Status OneDnnMatmul::Run(common::DType operands, const ProductShape& p, const float* a,
                               const float* b, float* c) {
  if (operands != common::DType::kF32 && operands != common::DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "oneDNN matmul: operands must be f32 or bf16 (got ", common::DTypeName(operands), ")"));
  }
  ASSIGN_OR_RETURN(Entry * e, EntryFor(operands, p));
  if (operands != common::DType::kBF16) return Execute(e, a, b, c);
  ToBf16(threads_, a, p.batch0, p.batch1, p.m, p.k, p.a, a16_);
  ToBf16(threads_, b, p.batch0, p.batch1, p.k, p.n, p.b, b16_);
  return ExecuteBf16(e, p, a16_.data(), Bf16Layout(p.batch1, p.m, p.k, p.a), b16_.data(),
                     Bf16Layout(p.batch1, p.k, p.n, p.b), c);
}

absl::Status OneDnnMatmul::RunBf16(const ProductShape& p, Bf16Operand a, Bf16Operand b,
                                   float* c) {
  ASSIGN_OR_RETURN(Entry * e, EntryFor(common::DType::kBF16, p, a.bits != nullptr,
                                       b.bits != nullptr));
  const uint16_t* a_data = a.bits;
  const uint16_t* b_data = b.bits;
  MatrixStrides sa = p.a, sb = p.b;
  if (a_data == nullptr) {
    ToBf16(threads_, a.values, p.batch0, p.batch1, p.m, p.k, p.a, a16_);
    a_data = a16_.data();
    sa = Bf16Layout(p.batch1, p.m, p.k, p.a);
  }
  if (b_data == nullptr) {
    ToBf16(threads_, b.values, p.batch0, p.batch1, p.k, p.n, p.b, b16_);
    b_data = b16_.data();
    sb = Bf16Layout(p.batch1, p.k, p.n, p.b);
  }
  return ExecuteBf16(e, p, a_data, sa, b_data, sb, c);
}

absl::Status OneDnnMatmul::ExecuteBf16(Entry* e, const ProductShape& p, const uint16_t* a,
                                       const MatrixStrides& sa, const uint16_t* b,
                                       const MatrixStrides& sb, float* c) {
  if (!e->widened) return Execute(e, a, b, c);
  WidenBf16(a, p.batch0, p.batch1, p.m, p.k, sa, p.a, a32_);
  WidenBf16(b, p.batch0, p.batch1, p.k, p.n, sb, p.b, b32_);
  return Execute(e, a32_.data(), b32_.data(), c);
}

absl::Status OneDnnMatmul::Execute(Entry* e, const void* a, const void* b, float* c) {
  // oneDNN takes non-const handles; it only reads the operands.
  RETURN_IF_ERROR(Check(dnnl_memory_set_data_handle(e->a.h, const_cast<void*>(a)), "a"));
  RETURN_IF_ERROR(Check(dnnl_memory_set_data_handle(e->b.h, const_cast<void*>(b)), "b"));
  RETURN_IF_ERROR(Check(dnnl_memory_set_data_handle(e->c.h, c), "c"));
  const dnnl_exec_arg_t args[] = {
      {DNNL_ARG_SRC, e->a.h}, {DNNL_ARG_WEIGHTS, e->b.h}, {DNNL_ARG_DST, e->c.h}};
#ifdef _OPENMP
  omp_set_num_threads(threads_);  // per calling thread in OpenMP: set where it runs
#endif
  RETURN_IF_ERROR(Check(dnnl_primitive_execute(e->primitive.h, handles_->stream.h, 3, args),
                        "running a product"));
  return Check(dnnl_stream_wait(handles_->stream.h), "waiting for a product");
}

}  // namespace pipetrain::compute
