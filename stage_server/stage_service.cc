#include "stage_server/stage_service.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/error_context.h"
#include "common/frame_proto.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/model/transformer_config.h"
#include "common/model/precision.h"
#include "common/status_macros.h"
#include "grpcpp/health_check_service_interface.h"

namespace pipetrain::stage_server {

namespace pb = ::pipetrain::v1;

compute::OptimizerSettings OptimizerFromProto(const pb::OptimizerConfig& o) {
  // Zero is no sensible value for beta1, beta2 and eps, so it means "default".
  constexpr compute::OptimizerSettings kDefaults = compute::kStageOptimizerDefaults;
  compute::OptimizerSettings settings;
  settings.lr = o.lr();
  settings.beta1 = o.beta1() > 0 ? o.beta1() : kDefaults.beta1;
  settings.beta2 = o.beta2() > 0 ? o.beta2() : kDefaults.beta2;
  settings.eps = o.eps() > 0 ? o.eps() : kDefaults.eps;
  settings.weight_decay = o.weight_decay();
  settings.grad_clip_norm = o.grad_clip_norm();
  return settings;
}

absl::StatusOr<JobConfig> JobConfigFromProto(const pb::ConfigureRequest& r) {
  JobConfig c;
  c.job_id = r.job_id();
  c.stage = r.stage();
  c.num_stages = r.num_stages();
  ASSIGN_OR_RETURN(c.model, model::ConfigFromProto(r.model()));
  std::vector<pb::LayerRange> ranges(r.chunks().begin(), r.chunks().end());
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].chunk() != i) {
      return absl::InvalidArgumentError(absl::StrCat(
          "field chunks[", i, "].chunk is ", ranges[i].chunk(), "; chunks must be listed 0, 1, ..."));
    }
    c.chunks.push_back({ranges[i].begin_layer(), ranges[i].end_layer()});
  }
  c.seed = r.seed();
  c.optimizer = OptimizerFromProto(r.optimizer());
  c.upstream_address = r.upstream_address();
  c.downstream_address = r.downstream_address();
  switch (r.placement()) {
    case pb::PLACEMENT_LOOPED:
      c.placement = schedule::Placement::kLooped;
      break;
    case pb::PLACEMENT_V:
      c.placement = schedule::Placement::kV;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("field placement has unknown value ", static_cast<int>(r.placement())));
  }
  if (r.chunk_recompute_size() != 0 && r.chunk_recompute_size() != r.chunks_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field chunk_recompute has ", r.chunk_recompute_size(), " entries for ", r.chunks_size(),
        " chunks (field chunks); give one per chunk, or none when no chunk recomputes"));
  }
  c.chunk_recompute.assign(r.chunk_recompute().begin(), r.chunk_recompute().end());
  absl::StatusOr<model::Precision> precision = model::PrecisionNamed(r.precision());
  if (!precision.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("field precision: ", precision.status().message()));
  }
  c.precision = *precision;
  if (r.frame_bytes() > 0) c.frame_bytes = r.frame_bytes();
  c.micro_batch_size = r.micro_batch_size();
  c.peer_secret = r.peer_secret();
  if (r.recv_deadline_ms() > 0) c.recv_timeout = absl::Milliseconds(r.recv_deadline_ms());
  c.snapshot_peer_address = r.snapshot_peer_address();
  c.snapshot_reserve_bytes = r.snapshot_reserve_bytes();
  c.replica = r.replica();
  c.replicas = std::max(1, r.replicas());
  c.rendezvous_prefix = r.rendezvous_prefix();
  c.shard_optimizer = r.shard_optimizer();
  return c;
}

namespace {

// A request's learning rate: unset keeps the default; 0 is a rate (a schedule's min_lr).
absl::StatusOr<std::optional<float>> LearningRateOf(bool has_lr, float lr) {
  if (!has_lr) return std::nullopt;
  if (!(lr >= 0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("field lr is ", lr, ", must be >= 0 and finite (or unset: the configured)"));
  }
  return lr;
}

}  // namespace

