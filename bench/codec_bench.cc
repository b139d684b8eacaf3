#include "bench/codec_bench.h"

#include <chrono>
#include <cstring>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/buffer_pool.h"
#include "common/frame_proto.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace pipetrain::bench {
namespace {

using common::BufferPool;
using common::DType;
using common::FrameTag;
using common::Tensor;
using common::TensorEncoder;
using common::TensorReassembler;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One encode + reassemble of `src`; the result goes back to the pool, as a receiver
// does once it has consumed a tensor.
absl::Status CodecOnce(const Tensor& src, size_t frame_bytes, BufferPool& pool) {
  FrameTag tag{"bench", 1, 0, 0, common::TensorKind::kActivation};
  ASSIGN_OR_RETURN(TensorEncoder enc, TensorEncoder::Create(tag, src, frame_bytes));
  TensorReassembler re({}, &pool);
  for (size_t i = 0; i < enc.num_frames(); ++i) {
    common::FrameView f = enc.frame(i);
    ASSIGN_OR_RETURN(auto done, re.Accept(f.header, f.payload));
    if (done.has_value()) pool.Release(done->tensor.ReleaseBuffer());
  }
  return absl::OkStatus();
}

// The same through protobuf messages: copy into the message, serialize, parse, then
// reassemble, as the plain protobuf gRPC path would.
absl::Status ProtoOnce(const Tensor& src, size_t frame_bytes, BufferPool& pool,
                       std::string& wire, pipetrain::v1::TensorFrame& msg) {
  FrameTag tag{"bench", 1, 0, 0, common::TensorKind::kActivation};
  ASSIGN_OR_RETURN(TensorEncoder enc, TensorEncoder::Create(tag, src, frame_bytes));
  TensorReassembler re({}, &pool);
  for (size_t i = 0; i < enc.num_frames(); ++i) {
    common::FrameToProto(enc.frame(i), &msg);
    msg.SerializeToString(&wire);
    msg.ParseFromString(wire);
    ASSIGN_OR_RETURN(auto done,
                     re.Accept(common::HeaderFromProto(msg), common::PayloadOf(msg)));
    if (done.has_value()) pool.Release(done->tensor.ReleaseBuffer());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BenchResult> RunCodecBench(const BenchOptions& options) {
  constexpr size_t kBytes = size_t{64} << 20;
  const int reps = options.repetitions > 0 ? options.repetitions : 15;
  ASSIGN_OR_RETURN(Tensor src, Tensor::Create(DType::kF32, {16, 1024, 1024}));
  std::mt19937 rng(7);
  for (float& x : src.data<float>()) x = std::uniform_real_distribution<float>(-1, 1)(rng);

  // Warm destinations: the baseline's and the pool's buffers are touched before timing.
  common::Buffer dst(kBytes);
  std::memset(dst.data(), 0, kBytes);
  BufferPool pool;
  const size_t frame_sizes[] = {size_t{64} << 10, size_t{1} << 20, common::kDefaultFrameBytes};
  for (size_t fb : frame_sizes) RETURN_IF_ERROR(CodecOnce(src, fb, pool));

  std::vector<double> t_memcpy, t_proto;
  std::vector<std::vector<double>> t_codec(std::size(frame_sizes));
  std::string wire;
  pipetrain::v1::TensorFrame msg;
  RETURN_IF_ERROR(ProtoOnce(src, common::kDefaultFrameBytes, pool, wire, msg));
  // Interleaved so that noise from the rest of the machine hits all paths alike.
  for (int r = 0; r < reps; ++r) {
    auto a = Clock::now();
    std::memcpy(dst.data(), src.bytes().data(), kBytes);
    auto b = Clock::now();
    t_memcpy.push_back(Seconds(a, b));
    for (size_t k = 0; k < std::size(frame_sizes); ++k) {
      a = Clock::now();
      RETURN_IF_ERROR(CodecOnce(src, frame_sizes[k], pool));
      b = Clock::now();
      t_codec[k].push_back(Seconds(a, b));
    }
    a = Clock::now();
    RETURN_IF_ERROR(ProtoOnce(src, common::kDefaultFrameBytes, pool, wire, msg));
    b = Clock::now();
    t_proto.push_back(Seconds(a, b));
  }
  const double gb = kBytes / 1e9;
  const double memcpy_s = Median(t_memcpy);
  BenchResult result;
  result.Label("tensor", "64 MiB f32 (16, 1024, 1024), random");
  result.Add("tensor_bytes", kBytes);
  result.Add("repetitions", reps);
  result.Add("memcpy_gb_per_s", gb / memcpy_s);
  const char* names[] = {"64k", "1m", "4m"};
  for (size_t k = 0; k < std::size(frame_sizes); ++k) {
    const double s = Median(t_codec[k]);
    result.Add(absl::StrCat("codec_", names[k], "_gb_per_s"), gb / s);
    result.Add(absl::StrCat("codec_", names[k], "_time_over_memcpy"), s / memcpy_s);
  }
  const double proto_s = Median(t_proto);
  result.Add("protobuf_4m_gb_per_s", gb / proto_s);
  result.Add("protobuf_4m_time_over_memcpy", proto_s / memcpy_s);
  return result;
}

}  // namespace pipetrain::bench
