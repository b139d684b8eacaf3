#include "stage_server/collective/nccl_reducer.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/error_context.h"
#include "common/model/optimizer_split.h"
#include "common/status_macros.h"
#include "stage_server/collective/reducer_choice.h"

namespace pipetrain::stage_server::collective {

namespace {

constexpr char kUniqueIdKey[] = "nccl-unique-id";

absl::Status CudaError(cudaError_t e, const std::string& what) {
  std::string msg = absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::UnavailableError(msg);
}

absl::Status NcclError(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  std::string msg = absl::StrCat(
      what, ": ", ncclGetErrorString(r),
      last != nullptr && *last != '\0' ? absl::StrCat(" (", last, ")") : std::string());
  if (r == ncclInvalidUsage || r == ncclInvalidArgument) return absl::InvalidArgumentError(msg);
  return absl::UnavailableError(msg);
}

#define NCCL_REDUCER_CUDA(expr, ...)                   \
  do {                                                 \
    if (cudaError_t _e = (expr); _e != cudaSuccess)    \
      return CudaError(_e, absl::StrCat(__VA_ARGS__)); \
  } while (false)

// Polls a non-blocking communicator until its pending call is no longer in progress.
absl::Status AwaitComm(ncclComm_t comm, absl::Time until, const std::string& what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) {
      return NcclError(r, comm, what);
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(state, comm, what);
    if (absl::Now() > until) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": still in progress at the deadline"));
    }
    absl::SleepFor(absl::Microseconds(50));
  }
}

class NcclReducer final : public GradientReducer {
 public:
  NcclReducer(ReducerOptions options, int device) : options_(std::move(options)), device_(device) {}