absl::StatusOr<StepRequest> StepRequestFromProto(const pb::RunStepRequest& r) {
  StepRequest s;
  s.job_id = r.job_id();
  if (r.step() < 0) return absl::InvalidArgumentError("field step must be >= 0");
  s.step = r.step();
  ASSIGN_OR_RETURN(s.program, schedule::FromProto(r.program()));
  for (int i = 0; i < r.tokens_size(); ++i) {
    ASSIGN_OR_RETURN(common::Tensor t, common::TensorFromProto(r.tokens(i), absl::StrCat("tokens[", i, "]")));
    s.inputs.tokens.push_back(std::move(t));
  }
  for (int i = 0; i < r.targets_size(); ++i) {
    ASSIGN_OR_RETURN(common::Tensor t,
                     common::TensorFromProto(r.targets(i), absl::StrCat("targets[", i, "]")));
    s.inputs.targets.push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(s.inputs.lr, LearningRateOf(r.has_lr(), r.lr()));
  s.inputs.defer_optimizer = r.defer_optimizer();
  s.snapshot = r.snapshot();
  return s;
}

absl::StatusOr<ApplyOptimizerRequest> ApplyOptimizerRequestFromProto(
    const pb::ApplyOptimizerRequest& r) {
  ApplyOptimizerRequest a;
  a.job_id = r.job_id();
  if (r.step() < 0) return absl::InvalidArgumentError("field step must be >= 0");
  a.step = r.step();
  a.global_grad_norm = r.global_grad_norm();
  ASSIGN_OR_RETURN(a.lr, LearningRateOf(r.has_lr(), r.lr()));
  return a;
}

void ActionTimingToProto(const ActionTiming& t, pb::ActionTiming* p) {
  *p->mutable_action() = schedule::ActionToProto(t.action);
  p->set_lane(t.link ? "link" : "compute");
  p->set_start_us(t.start_us);
  p->set_end_us(t.end_us);
  p->set_bytes(t.bytes);
  p->set_recompute_us(t.recompute_us);
  p->set_reduce_us(t.reduce_us);
  p->set_reduce_total_us(t.reduce_total_us);
}

void StepReportToProto(const StepReport& report, pb::RunStepResponse* out) {
  const StepResult& r = report.result;
  for (float l : r.losses) out->add_losses(l);
  for (const ActionTiming& t : r.timings) ActionTimingToProto(t, out->add_timings());
  out->set_peak_activation_bytes(r.peak_activation_bytes);
  out->set_peak_memory_bytes(report.peak_memory_bytes);
  out->set_bytes_sent(r.bytes_sent);
  out->set_bytes_received(r.bytes_received);
  out->set_grad_norm_sq(r.grad_norm_sq);
  out->set_emulated(report.emulated);
  out->set_snapshot_bytes(report.snapshots.bytes);
  out->set_snapshot_step(report.snapshots.newest_step);
}

absl::StatusOr<SnapshotMeta> SnapshotMetaFromProto(const pb::SnapshotInfo& info) {
  if (info.owner_stage() < 0) return absl::InvalidArgumentError("field info.owner_stage must be >= 0");
  if (info.step() < 0) return absl::InvalidArgumentError("field info.step must be >= 0");
  if (info.begin_layer() < 0 || info.end_layer() <= info.begin_layer()) {
    return absl::InvalidArgumentError(absl::StrCat("fields info.begin_layer ", info.begin_layer(),
                                                   " and info.end_layer ", info.end_layer(),
                                                   " are not a non-empty range"));
  }
  SnapshotMeta m;
  m.owner_stage = info.owner_stage();
  m.chunk = static_cast<int>(info.chunk());
  m.step = info.step();
  m.held = info.held();
  m.begin_layer = info.begin_layer();
  m.end_layer = info.end_layer();
  m.num_stages = info.num_stages();
  m.bytes = info.bytes();
  return m;
}

void SnapshotMetaToProto(const SnapshotMeta& m, pb::SnapshotInfo* out) {
  out->set_owner_stage(m.owner_stage);
  out->set_chunk(m.chunk);
  out->set_step(m.step);
  out->set_bytes(m.bytes);
  out->set_held(m.held);
  out->set_begin_layer(m.begin_layer);
  out->set_end_layer(m.end_layer);
  out->set_num_stages(m.num_stages);
}

namespace {

constexpr size_t kPieceBytes = size_t{4} << 20;
// A held snapshot is refused before buffering past this (or --memory-limit): a chunk can
// be no larger than what a stage may hold.
constexpr uint64_t kMaxChunkBytes = uint64_t{64} << 30;

// A chunk's bytes (an export, or a snapshot) as ChunkPieces of 4 MiB.
grpc::Status WriteChunkPieces(const std::string& job_id, uint32_t chunk, const std::string& bytes,
                              grpc::ServerWriter<pb::ChunkPiece>* writer) {
  for (size_t offset = 0; offset == 0 || offset < bytes.size(); offset += kPieceBytes) {
    pb::ChunkPiece piece;
    piece.set_job_id(job_id);
    piece.set_chunk(chunk);
    piece.set_offset(offset);
    piece.set_total_bytes(bytes.size());
    piece.set_data(bytes.data() + offset, std::min(kPieceBytes, bytes.size() - offset));
    if (!writer->Write(piece)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away");
    }
  }
  return grpc::Status::OK;
}

// A chunk's bytes from its pieces, `first` and the rest of `reader`'s: each continues the
// one before (same job, chunk and total, the next offset), and they add up to the total.
absl::StatusOr<std::string> ReadChunkPieces(pb::ChunkPiece first,
                                            grpc::ServerReader<pb::ChunkPiece>* reader) {
  const std::string job_id = first.job_id();
  const uint32_t chunk = first.chunk();
  const uint64_t total = first.total_bytes();
  const common::ErrorContext about = common::ErrorContext("import").Job(job_id).Chunk(chunk);
  std::string bytes;
  bytes.reserve(total);
  pb::ChunkPiece piece = std::move(first);
  do {
    if (piece.job_id() != job_id || piece.chunk() != chunk || piece.total_bytes() != total ||
        piece.offset() != bytes.size() || bytes.size() + piece.data().size() > total) {
      return about.Error(absl::StatusCode::kInvalidArgument,
                         absl::StrCat("piece at offset ", piece.offset(),
                                      " does not continue the chunk (expected offset ",
                                      bytes.size(), " of ", total, " bytes, same job and chunk)"));
    }
    bytes += piece.data();
  } while (reader->Read(&piece));
  if (bytes.size() != total) {
    return about.Error(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("the stream ended after ", bytes.size(), " of ", total, " bytes"));
  }
  return bytes;
}

}  // namespace

grpc::Status StageService::Authorize(const grpc::ServerContext& context) const {
  grpc::Status s = runtime_->options().security.Authorize(context);
  if (!s.ok()) {
    common::LogWarning("stage", absl::StrCat("refused a control call from ", context.peer(), ": ",
                                             s.error_message()));
  }
  return s;
}

void StageService::SetServer(grpc::Server* server) {
  server_ = server;
  if (auto* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(kHealthService, runtime_->configured());
  }
}

grpc::Status StageService::Configure(grpc::ServerContext* context, const pb::ConfigureRequest* request,
                                     pb::ConfigureResponse* response) {
  return common::GuardHandler("Stage.Configure", *request, [&]() -> grpc::Status {
    if (grpc::Status denied = Authorize(*context); !denied.ok()) return denied;
    auto config = JobConfigFromProto(*request);
    if (!config.ok()) {
      return common::ToGrpcStatus(common::ErrorContext("configure")
                                      .Job(request->job_id())
                                      .Stage(request->stage())
                                      .Wrap(config.status()));
    }
    auto result = runtime_->Configure(*config);
    if (server_ && server_->GetHealthCheckService()) {
      server_->GetHealthCheckService()->SetServingStatus(kHealthService, runtime_->configured());
    }
    if (!result.ok()) {
      common::LogWarning("stage", std::string(result.status().message()));
      return common::ToGrpcStatus(result.status());
    }
    common::LogInfo("stage", absl::StrCat("configured job '", config->job_id, "' stage ",
                                          config->stage, " of ", config->num_stages));
    response->set_weight_bytes(result->weight_bytes);
    response->set_optimizer_bytes(result->optimizer_bytes);
    return grpc::Status::OK;
  });
}

grpc::Status StageService::RunStep(grpc::ServerContext* context, const pb::RunStepRequest* request,
                                   pb::RunStepResponse* response) {
  return common::GuardHandler("Stage.RunStep", *request, [&]() -> grpc::Status {
    if (grpc::Status denied = Authorize(*context); !denied.ok()) return denied;
    auto step = StepRequestFromProto(*request);
    if (!step.ok()) {
      return common::ToGrpcStatus(
          common::ErrorContext().Job(request->job_id()).Step(request->step()).Wrap(step.status()));
    }
    auto report = runtime_->RunStep(std::move(*step));
    if (!report.ok()) {
      common::LogWarning("stage", std::string(report.status().message()));
      return common::ToGrpcStatus(report.status());
    }
    response->set_job_id(request->job_id());
    response->set_step(request->step());
    StepReportToProto(*report, response);
    return grpc::Status::OK;
  });
}

grpc::Status StageService::ApplyOptimizer(grpc::ServerContext* context,
                                          const pb::ApplyOptimizerRequest* request,
                                          pb::ApplyOptimizerResponse* response) {
  return common::GuardHandler("Stage.ApplyOptimizer", *request, [&]() -> grpc::Status {
    if (grpc::Status denied = Authorize(*context); !denied.ok()) return denied;
    auto apply = ApplyOptimizerRequestFromProto(*request);
    if (!apply.ok()) {
      return common::ToGrpcStatus(common::ErrorContext("apply optimizer")
                                      .Job(request->job_id())
                                      .Step(request->step())
                                      .Wrap(apply.status()));
    }
    auto timing = runtime_->ApplyOptimizer(*apply);
    if (!timing.ok()) {
      common::LogWarning("stage", std::string(timing.status().message()));
      return common::ToGrpcStatus(timing.status());
    }
    response->set_job_id(request->job_id());
    response->set_step(request->step());
    ActionTimingToProto(*timing, response->mutable_timing());
    const SnapshotFigures snapshots = runtime_->snapshot_figures();
    response->set_snapshot_bytes(snapshots.bytes);
    response->set_snapshot_step(snapshots.newest_step);
    return grpc::Status::OK;
  });
}

grpc::Status StageService::ExportChunk(grpc::ServerContext* context,
                                       const pb::ExportChunkRequest* request,
                                       grpc::ServerWriter<pb::ChunkPiece>* writer) {
  return common::GuardHandler("Stage.ExportChunk", *request, [&]() -> grpc::Status {
    if (grpc::Status denied = Authorize(*context); !denied.ok()) return denied;
    auto bytes = runtime_->ExportChunk(request->job_id(), static_cast<int>(request->chunk()));
    if (!bytes.ok()) return common::ToGrpcStatus(bytes.status());
    return WriteChunkPieces(request->job_id(), request->chunk(), *bytes, writer);
  });
}

grpc::Status StageService::ImportChunk(grpc::ServerContext* context,
                                       grpc::ServerReader<pb::ChunkPiece>* reader,
                                       pb::ImportChunkResponse* response) {
  return common::GuardHandler("Stage.ImportChunk", [&]() -> grpc::Status {
    if (grpc::Status denied = Authorize(*context); !denied.ok()) return denied;
    pb::ChunkPiece first;
    if (!reader->Read(&first)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "import: the stream ended before its first piece");
    }
    const int chunk = static_cast<int>(first.chunk());
    // Refused by its declared size before a byte is buffered.
    absl::Status admitted = runtime_->AdmitImport(first.job_id(), chunk, first.total_bytes());
    if (!admitted.ok()) return common::ToGrpcStatus(admitted);
    const std::string job_id = first.job_id();
    absl::StatusOr<std::string> bytes = ReadChunkPieces(std::move(first), reader);
    if (!bytes.ok()) return common::ToGrpcStatus(bytes.status());
    absl::Status s = runtime_->ImportChunk(job_id, chunk, *bytes);
    if (!s.ok()) return common::ToGrpcStatus(s);
    response->set_bytes(bytes->size());
    return grpc::Status::OK;
  });
}

