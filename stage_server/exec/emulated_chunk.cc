#include "stage_server/exec/emulated_chunk.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "stage_server/link/host_tensor.h"

namespace pipetrain::stage_server {
namespace {

// The device is busy for `seconds`. Linux lets a sleeper wake up to its timer slack
// (50 us by default) late; an emulated device's time is its whole point, so this
// thread asks for none.
void Sleep(double seconds) {
  thread_local const bool tight = prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) == 0;
  (void)tight;
  absl::SleepFor(absl::Seconds(seconds));
}

// A shared emulated device: a lock file of its name in the temporary directory, which
// every stage process of the host naming it locks while it occupies the device, and a
// mutex for the threads of this process (flock does not exclude one file's holders).
struct SharedDevice {
  absl::Mutex mu;
  int fd = -1;
};

SharedDevice* SharedDeviceNamed(const std::string& name) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* devices = new std::map<std::string, std::unique_ptr<SharedDevice>>();
  absl::MutexLock lock(&mu);
  std::unique_ptr<SharedDevice>& d = (*devices)[name];
  if (d) return d.get();
  d = std::make_unique<SharedDevice>();
  const std::string path = SharedDeviceLockPath(name);
  d->fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (d->fd < 0) {
    common::LogWarning("stage", absl::StrCat("emulated device '", name, "': cannot open ", path,
                                             "; it computes as if not shared"));
  }
  return d.get();
}

}  // namespace

std::string SharedDeviceLockPath(const std::string& shared) {
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
  if (ec) dir = "/tmp";
  return (dir / ("pipetrain-emulated-" + shared + ".lock")).string();
}

void OccupyEmulatedDevice(double seconds, const std::string& shared) {
  if (shared.empty()) return Sleep(seconds);
  SharedDevice* d = SharedDeviceNamed(shared);
  absl::MutexLock lock(&d->mu);
  const bool locked = d->fd >= 0 && flock(d->fd, LOCK_EX) == 0;
  Sleep(seconds);
  if (locked) flock(d->fd, LOCK_UN);
}

absl::StatusOr<EmulatedDevice> EmulatedDeviceByName(const std::string& name) {
  // Sustained dense rates for bf16 training, well under the datasheet peaks.
  if (name == "h100" || name == "h200") return EmulatedDevice{name, 400e12};
  if (name == "a100") return EmulatedDevice{name, 150e12};
  double flops = 0;
  if (absl::SimpleAtod(name, &flops) && flops > 0) return EmulatedDevice{name, flops};
  return absl::InvalidArgumentError(absl::StrCat(
      "emulated device '", name, "' is unknown: use h100, h200, a100 or a FLOP rate such as 2e12"));
}

EmulatedChunk::EmulatedChunk(const model::TransformerConfig& config, int begin, int end, int rows,
                             EmulatedDevice device, bool recompute,
                             std::shared_ptr<common::BufferPool> pool,
                             const model::Precision& precision)
    : config_(config),
      begin_(begin),
      end_(end),
      rows_(rows),
      device_(std::move(device)),
      recompute_(recompute),
      pool_(std::move(pool)),
      activations_(precision.activations) {
  const double tokens = static_cast<double>(rows) * config.seq_len;
  double params = 0;
  for (int l = begin; l < end; ++l) {
    const model::LayerCost c = model::CostOfLayer(config, l);
    forward_s_ += c.forward_flops * tokens / device_.flops;
    backward_input_s_ += c.backward_input_flops * tokens / device_.flops;
    backward_weight_s_ += c.backward_weight_flops * tokens / device_.flops;
    params += c.params;
  }
  for (int l = begin; l < end; ++l) {
    const double layer =
        model::ChunkActivationBytes(config, l, l + 1, false, precision.products).stored * tokens;
    evaluate_bytes_ = std::max(evaluate_bytes_, static_cast<size_t>(layer));
  }
  memory_ = model::ChunkActivationBytes(config, begin, end, recompute, precision.products);
  memory_.stored *= tokens;
  memory_.backward_extra *= tokens;
  memory_.weight_grad *= tokens;
  // AdamW touches each parameter a handful of times: ~10 FLOPs per parameter.
  optimizer_s_ = 10 * params / device_.flops;
  if (recompute) backward_input_s_ += forward_s_;  // the forward runs again first
}

