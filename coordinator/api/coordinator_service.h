// The Coordinator gRPC service: translates between proto messages and the JobManager,
// and absl statuses into gRPC ones. Every request is authorized (with --token-file, it
// must carry the token) and then checked (request_checks.h) before the manager sees it;
// the service has no logic of its own.
#pragma once

#include "common/rpc_security.h"
#include "coordinator/jobs/job_manager.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::coordinator {

class CoordinatorService final : public pipetrain::v1::Coordinator::Service {
 public:
  // `security.token()`, when set, is required on every call.
  explicit CoordinatorService(JobManager* manager,
                              common::RpcSecurity security = common::RpcSecurity())
      : manager_(manager), security_(std::move(security)) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const pipetrain::v1::SubmitJobRequest*,
                         pipetrain::v1::SubmitJobResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const pipetrain::v1::GetJobRequest*,
                      pipetrain::v1::JobStatus*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const pipetrain::v1::ListJobsRequest*,
                        pipetrain::v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const pipetrain::v1::CancelJobRequest*,
                         pipetrain::v1::JobStatus*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const pipetrain::v1::WatchJobRequest*,
                        grpc::ServerWriter<pipetrain::v1::JobEvent>*) override;
  grpc::Status GetTimeline(grpc::ServerContext*, const pipetrain::v1::GetTimelineRequest*,
                           pipetrain::v1::Timeline*) override;
  grpc::Status GetCluster(grpc::ServerContext*, const pipetrain::v1::GetClusterRequest*,
                          pipetrain::v1::ClusterStatus*) override;
  grpc::Status RegisterStage(grpc::ServerContext*, const pipetrain::v1::RegisterStageRequest*,
                             pipetrain::v1::RegisterStageResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const pipetrain::v1::HeartbeatRequest*,
                         pipetrain::v1::HeartbeatResponse*) override;
  grpc::Status RendezvousSet(grpc::ServerContext*, const pipetrain::v1::RendezvousSetRequest*,
                             pipetrain::v1::RendezvousSetResponse*) override;
  grpc::Status RendezvousGet(grpc::ServerContext*, const pipetrain::v1::RendezvousGetRequest*,
                             pipetrain::v1::RendezvousGetResponse*) override;

 private:
  JobManager* manager_;
  const common::RpcSecurity security_;
};

}  // namespace pipetrain::coordinator