std::vector<pb::LinkPath> LinkPathProtos(StageRuntime& runtime) {
  std::vector<pb::LinkPath> out;
  for (const LinkPathInfo& link : runtime.LinkPaths()) {
    pb::LinkPath& l = out.emplace_back();
    l.set_peer_stage(link.peer_stage);
    l.set_sending(link.sending);
    l.set_receiving(link.receiving);
    l.set_bytes_sent(link.bytes_sent);
    l.set_bytes_sent_same_host(link.bytes_sent_same_host);
  }
  return out;
}

grpc::Status StageService::GetStats(grpc::ServerContext* context, const pb::GetStatsRequest*,
                                    pb::StageStats* response) {
  return common::GuardHandler("Stage.GetStats", [&]() -> grpc::Status {
    if (grpc::Status denied = Authorize(*context); !denied.ok()) return denied;
    const RuntimeStats s = runtime_->Stats();
    response->set_job_id(s.job_id);
    response->set_memory_used_bytes(s.memory_used_bytes);
    response->set_memory_limit_bytes(s.memory_limit_bytes);
    response->set_bytes_sent(s.bytes_sent);
    response->set_bytes_received(s.bytes_received);
    response->set_steps_run(s.steps_run);
    response->set_last_step_bytes_sent(s.last_step_bytes_sent);
    response->set_last_step_bytes_received(s.last_step_bytes_received);
    for (pb::LinkPath& link : LinkPathProtos(*runtime_)) *response->add_links() = std::move(link);
    return grpc::Status::OK;
  });
}

