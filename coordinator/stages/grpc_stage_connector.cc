#include "coordinator/stages/grpc_stage_connector.h"

#include <utility>

#include "coordinator/stages/stage_client.h"
#include "grpcpp/client_context.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;

// `make`'s call on a context carrying `call`'s deadline, cancelled when `call` is.
template <typename Call>
auto Cancellable(CallControl& call, const Call& make) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(call.deadline()));
  call.SetCanceller([&ctx] { ctx.TryCancel(); });
  auto result = make(ctx);
  call.SetCanceller(nullptr);  // before ctx goes away
  return result;
}

class GrpcStageConnection : public StageConnection {
 public:
  GrpcStageConnection(const std::string& address, const common::RpcSecurity& security)
      : client_(address, security) {}

  const std::string& address() const override { return client_.address(); }
  absl::StatusOr<pb::ConfigureResponse> Configure(const pb::ConfigureRequest& request,
                                                  absl::Duration deadline) override {
    return client_.Configure(request, deadline);
  }
  absl::StatusOr<pb::RunStepResponse> RunStep(CallControl& call,
                                              const pb::RunStepRequest& request) override {
    return Cancellable(call, [&](grpc::ClientContext& ctx) { return client_.RunStep(ctx, request); });
  }
  absl::StatusOr<pb::ApplyOptimizerResponse> ApplyOptimizer(
      CallControl& call, const pb::ApplyOptimizerRequest& request) override {
    return Cancellable(call,
                       [&](grpc::ClientContext& ctx) { return client_.ApplyOptimizer(ctx, request); });
  }
  absl::StatusOr<std::string> ExportChunk(const std::string& job_id, int chunk,
                                          absl::Duration deadline) override {
    return client_.ExportChunk(job_id, chunk, deadline);
  }
  absl::Status ImportChunk(const std::string& job_id, int chunk, const std::string& bytes,
                           absl::Duration deadline) override {
    return client_.ImportChunk(job_id, chunk, bytes, deadline);
  }
  absl::StatusOr<std::vector<pb::SnapshotInfo>> ListSnapshots(const std::string& job_id,
                                                              absl::Duration deadline) override {
    return client_.ListSnapshots(job_id, deadline);
  }
  absl::StatusOr<std::string> FetchSnapshot(const std::string& job_id, int owner_stage, int chunk,
                                            int64_t step, std::optional<bool> held,
                                            absl::Duration deadline) override {
    return client_.FetchSnapshot(job_id, owner_stage, chunk, step, deadline, held);
  }
  absl::Status Ping(absl::Duration deadline) override { return client_.Ping(deadline); }
  absl::StatusOr<pb::CalibrateResponse> Calibrate(const pb::CalibrateRequest& request,
                                                  absl::Duration deadline) override {
    return client_.Calibrate(request, deadline);
  }

 private:
  StageClient client_;
};

}  // namespace

std::unique_ptr<StageConnection> GrpcStageConnector::Connect(const std::string& address) {
  return std::make_unique<GrpcStageConnection>(address, security_);
}

std::shared_ptr<StageConnector> ConnectorOrGrpc(std::shared_ptr<StageConnector> given,
                                                const common::RpcSecurity& security) {
  if (given != nullptr) return given;
  return std::make_shared<GrpcStageConnector>(security);
}

}  // namespace pipetrain::coordinator
