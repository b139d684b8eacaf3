// The coordinator's side of one stage server's API: each call has a deadline and
// returns absl::Status, with the stage's address in every error so the job's reason
// names the stage. Every call carries the coordinator's bearer token (the stages
// require it when they have --token-file) over TLS when configured. Translation only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc_security.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "pipetrain/v1/stage.grpc.pb.h"

namespace pipetrain::coordinator {

class StageClient {
 public:
  StageClient(std::string address, common::RpcSecurity security);

  const std::string& address() const { return address_; }
  // The job's first call on this client: it first waits (up to 10 s, within
  // `deadline`) for the connection, so that one failed connection attempt on a fresh
  // channel does not fail the job (gRPC would fail every call during its reconnect
  // backoff, and the stage would look dead although it is not).
  absl::StatusOr<pipetrain::v1::ConfigureResponse> Configure(
      const pipetrain::v1::ConfigureRequest& request, absl::Duration deadline);
  // `ctx` carries the deadline and lets another thread cancel the call.
  absl::StatusOr<pipetrain::v1::RunStepResponse> RunStep(
      grpc::ClientContext& ctx, const pipetrain::v1::RunStepRequest& request);
  // Phase 2 of a deferred step; `ctx` as for RunStep.
  absl::StatusOr<pipetrain::v1::ApplyOptimizerResponse> ApplyOptimizer(
      grpc::ClientContext& ctx, const pipetrain::v1::ApplyOptimizerRequest& request);
  // One model chunk's checkpoint file, reassembled from its pieces.
  absl::StatusOr<std::string> ExportChunk(const std::string& job_id, int chunk,
                                          absl::Duration deadline);
  absl::Status ImportChunk(const std::string& job_id, int chunk, const std::string& bytes,
                           absl::Duration deadline);
  // What the stage holds of the job's in-memory snapshots, own and held. It answers
  // while a step is stuck on the stage (the stage's snapshots have their own lock).
  absl::StatusOr<std::vector<pipetrain::v1::SnapshotInfo>> ListSnapshots(
      const std::string& job_id, absl::Duration deadline);
  // One snapshot blob (a chunk's checkpoint file, as ExportChunk gives), reassembled.
  absl::StatusOr<std::string> FetchSnapshot(const std::string& job_id, int owner_stage, int chunk,
                                            int64_t step, absl::Duration deadline,
                                            std::optional<bool> held = std::nullopt);
  // Whether the server answers at all (gRPC health), without waiting for a running step.
  absl::Status Ping(absl::Duration deadline);
  // A few passes of one block on the stage's device, for pipeline.schedule "auto".
  absl::StatusOr<pipetrain::v1::CalibrateResponse> Calibrate(
      const pipetrain::v1::CalibrateRequest& request, absl::Duration deadline);

 private:
  // Sets the deadline and adds the token.
  void Prepare(grpc::ClientContext& ctx, absl::Duration deadline) const;
  absl::Status Annotate(const grpc::Status& status, const char* call) const;
  // Reads a stream of ChunkPieces into one blob (ExportChunk, FetchSnapshot).
  absl::StatusOr<std::string> ReadPieces(grpc::ClientContext& ctx,
                                         grpc::ClientReader<pipetrain::v1::ChunkPiece>& reader,
                                         const char* call) const;

  std::string address_;
  const common::RpcSecurity security_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pipetrain::v1::Stage::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace pipetrain::coordinator