grpc::Status StageService::CalibrateRing(const pb::CalibrateRequest& request,
                                         pb::CalibrateResponse& response) {
  const pb::RingCalibration& r = request.ring();
  absl::StatusOr<StageRuntime::RingTime> t = runtime_->CalibrateRing(
      {.calibration_id = r.calibration_id(), .rendezvous_prefix = r.rendezvous_prefix(),
       .rank = r.rank(), .size = r.size(), .bytes = r.bytes(),
       .repetitions = request.repetitions()});
  if (!t.ok()) return common::ToGrpcStatus(t.status());
  response.set_allreduce_s(t->allreduce_s);
  response.set_emulated(t->emulated);
  response.set_repetitions(request.repetitions());
  return grpc::Status::OK;
}

grpc::Status StageService::CalibrateTransfer(const pb::CalibrateRequest& request,
                                             pb::CalibrateResponse& response) {
  const pb::TransferCalibration& t = request.transfer();
  absl::StatusOr<LinkTimes> times = runtime_->CalibrateTransfer(
      {.calibration_id = t.calibration_id(), .peer_secret = t.peer_secret(), .send = t.send(),
       .peer_address = t.peer_address(), .bytes = t.bytes(),
       .repetitions = request.repetitions()});
  if (!times.ok()) return common::ToGrpcStatus(times.status());
  response.set_transfer_s_per_byte(times->transfer_s_per_byte);
  response.set_send_busy_s(times->send_busy_s);
  response.set_repetitions(request.repetitions());
  return grpc::Status::OK;
}

