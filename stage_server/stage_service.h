// The Stage gRPC service: translates proto messages to and from StageRuntime calls
// and maps statuses; Exchange streams go to the runtime's link acceptor. Health
// (service "pipetrain.v1.Stage") is NOT_SERVING until a job is configured. Control calls
// need the runtime's bearer token when it has one; Exchange streams are admitted by
// their job's peer_secret instead.
#pragma once

#include "grpcpp/server.h"
#include "pipetrain/v1/stage.grpc.pb.h"
#include "stage_server/runtime/stage_runtime.h"

namespace pipetrain::stage_server {

// The configured job's peer links as GetStats and the heartbeats report them.
std::vector<pipetrain::v1::LinkPath> LinkPathProtos(StageRuntime& runtime);

class StageService final
    : public pipetrain::v1::Stage::WithRawCallbackMethod_Exchange<pipetrain::v1::Stage::Service> {
 public:
  explicit StageService(StageRuntime* runtime) : runtime_(runtime) {}
  // Where to report health; set once the server is built.
  void SetServer(grpc::Server* server);

  grpc::Status Configure(grpc::ServerContext* context,
                         const pipetrain::v1::ConfigureRequest* request,
                         pipetrain::v1::ConfigureResponse* response) override;
  grpc::Status RunStep(grpc::ServerContext* context, const pipetrain::v1::RunStepRequest* request,
                       pipetrain::v1::RunStepResponse* response) override;
  grpc::Status ApplyOptimizer(grpc::ServerContext* context,
                              const pipetrain::v1::ApplyOptimizerRequest* request,
                              pipetrain::v1::ApplyOptimizerResponse* response) override;
  grpc::Status ExportChunk(grpc::ServerContext* context,
                           const pipetrain::v1::ExportChunkRequest* request,
                           grpc::ServerWriter<pipetrain::v1::ChunkPiece>* writer) override;
  grpc::Status ImportChunk(grpc::ServerContext* context,
                           grpc::ServerReader<pipetrain::v1::ChunkPiece>* reader,
                           pipetrain::v1::ImportChunkResponse* response) override;
  grpc::Status Calibrate(grpc::ServerContext* context,
                         const pipetrain::v1::CalibrateRequest* request,
                         pipetrain::v1::CalibrateResponse* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const pipetrain::v1::GetStatsRequest* request,
                        pipetrain::v1::StageStats* response) override;
  // A peer's push: admitted on its first piece (job, peer_secret, ring predecessor),
  // before anything is buffered; held only once every piece arrived.
  grpc::Status HoldSnapshot(grpc::ServerContext* context,
                            grpc::ServerReader<pipetrain::v1::SnapshotPiece>* reader,
                            pipetrain::v1::HoldSnapshotResponse* response) override;
  grpc::Status ListSnapshots(grpc::ServerContext* context,
                             const pipetrain::v1::ListSnapshotsRequest* request,
                             pipetrain::v1::ListSnapshotsResponse* response) override;
  grpc::Status FetchSnapshot(grpc::ServerContext* context,
                             const pipetrain::v1::FetchSnapshotRequest* request,
                             grpc::ServerWriter<pipetrain::v1::ChunkPiece>* writer) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Exchange(
      grpc::CallbackServerContext* context) override;

  static constexpr char kHealthService[] = "pipetrain.v1.Stage";

 private:
  grpc::Status Authorize(const grpc::ServerContext& context) const;
  // Calibrate with a ring (the replicas' all-reduce) or a transfer (one link) instead of
  // a block.
  grpc::Status CalibrateRing(const pipetrain::v1::CalibrateRequest& request,
                             pipetrain::v1::CalibrateResponse& response);
  grpc::Status CalibrateTransfer(const pipetrain::v1::CalibrateRequest& request,
                                 pipetrain::v1::CalibrateResponse& response);

  StageRuntime* runtime_;
  grpc::Server* server_ = nullptr;
};

// Proto -> runtime translation (exposed for tests). Errors name the field.
absl::StatusOr<JobConfig> JobConfigFromProto(const pipetrain::v1::ConfigureRequest& request);
// Fields left 0 where 0 is no sensible value (beta1, beta2, eps) take
// compute::kStageOptimizerDefaults'.
compute::OptimizerSettings OptimizerFromProto(const pipetrain::v1::OptimizerConfig& optimizer);
absl::StatusOr<StepRequest> StepRequestFromProto(const pipetrain::v1::RunStepRequest& request);
void StepReportToProto(const StepReport& report, pipetrain::v1::RunStepResponse* response);
absl::StatusOr<ApplyOptimizerRequest> ApplyOptimizerRequestFromProto(
    const pipetrain::v1::ApplyOptimizerRequest& request);
void ActionTimingToProto(const ActionTiming& timing, pipetrain::v1::ActionTiming* out);
// INVALID_ARGUMENT naming the field for a negative stage, step or layer.
absl::StatusOr<SnapshotMeta> SnapshotMetaFromProto(const pipetrain::v1::SnapshotInfo& info);
void SnapshotMetaToProto(const SnapshotMeta& meta, pipetrain::v1::SnapshotInfo* out);

}  // namespace pipetrain::stage_server
