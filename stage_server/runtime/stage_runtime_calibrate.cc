// StageRuntime::Calibrate: the stage's own calibration for the coordinator's automatic
// planner (stage_server/calibration/calibration.h), on the device a job of that model would use.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/byte_format.h"
#include "common/channel_args.h"
#include "grpcpp/create_channel.h"
#include "common/status_macros.h"
#include "stage_server/exec/backend_chunk.h"
#include "stage_server/collective/reducer_choice.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/exec/emulated_chunk.h"
#include "stage_server/calibration/link_calibration.h"
#include "stage_server/runtime/stage_runtime.h"

#include "common/address.h"

namespace pipetrain::stage_server {

namespace {
// Every member's connecting and each all-reduce: the coordinator calls them together.
constexpr absl::Duration kRingDeadline = absl::Seconds(30);
// The sender may call before the receiver expects it, and asks again this often.
constexpr absl::Duration kLinkRetry = absl::Milliseconds(20);

PeerLinkOptions CalibrationLinkOptions(const StageRuntime::TransferCalibration& t) {
  PeerLinkOptions o;
  o.job_id = t.calibration_id;
  o.local_stage = t.send ? 0 : 1;
  o.peer_stage = t.send ? 1 : 0;
  o.peer_address = t.send ? t.peer_address : "the calibrating sender";
  o.limits.max_tensor_bytes = std::max<uint64_t>(t.bytes, sizeof(float));
  return o;
}

// The sender's link, pinged: a receiver that does not expect it yet refuses the stream
// (NOT_FOUND), so any failure but a wrong secret is asked again until the deadline.
absl::StatusOr<std::unique_ptr<PeerLink>> ConnectCalibrationLink(
    const StageRuntime::TransferCalibration& t, const PeerLinkOptions& options,
    const common::RpcSecurity& security, absl::Time deadline) {
  auto channel = grpc::CreateCustomChannel(t.peer_address, security.ChannelCredentials(),
                                           common::ChannelArgumentsFor(common::ChannelUse::kPeerLink));
  for (;;) {
    ASSIGN_OR_RETURN(std::unique_ptr<PeerLink> link,
                     ConnectPeerLink(channel, options, t.peer_secret, deadline));
    absl::Status ping = PingLink(*link, t.calibration_id, deadline);
    if (ping.ok()) return link;
    if (ping.code() == absl::StatusCode::kPermissionDenied ||
        absl::Now() + kLinkRetry >= deadline) {
      return ping;
    }
    link.reset();
    absl::SleepFor(kLinkRetry);
  }
}
}  // namespace

absl::StatusOr<CalibrationResult> StageRuntime::Calibrate(const model::TransformerConfig& config,
                                                          const model::Precision& precision,
                                                          int rows, int repetitions) {
  if (rows < 1 || rows > kMaxCalibrationRows || repetitions < 1 ||
      repetitions > kMaxCalibrationRepetitions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibrate: rows (", rows, ") must be in [1, ", kMaxCalibrationRows,
        "] and repetitions (", repetitions, ") in [1, ", kMaxCalibrationRepetitions, "]"));
  }
  const int begin = kCalibrationLayer, end = kCalibrationLayer + 1;
  if (config.num_pipeline_layers() <= end) {
    return absl::InvalidArgumentError("calibrate: the model has no transformer block");
  }
  // One step at a time: a calibration waits for a running step and runs alone.
  absl::MutexLock lock(&mu_);
  auto pool = std::make_shared<common::BufferPool>();
  if (options_.device.kind == DeviceSpec::Kind::kEmulated) {
    ASSIGN_OR_RETURN(EmulatedDevice device, EmulatedDeviceByName(options_.device.emulated));
    device.shared = options_.device.shared;
    EmulatedChunk chunk(config, begin, end, rows, device, false, pool, precision);
    return CalibrateBlock(chunk, config, precision, rows, repetitions);
  }
  const uint64_t needed = BackendChunk::BufferBytes(config, begin, end, rows);
  if (options_.memory_limit_bytes > 0 && needed > options_.memory_limit_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "calibrate: one block at ", rows, " rows needs ", common::FormatBytes(needed),
        ", more than this stage's --memory-limit ", common::FormatBytes(options_.memory_limit_bytes)));
  }
  std::unique_ptr<compute::Backend> backend;
  if (options_.device.kind == DeviceSpec::Kind::kCuda) {
    ASSIGN_OR_RETURN(backend, compute::CreateCudaBackend(options_.device.cuda_index));
  } else {
    ASSIGN_OR_RETURN(backend, compute::CpuBackend::Create(options_.threads));
  }
  RETURN_IF_ERROR(backend->SetProductOperands(precision.products));
  ASSIGN_OR_RETURN(auto layers,
                   compute::ModelChunk::Create(config, begin, end, backend.get(),
                                               {.recompute = false,
                                                .boundary = precision.activations}));
  RETURN_IF_ERROR(layers->Initialize(/*seed=*/1));
  ASSIGN_OR_RETURN(std::unique_ptr<BackendChunk> chunk,
                   BackendChunk::Create(std::move(layers), rows, pool));
  absl::StatusOr<CalibrationResult> result =
      CalibrateBlock(*chunk, config, precision, rows, repetitions);
  chunk.reset();  // before its backend
  return result;
}