grpc::Status StageService::Calibrate(grpc::ServerContext* context,
                                     const pb::CalibrateRequest* request,
                                     pb::CalibrateResponse* response) {
  return common::GuardHandler("Stage.Calibrate", [&]() -> grpc::Status {
    if (grpc::Status denied = Authorize(*context); !denied.ok()) return denied;
    if (request->has_ring()) return CalibrateRing(*request, *response);
    if (request->has_transfer()) return CalibrateTransfer(*request, *response);
    absl::StatusOr<model::TransformerConfig> config = model::ConfigFromProto(request->model());
    if (!config.ok()) return common::ToGrpcStatus(common::ErrorContext("calibrate").Wrap(config.status()));
    absl::StatusOr<model::Precision> precision =
        model::PrecisionNamed(request->precision().empty() ? "fp32" : request->precision());
    if (!precision.ok()) {
      return common::ToGrpcStatus(common::ErrorContext("calibrate: precision").Wrap(precision.status()));
    }
    absl::StatusOr<CalibrationResult> r =
        runtime_->Calibrate(*config, *precision, request->rows(), request->repetitions());
    if (!r.ok()) return common::ToGrpcStatus(r.status());
    response->set_forward_s_per_flop(r->forward_s_per_flop);
    response->set_backward_input_s_per_flop(r->backward_input_s_per_flop);
    response->set_backward_weight_s_per_flop(r->backward_weight_s_per_flop);
    response->set_optimizer_s_per_param(r->optimizer_s_per_param);
    response->set_repetitions(r->repetitions);
    return grpc::Status::OK;
  });
}

