// The tensor wire codec: a tensor travels between stages as frames of at most
// frame_bytes payload, each with a full header. Encoding makes no copy (frames are
// views of the tensor's bytes); reassembly copies each payload byte once, into a
// buffer taken from a pool, and checks every frame before it touches memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/buffer_pool.h"
#include "common/piecewise_tensor.h"
#include "common/tensor.h"

namespace pipetrain::common {

inline constexpr size_t kDefaultFrameBytes = size_t{4} << 20;  // 4 MiB

// Values match pipetrain.v1.TensorKind on the wire.
enum class TensorKind : int {
  kUnspecified = 0,
  kActivation = 1,
  kGradient = 2,
  kTiedGradient = 3,  // tied embeddings: first and last stage swap their (V, C) gradients
};
std::string TensorKindName(TensorKind kind);

// What a tensor is: the same for every frame of it.
struct FrameTag {
  std::string job_id;
  uint64_t step = 0;
  uint32_t micro_batch = 0;
  uint32_t chunk = 0;
  TensorKind kind = TensorKind::kUnspecified;

  bool operator==(const FrameTag&) const = default;
};
std::string DescribeTag(const FrameTag& tag);  // "job j1 step 3 micro-batch 2 ..."

struct FrameHeader {
  FrameTag tag;
  int dtype = 0;  // raw wire value: the reassembler checks it
  std::vector<int64_t> shape;
  uint64_t offset = 0;       // of this frame's payload within the tensor
  uint64_t total_bytes = 0;  // of the whole tensor
};

struct FrameView {
  FrameHeader header;
  std::span<const std::byte> payload;  // points into the encoded tensor's storage
};

// Splits a tensor into frames without copying it. The tensor's bytes must outlive
// the encoder and the frames it hands out.
class TensorEncoder {
 public:
  static absl::StatusOr<TensorEncoder> Create(FrameTag tag, DType dtype,
                                              std::vector<int64_t> shape,
                                              std::span<const std::byte> data,
                                              size_t frame_bytes = kDefaultFrameBytes);
  static absl::StatusOr<TensorEncoder> Create(FrameTag tag, const Tensor& tensor,
                                              size_t frame_bytes = kDefaultFrameBytes) {
    return Create(std::move(tag), tensor.dtype(), tensor.shape(), tensor.bytes(),
                  frame_bytes);
  }

  size_t num_frames() const { return num_frames_; }
  FrameView frame(size_t index) const;  // index < num_frames()

 private:
  TensorEncoder() = default;
  FrameHeader header_;
  std::span<const std::byte> data_;
  size_t frame_bytes_ = 0;
  size_t num_frames_ = 0;
};

struct ReassemblerOptions {
  uint64_t max_tensor_bytes = uint64_t{2} << 30;  // a larger announcement is refused
  uint64_t max_frame_bytes = uint64_t{64} << 20;  // a larger payload is refused
};

struct ReceivedTensor {
  FrameTag tag;
  Tensor tensor;
};

struct ReceivedPieces {
  FrameTag tag;
  PiecewiseTensor tensor;
};

// Rebuilds tensors from a stream of frames, one tensor at a time, frames in order.
// Every rejection is an error naming the offending field; after one, the partial
// tensor is dropped and the next frame must start a new tensor. A stream uses either
// Accept (copies) or AcceptPieces (no copy) for each whole tensor.
class TensorReassembler {
 public:
  explicit TensorReassembler(ReassemblerOptions options = {},
                             BufferPool* pool = nullptr)
      : options_(options), pool_(pool) {}

  // Takes one frame. Returns the tensor when this frame completes it, else nullopt.
  absl::StatusOr<std::optional<ReceivedTensor>> Accept(
      const FrameHeader& header, std::span<const std::byte> payload);
  // The same for a payload that arrived in pieces (e.g. several network slices); the
  // pieces are copied once, in order, straight into the tensor.
  absl::StatusOr<std::optional<ReceivedTensor>> Accept(
      const FrameHeader& header, std::span<const std::span<const std::byte>> pieces);
  // Checks a frame like Accept but keeps its payload where it is: the pieces are
  // views that `holder` keeps alive, and the finished tensor holds every frame's
  // holder. No payload byte is copied.
  absl::StatusOr<std::optional<ReceivedPieces>> AcceptPieces(
      const FrameHeader& header, std::span<const std::span<const std::byte>> pieces,
      std::shared_ptr<const void> holder);
  // The stream has ended: an error if a tensor is incomplete.
  absl::Status Finish();

  bool in_progress() const { return in_progress_; }
  uint64_t bytes_received() const { return received_; }

 private:
  absl::Status CheckFirstFrame(const FrameHeader& header, size_t payload_size) const;
  absl::Status CheckNextFrame(const FrameHeader& header, size_t payload_size) const;
  // Every check of one frame; on failure the partial tensor is dropped. On success a
  // first frame starts a tensor (in_progress_, current_, received_ = 0).
  absl::Status Check(const FrameHeader& header, size_t payload_size, bool keep_pieces);
  void Abandon();

  ReassemblerOptions options_;
  BufferPool* pool_;
  bool in_progress_ = false;
  FrameHeader current_;  // header of the first frame of the tensor in progress
  Buffer buffer_;                                      // Accept
  bool keep_pieces_ = false;                           // the tensor in progress is AcceptPieces'
  std::vector<std::span<const std::byte>> pieces_;     // AcceptPieces
  std::vector<std::shared_ptr<const void>> holders_;   // AcceptPieces
  uint64_t received_ = 0;
};

}  // namespace pipetrain::common
