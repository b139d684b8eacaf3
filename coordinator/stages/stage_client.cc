#include "coordinator/stages/stage_client.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/channel_args.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

namespace {
constexpr absl::Duration kConnectWait = absl::Seconds(10);
}  // namespace

void StageClient::Prepare(grpc::ClientContext& ctx, absl::Duration deadline) const {
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  security_.AddToken(ctx);
}

StageClient::StageClient(std::string address, common::RpcSecurity security)
    : address_(std::move(address)), security_(std::move(security)) {
  channel_ =
      grpc::CreateCustomChannel(address_, security_.ChannelCredentials(),
                                common::ChannelArgumentsFor(common::ChannelUse::kStageControl));
  stub_ = pb::Stage::NewStub(channel_);
  health_ = grpc::health::v1::Health::NewStub(channel_);
}

absl::Status StageClient::Annotate(const grpc::Status& status, const char* call) const {
  if (status.ok()) return absl::OkStatus();
  absl::Status s = common::FromGrpcStatus(status);
  return absl::Status(s.code(), absl::StrCat(call, " on ", address_, ": ", s.message()));
}

absl::StatusOr<pb::ConfigureResponse> StageClient::Configure(const pb::ConfigureRequest& request,
                                                             absl::Duration deadline) {
  const absl::Duration connect = std::min(deadline, kConnectWait);
  if (!channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + connect))) {
    return absl::UnavailableError(absl::StrCat(
        "Configure on ", address_, ": cannot connect within ", absl::FormatDuration(connect)));
  }
  grpc::ClientContext ctx;
  Prepare(ctx, deadline);
  pb::ConfigureResponse response;
  if (absl::Status s = Annotate(stub_->Configure(&ctx, request, &response), "Configure"); !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<pb::RunStepResponse> StageClient::RunStep(grpc::ClientContext& ctx,
                                                         const pb::RunStepRequest& request) {
  security_.AddToken(ctx);
  pb::RunStepResponse response;
  if (absl::Status s = Annotate(stub_->RunStep(&ctx, request, &response), "RunStep"); !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<pb::ApplyOptimizerResponse> StageClient::ApplyOptimizer(
    grpc::ClientContext& ctx, const pb::ApplyOptimizerRequest& request) {
  security_.AddToken(ctx);
  pb::ApplyOptimizerResponse response;
  if (absl::Status s =
          Annotate(stub_->ApplyOptimizer(&ctx, request, &response), "ApplyOptimizer");
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<std::string> StageClient::ExportChunk(const std::string& job_id, int chunk,
                                                     absl::Duration deadline) {
  grpc::ClientContext ctx;
  Prepare(ctx, deadline);
  pb::ExportChunkRequest request;
  request.set_job_id(job_id);
  request.set_chunk(chunk);
  auto reader = stub_->ExportChunk(&ctx, request);
  return ReadPieces(ctx, *reader, "ExportChunk");
}

absl::StatusOr<std::string> StageClient::ReadPieces(grpc::ClientContext& ctx,
                                                    grpc::ClientReader<pb::ChunkPiece>& reader,
                                                    const char* call) const {
  std::string bytes;
  pb::ChunkPiece piece;
  while (reader.Read(&piece)) {
    if (piece.offset() != bytes.size()) {
      ctx.TryCancel();
      reader.Finish();
      return absl::DataLossError(absl::StrCat(call, " on ", address_, ": piece at offset ",
                                              piece.offset(), ", expected ", bytes.size()));
    }
    if (bytes.empty()) bytes.reserve(piece.total_bytes());
    bytes += piece.data();
  }
  if (absl::Status s = Annotate(reader.Finish(), call); !s.ok()) return s;
  return bytes;
}

absl::StatusOr<std::vector<pb::SnapshotInfo>> StageClient::ListSnapshots(const std::string& job_id,
                                                                         absl::Duration deadline) {
  grpc::ClientContext ctx;
  Prepare(ctx, deadline);
  pb::ListSnapshotsRequest request;
  request.set_job_id(job_id);
  pb::ListSnapshotsResponse response;
  if (absl::Status s = Annotate(stub_->ListSnapshots(&ctx, request, &response), "ListSnapshots");
      !s.ok()) {
    return s;
  }
  return std::vector<pb::SnapshotInfo>(response.snapshots().begin(), response.snapshots().end());
}

absl::StatusOr<std::string> StageClient::FetchSnapshot(const std::string& job_id, int owner_stage,
                                                       int chunk, int64_t step,
                                                       absl::Duration deadline,
                                                       std::optional<bool> held) {
  grpc::ClientContext ctx;
  Prepare(ctx, deadline);
  pb::FetchSnapshotRequest request;
  request.set_job_id(job_id);
  request.set_owner_stage(owner_stage);
  request.set_chunk(chunk);
  request.set_step(step);
  if (held) request.set_held(*held);
  auto reader = stub_->FetchSnapshot(&ctx, request);
  return ReadPieces(ctx, *reader, "FetchSnapshot");
}

absl::Status StageClient::ImportChunk(const std::string& job_id, int chunk,
                                      const std::string& bytes, absl::Duration deadline) {
  grpc::ClientContext ctx;
  Prepare(ctx, deadline);
  pb::ImportChunkResponse response;
  auto writer = stub_->ImportChunk(&ctx, &response);
  constexpr size_t kPiece = size_t{4} << 20;
  for (size_t at = 0; at == 0 || at < bytes.size(); at += kPiece) {
    pb::ChunkPiece piece;
    piece.set_job_id(job_id);
    piece.set_chunk(chunk);
    piece.set_offset(at);
    piece.set_total_bytes(bytes.size());
    piece.set_data(bytes.substr(at, kPiece));
    if (!writer->Write(piece)) break;  // Finish says why
  }
  writer->WritesDone();
  return Annotate(writer->Finish(), "ImportChunk");
}

absl::StatusOr<pb::CalibrateResponse> StageClient::Calibrate(const pb::CalibrateRequest& request,
                                                             absl::Duration deadline) {
  grpc::ClientContext ctx;
  Prepare(ctx, deadline);
  pb::CalibrateResponse response;
  if (absl::Status s = Annotate(stub_->Calibrate(&ctx, request, &response), "Calibrate");
      !s.ok()) {
    return s;
  }
  return response;
}

absl::Status StageClient::Ping(absl::Duration deadline) {
  grpc::ClientContext ctx;
  Prepare(ctx, deadline);
  grpc::health::v1::HealthCheckRequest request;  // the server as a whole
  grpc::health::v1::HealthCheckResponse response;
  return Annotate(health_->Check(&ctx, request, &response), "health check");
}

}  // namespace pipetrain::coordinator