absl::StatusOr<common::Tensor> EmulatedChunk::Output(std::vector<int64_t> shape,
                                                     common::DType dtype) {
  // Contents are whatever the buffer held: the emulated device computes nothing.
  return PooledTensor(*pool_, dtype, std::move(shape));
}

absl::StatusOr<common::Tensor> EmulatedChunk::Activation() {
  return Output({rows_, config_.seq_len, config_.d_model}, activations_);
}

void EmulatedChunk::Hold(int mb, size_t bytes) {
  in_flight_[mb] += bytes;
  held_ += bytes;
  peak_ = std::max(peak_, held_);
}

void EmulatedChunk::Peak(size_t extra) { peak_ = std::max(peak_, held_ + extra); }

void EmulatedChunk::Release(int mb) {
  auto it = in_flight_.find(mb);
  if (it == in_flight_.end()) return;
  held_ -= it->second;
  in_flight_.erase(it);
}

absl::StatusOr<common::Tensor> EmulatedChunk::Forward(int mb, const common::PiecewiseTensor& input,
                                                      const common::Tensor* targets) {
  if (in_flight_.count(mb)) {
    return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " is already in flight"));
  }
  OccupyEmulatedDevice(forward_s_, device_.shared);
  Hold(mb, memory_.stored);
  Peak(memory_.backward_extra);  // recomputing, the whole stash existed until now
  if (has_head()) {
    ASSIGN_OR_RETURN(common::Tensor loss, Output({1}));
    loss.data<float>()[0] = 0.0f;  // no arithmetic: the loss is not computed
    return loss;
  }
  return Activation();
}

absl::StatusOr<common::Tensor> EmulatedChunk::Evaluate(const common::PiecewiseTensor&,
                                                       const common::Tensor*) {
  OccupyEmulatedDevice(forward_s_, device_.shared);
  Peak(evaluate_bytes_);
  if (has_head()) {
    ASSIGN_OR_RETURN(common::Tensor loss, Output({1}));
    loss.data<float>()[0] = 0.0f;  // no arithmetic: the loss is not computed
    return loss;
  }
  return Activation();
}

absl::StatusOr<common::Tensor> EmulatedChunk::Backward(int mb, const common::PiecewiseTensor*,
                                                       float) {
  if (!in_flight_.count(mb)) {
    return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " has no forward"));
  }
  OccupyEmulatedDevice(backward_input_s_ + backward_weight_s_, device_.shared);
  last_recompute_s_ = recompute_ ? forward_s_ : 0;
  Peak(memory_.backward_extra);
  Release(mb);
  if (has_embedding()) return common::Tensor();
  return Activation();
}

absl::StatusOr<common::Tensor> EmulatedChunk::BackwardInput(int mb, const common::PiecewiseTensor*,
                                                            float) {
  if (!in_flight_.count(mb)) {
    return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " has no forward"));
  }
  OccupyEmulatedDevice(backward_input_s_, device_.shared);
  last_recompute_s_ = recompute_ ? forward_s_ : 0;
  Peak(memory_.backward_extra);
  // The rebuilt activations and the gradients for the weight half stay until it runs.
  Hold(mb, memory_.backward_extra + memory_.weight_grad);
  if (has_embedding()) return common::Tensor();
  return Activation();
}

absl::Status EmulatedChunk::BackwardWeight(int mb) {
  if (!in_flight_.count(mb)) {
    return absl::FailedPreconditionError(absl::StrCat("micro-batch ", mb, " has no forward"));
  }
  OccupyEmulatedDevice(backward_weight_s_, device_.shared);
  Release(mb);
  return absl::OkStatus();
}

void EmulatedChunk::Abandon() {
  in_flight_.clear();
  held_ = 0;
}

absl::StatusOr<common::Tensor> EmulatedChunk::TiedGradient(bool) {
  return Output({config_.vocab_size, config_.d_model});
}

absl::Status EmulatedChunk::OptimizerStep(const compute::OptimizerSettings&, std::optional<double>) {
  OccupyEmulatedDevice(optimizer_s_, device_.shared);
  return absl::OkStatus();
}

}  // namespace pipetrain::stage_server