grpc::Status StageService::HoldSnapshot(grpc::ServerContext* context,
                                        grpc::ServerReader<pb::SnapshotPiece>* reader,
                                        pb::HoldSnapshotResponse* response) {
  return common::GuardHandler("Stage.HoldSnapshot", [&]() -> grpc::Status {
    const uint64_t limit = runtime_->options().memory_limit_bytes;
    SnapshotAssembler assembler(limit > 0 ? std::min(limit, kMaxChunkBytes) : kMaxChunkBytes);
    pb::SnapshotPiece piece;
    std::string secret;
    while (reader->Read(&piece)) {
      auto meta = SnapshotMetaFromProto(piece.info());
      if (!meta.ok()) {
        return common::ToGrpcStatus(
            common::ErrorContext(absl::StrCat("snapshot push from ", context->peer()))
                .Job(piece.job_id())
                .Wrap(meta.status()));
      }
      if (!assembler.started()) {
        // Admitted before a byte is buffered, as an Exchange stream is by its hello.
        absl::Status admitted = runtime_->AdmitSnapshot(piece.job_id(), piece.peer_secret(), *meta);
        if (!admitted.ok()) {
          common::LogWarning("stage", absl::StrCat("refused a ", admitted.message(), " from ",
                                                   context->peer()));
          return common::ToGrpcStatus(admitted);
        }
        secret = piece.peer_secret();
      }
      absl::Status added = assembler.Add(piece.job_id(), *meta, piece.offset(), piece.data());
      if (!added.ok()) return common::ToGrpcStatus(added);
    }
    auto blob = assembler.Finish();
    if (!blob.ok()) return common::ToGrpcStatus(blob.status());
    const uint64_t bytes = (*blob)->size();
    absl::Status held = runtime_->HoldSnapshot(assembler.job_id(), secret, assembler.meta(),
                                               std::move(*blob));
    if (!held.ok()) return common::ToGrpcStatus(held);
    response->set_bytes(bytes);
    return grpc::Status::OK;
  });
}

grpc::Status StageService::ListSnapshots(grpc::ServerContext* context,
                                         const pb::ListSnapshotsRequest* request,
                                         pb::ListSnapshotsResponse* response) {
  return common::GuardHandler("Stage.ListSnapshots", *request, [&]() -> grpc::Status {
    if (grpc::Status denied = Authorize(*context); !denied.ok()) return denied;
    auto list = runtime_->ListSnapshots(request->job_id());
    if (!list.ok()) return common::ToGrpcStatus(list.status());
    for (const SnapshotMeta& m : *list) SnapshotMetaToProto(m, response->add_snapshots());
    return grpc::Status::OK;
  });
}

grpc::Status StageService::FetchSnapshot(grpc::ServerContext* context,
                                         const pb::FetchSnapshotRequest* request,
                                         grpc::ServerWriter<pb::ChunkPiece>* writer) {
  return common::GuardHandler("Stage.FetchSnapshot", *request, [&]() -> grpc::Status {
    if (grpc::Status denied = Authorize(*context); !denied.ok()) return denied;
    auto blob = runtime_->FetchSnapshot(
        request->job_id(), request->owner_stage(), static_cast<int>(request->chunk()),
        request->step(), request->has_held() ? std::optional<bool>(request->held()) : std::nullopt);
    if (!blob.ok()) return common::ToGrpcStatus(blob.status());
    // The shared blob stays alive while it is written, even if a newer step drops it.
    return WriteChunkPieces(request->job_id(), request->chunk(), **blob, writer);
  });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StageService::Exchange(
    grpc::CallbackServerContext* context) {
  return runtime_->acceptor().Accept(context);
}

}  // namespace pipetrain::stage_server