namespace {

// A calibration request's field out of range: the request's name, the field as the
// Calibrate message names it, its value and what it must be.
template <typename T>
absl::Status BadField(absl::string_view what, absl::string_view id, absl::string_view field,
                      const T& value, absl::string_view must) {
  return absl::InvalidArgumentError(absl::StrCat("calibrate ", what, " ", id, ": ", field, " (",
                                                 value, ") ", must));
}

absl::Status CheckBytes(absl::string_view what, absl::string_view id, absl::string_view field,
                        uint64_t bytes) {
  if (bytes > 0 && bytes % sizeof(float) == 0 &&
      bytes <= StageRuntime::kMaxRingCalibrationBytes) {
    return absl::OkStatus();
  }
  return BadField(what, id, field, bytes,
                  absl::StrCat("must be a multiple of 4 in [4, ",
                               StageRuntime::kMaxRingCalibrationBytes, "]"));
}

absl::Status CheckRepetitions(absl::string_view what, absl::string_view id, int repetitions) {
  if (repetitions >= 1 && repetitions <= StageRuntime::kMaxCalibrationRepetitions) {
    return absl::OkStatus();
  }
  return BadField(what, id, "repetitions", repetitions,
                  absl::StrCat("must be in [1, ", StageRuntime::kMaxCalibrationRepetitions, "]"));
}

}  // namespace

absl::Status StageRuntime::CheckRing(const RingCalibration& r) {
  const std::string& id = r.calibration_id;
  if (id.empty()) return absl::InvalidArgumentError("calibrate ring: ring.calibration_id is empty");
  if (r.size < 2 || r.size > 1024) {
    return BadField("ring", id, "ring.size", r.size, "must be in [2, 1024]");
  }
  if (r.rank < 0 || r.rank >= r.size) {
    return BadField("ring", id, "ring.rank", r.rank, absl::StrCat("must be in [0, ", r.size, ")"));
  }
  RETURN_IF_ERROR(CheckBytes("ring", id, "ring.bytes", r.bytes));
  return CheckRepetitions("ring", id, r.repetitions);
}

absl::Status StageRuntime::CheckTransfer(const TransferCalibration& t) {
  const std::string& id = t.calibration_id;
  if (id.empty()) {
    return absl::InvalidArgumentError("calibrate transfer: transfer.calibration_id is empty");
  }
  if (t.peer_secret.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibrate transfer ", id, ": transfer.peer_secret is empty"));
  }
  RETURN_IF_ERROR(CheckBytes("transfer", id, "transfer.bytes", t.bytes));
  RETURN_IF_ERROR(CheckRepetitions("transfer", id, t.repetitions));
  if (!t.send) return absl::OkStatus();
  // A sender would try to connect to it until its deadline: an address that is none is
  // refused now.
  absl::StatusOr<common::HostPort> peer =
      common::ParseHostPort(t.peer_address, 0, "transfer.peer_address");
  if (!peer.ok() || peer->port <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibrate transfer ", id, ": transfer.peer_address '", t.peer_address,
        "' is not HOST:PORT with a port in [1, 65535]",
        peer.ok() ? "" : absl::StrCat(" (", peer.status().message(), ")")));
  }
  return absl::OkStatus();
}

absl::StatusOr<StageRuntime::RingTime> StageRuntime::CalibrateRing(const RingCalibration& ring) {
  RETURN_IF_ERROR(CheckRing(ring));
  if (options_.device.kind == DeviceSpec::Kind::kEmulated) return RingTime{0, true};
  // The library a job's replicas on these stages would choose (gloo or NCCL).
  ASSIGN_OR_RETURN(collective::ChosenReducer chosen,
                   collective::CreateReducer(RingOptions(ring.calibration_id,
                                                         ring.rendezvous_prefix, ring.rank,
                                                         ring.size, kRingDeadline),
                                             CudaIndexOf(options_.device)));
  ASSIGN_OR_RETURN(const double seconds, TimeAllReduce(*chosen.reducer, ring.bytes,
                                                       ring.repetitions, kRingDeadline));
  return RingTime{seconds, false};
}

absl::StatusOr<LinkTimes> StageRuntime::CalibrateTransfer(const TransferCalibration& t) {
  RETURN_IF_ERROR(CheckTransfer(t));
  const absl::Time deadline = absl::Now() + t.deadline;
  if (t.send) {
    ASSIGN_OR_RETURN(std::unique_ptr<PeerLink> link,
                     ConnectCalibrationLink(t, WithTransport(CalibrationLinkOptions(t)),
                                            options_.security, deadline));
    return TimeLink(*link, t.calibration_id, t.bytes, t.repetitions, deadline);
  }
  acceptor_.Expect(WithTransport(CalibrationLinkOptions(t)), t.peer_secret);
  absl::StatusOr<std::unique_ptr<PeerLink>> link =
      acceptor_.WaitForPeer(t.calibration_id, /*peer_stage=*/0, deadline);
  acceptor_.Forget(t.calibration_id);
  if (!link.ok()) return link.status();
  RETURN_IF_ERROR(AnswerLink(**link, t.calibration_id, t.repetitions, deadline));
  return LinkTimes{};
}

}  // namespace pipetrain::stage_server