  ~NcclReducer() override {
    cudaSetDevice(device_);
    // Abort, not destroy: it never waits on a peer that is gone.
    if (comm_ != nullptr) ncclCommAbort(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    cudaFree(device_all_);
    cudaFree(device_piece_);
    cudaFreeHost(host_);
  }

  // Replica 0's unique id through `store`, then this rank of the communicator, by `until`.
  absl::Status Connect(CoordinatorStore& store, absl::Time until) {
    ncclUniqueId id;
    if (options_.replica == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
        return NcclError(r, nullptr,
                         absl::StrCat(Who(), ": creating NCCL's unique id for cuda:", device_));
      }
      const std::string hex =
          absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(&id), sizeof id));
      RETURN_IF_ERROR(common::ErrorContext(Who()).Wrap(store.Set(kUniqueIdKey, hex)));
    } else {
      absl::StatusOr<std::string> hex = store.Get(kUniqueIdKey, until - absl::Now());
      if (!hex.ok()) {
        return common::ErrorContext(Who()).Wrap(hex.status(), "waiting for replica 0's NCCL id");
      }
      const std::string raw = absl::HexStringToBytes(*hex);
      if (raw.size() != sizeof id) {
        return absl::InvalidArgumentError(absl::StrCat(Who(), ": replica 0's NCCL unique id is ",
                                                       raw.size(), " bytes, not ", sizeof id));
      }
      std::memcpy(&id, raw.data(), sizeof id);
    }
    NCCL_REDUCER_CUDA(cudaSetDevice(device_), Who(), ": selecting cuda:", device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const std::string what =
        absl::StrCat(Who(), ": joining the NCCL communicator on cuda:", device_);
    ncclResult_t r =
        ncclCommInitRankConfig(&comm_, options_.replicas, id, options_.replica, &config);
    if (r != ncclSuccess && r != ncclInProgress) return NcclError(r, comm_, what);
    RETURN_IF_ERROR(AwaitComm(comm_, until, what));
    NCCL_REDUCER_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), Who(),
                      ": creating the NCCL stream");
    return absl::OkStatus();
  }

  int rank() const override { return options_.replica; }
  int size() const override { return options_.replicas; }
  const char* library() const override { return "nccl"; }

  absl::Status AllReduceSum(std::span<float> data, absl::Duration deadline) override {
    return Run(
        "all-reduce", data.size(), deadline,
        [&]() -> absl::Status {
          RETURN_IF_ERROR(Reserve(data.size(), 0));
          std::copy(data.begin(), data.end(), host_);
          RETURN_IF_ERROR(ToDevice(device_all_, data.size()));
          RETURN_IF_ERROR(Enqueued(ncclAllReduce(device_all_, device_all_, data.size(), ncclFloat,
                                                 ncclSum, comm_, stream_)));
          return ToHost(device_all_, data.size());
        },
        [&] { std::copy_n(host_, data.size(), data.begin()); });
  }

  // NCCL's reduce-scatter takes equal pieces: every piece goes in a slot of the largest
  // piece's size (the padding is zeros, and is never read back).
  absl::Status ReduceScatterSum(std::span<float> data, absl::Duration deadline) override {
    const uint64_t slot = Slot(data.size());
    const model::CopyRange own = model::RangeOfCopy(data.size(), size(), rank());
    return Run(
        "reduce-scatter", data.size(), deadline,
        [&]() -> absl::Status {
          RETURN_IF_ERROR(Reserve(slot * size(), slot));
          for (int r = 0; r < size(); ++r) {
            const model::CopyRange piece = model::RangeOfCopy(data.size(), size(), r);
            float* at = std::copy_n(data.begin() + piece.begin, piece.size(), host_ + r * slot);
            std::fill(at, host_ + (r + 1) * slot, 0.0f);
          }
          RETURN_IF_ERROR(ToDevice(device_all_, slot * size()));
          RETURN_IF_ERROR(Enqueued(ncclReduceScatter(device_all_, device_piece_, slot, ncclFloat,
                                                     ncclSum, comm_, stream_)));
          return ToHost(device_piece_, own.size());
        },
        [&] { std::copy_n(host_, own.size(), data.begin() + own.begin); });
  }

  absl::Status AllGather(std::span<float> data, absl::Duration deadline) override {
    const uint64_t slot = Slot(data.size());
    const model::CopyRange own = model::RangeOfCopy(data.size(), size(), rank());
    return Run(
        "all-gather", data.size(), deadline,
        [&]() -> absl::Status {
          RETURN_IF_ERROR(Reserve(slot * size(), slot));
          std::fill(std::copy_n(data.begin() + own.begin, own.size(), host_), host_ + slot, 0.0f);
          RETURN_IF_ERROR(ToDevice(device_piece_, slot));
          RETURN_IF_ERROR(
              Enqueued(ncclAllGather(device_piece_, device_all_, slot, ncclFloat, comm_, stream_)));
          return ToHost(device_all_, slot * size());
        },
        [&] {
          for (int r = 0; r < size(); ++r) {
            const model::CopyRange piece = model::RangeOfCopy(data.size(), size(), r);
            std::copy_n(host_ + r * slot, piece.size(), data.begin() + piece.begin);
          }
        });
  }

 private:
  uint64_t Slot(uint64_t elements) const {
    const std::vector<uint64_t> sizes = model::PieceSizes(elements, size());
    return *std::max_element(sizes.begin(), sizes.end());
  }

  // Enqueues one collective on the stream, waits for it until the deadline, then
  // `finish` copies the result out of the pinned buffer. Any failure aborts the
  // communicator and breaks the reducer for good.
  template <typename Enqueue, typename Finish>
  absl::Status Run(const char* what, size_t floats, absl::Duration deadline, Enqueue enqueue,
                   Finish finish) {
    if (deadline <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          Who(), ": ", what, " deadline must be positive, got ", absl::FormatDuration(deadline)));
    }
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          Who(), ": the reducer failed earlier and cannot be used again: ", broken_.message()));
    }
    if (floats == 0) return absl::OkStatus();
    const absl::Time until = absl::Now() + deadline;
    call_until_ = until;
    absl::Status s = cudaSetDevice(device_) == cudaSuccess
                         ? enqueue()
                         : absl::UnavailableError(absl::StrCat("selecting cuda:", device_));
    if (s.ok()) s = Wait(until);
    if (s.ok()) {
      finish();
      return absl::OkStatus();
    }
    ncclCommAbort(comm_);
    comm_ = nullptr;
    broken_ = absl::Status(
        s.code(),
        absl::StrCat(Who(), ": ", what, " of ", floats, " floats on cuda:", device_, " (deadline ",
                     absl::FormatDuration(deadline), ") failed: ", s.message()));
    return broken_;
  }

  // Grows the pinned host buffer and the two device buffers to hold `all` and `piece`
  // floats (the host one holds either).
  absl::Status Reserve(uint64_t all, uint64_t piece) {
    all = std::max(all, piece);
    if (all > all_capacity_) {
      cudaFree(device_all_);
      cudaFreeHost(host_);
      device_all_ = nullptr;
      host_ = nullptr;
      all_capacity_ = 0;
      NCCL_REDUCER_CUDA(cudaMalloc(&device_all_, all * sizeof(float)), "allocating ",
                        all * sizeof(float), " bytes of device memory");
      NCCL_REDUCER_CUDA(cudaMallocHost(&host_, all * sizeof(float)), "allocating ",
                        all * sizeof(float), " bytes of pinned host memory");
      all_capacity_ = all;
    }
    if (piece > piece_capacity_) {
      cudaFree(device_piece_);
      device_piece_ = nullptr;
      piece_capacity_ = 0;
      NCCL_REDUCER_CUDA(cudaMalloc(&device_piece_, piece * sizeof(float)), "allocating ",
                        piece * sizeof(float), " bytes of device memory");
      piece_capacity_ = piece;
    }
    return absl::OkStatus();
  }

  absl::Status ToDevice(float* to, uint64_t floats) {
    NCCL_REDUCER_CUDA(
        cudaMemcpyAsync(to, host_, floats * sizeof(float), cudaMemcpyHostToDevice, stream_),
        "copying ", floats, " floats to the device");
    return absl::OkStatus();
  }

  absl::Status ToHost(const float* from, uint64_t floats) {
    NCCL_REDUCER_CUDA(
        cudaMemcpyAsync(host_, from, floats * sizeof(float), cudaMemcpyDeviceToHost, stream_),
        "copying ", floats, " floats to the host");
    return absl::OkStatus();
  }

  // A non-blocking communicator may answer a call with "in progress": it is enqueued
  // once the communicator says so.
  absl::Status Enqueued(ncclResult_t r) {
    if (r == ncclSuccess) return absl::OkStatus();
    if (r != ncclInProgress) return NcclError(r, comm_, "enqueueing the collective");
    return AwaitComm(comm_, call_until_, "enqueueing the collective");
  }

  // The stream's work done, or the communicator's error, or the deadline.
  absl::Status Wait(absl::Time until) {
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return CudaError(e, "waiting for the stream");
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclError(state, comm_, "the communicator failed");
      }
      if (absl::Now() > until) {
        return absl::DeadlineExceededError("a replica did not take part before the deadline");
      }
      absl::SleepFor(absl::Microseconds(20));
    }
  }

  std::string Who() const { return ReducerWho(options_); }

  const ReducerOptions options_;
  const int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* host_ = nullptr;          // pinned: what the stream copies from and to
  float* device_all_ = nullptr;    // the whole (padded) buffer
  float* device_piece_ = nullptr;  // one replica's slot
  uint64_t all_capacity_ = 0;
  uint64_t piece_capacity_ = 0;
  absl::Time call_until_;  // the deadline of the call in progress
  absl::Status broken_;
};

}  // namespace

bool NcclBuilt() { return true; }

std::string CudaPlace(int cuda_device) {
  char bus[64] = {0};
  if (cudaError_t e = cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device); e != cudaSuccess) {
    return absl::StrCat("cuda:", cuda_device, ", whose PCI bus id cannot be read (",
                        cudaGetErrorName(e), ")");
  }
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0)
    return absl::StrCat("cuda:", cuda_device, ", on a host without a name");
  return absl::StrCat("nccl host=", host, " gpu=", bus);
}

absl::StatusOr<std::unique_ptr<GradientReducer>> CreateNcclReducer(const ReducerOptions& options,
                                                                   int cuda_device,
                                                                   CoordinatorStore& store,
                                                                   absl::Time deadline) {
  RETURN_IF_ERROR(CheckReducerOptions(options));
  auto reducer = std::make_unique<NcclReducer>(options, cuda_device);
  RETURN_IF_ERROR(reducer->Connect(store, deadline));
  return reducer;
}

}  // namespace pipetrain::stage_server::collective
