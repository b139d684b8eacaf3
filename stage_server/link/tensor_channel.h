// The executor's view of a neighbour: send a tensor tagged with (job, step,
// micro-batch, chunk, kind) and receive one by its tag, both with a deadline. PeerLink
// implements it over gRPC; LocalChannel (tests, single-process pipelines) in memory.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/piecewise_tensor.h"
#include "common/tensor.h"
#include "common/tensor_codec.h"

namespace pipetrain::stage_server {

class TensorChannel {
 public:
  virtual ~TensorChannel() = default;
  virtual void BeginStep(uint64_t step) = 0;
  virtual absl::Status Send(const common::FrameTag& tag,
                            std::shared_ptr<const common::Tensor> tensor,
                            absl::Time deadline) = 0;
  // The tensor may lie in several pieces (a peer link hands over the network's own
  // buffers); they are released when the tensor is dropped.
  virtual absl::StatusOr<common::PiecewiseTensor> Receive(const common::FrameTag& tag,
                                                          absl::Time deadline) = 0;
  // Waits until everything sent has left this process.
  virtual absl::Status Flush(absl::Time deadline) = 0;
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;
};

}  // namespace pipetrain::stage_server
