#include "coordinator/coordinator_service.h"

#include "common/grpc_status.h"
#include "coordinator/request_checks.h"
#include "coordinator/rendezvous_service.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;
using common::ToGrpcStatus;

namespace {

// Copies an OK result into `out`, or returns its error as a gRPC status.
template <typename T>
grpc::Status Answer(absl::StatusOr<T> result, T* out) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *out = *std::move(result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext* ctx, const pb::SubmitJobRequest* req,
                                           pb::SubmitJobResponse* resp) {
  return common::GuardHandler("Coordinator.SubmitJob", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    absl::StatusOr<std::string> id = manager_->Submit(req->spec());
    if (!id.ok()) return ToGrpcStatus(id.status());
    resp->set_job_id(*id);
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* ctx, const pb::GetJobRequest* req,
                                        pb::JobStatus* resp) {
  return common::GuardHandler("Coordinator.GetJob", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    if (absl::Status bad = CheckJobId(req->job_id()); !bad.ok()) return ToGrpcStatus(bad);
    return Answer(manager_->Get(req->job_id(), req->include_history()), resp);
  });
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* ctx, const pb::ListJobsRequest* req,
                                          pb::ListJobsResponse* resp) {
  return common::GuardHandler("Coordinator.ListJobs", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    if (absl::Status bad = CheckListJobsRequest(*req); !bad.ok()) return ToGrpcStatus(bad);
    absl::StatusOr<std::vector<pb::JobStatus>> jobs = manager_->List(req->limit());
    if (!jobs.ok()) return ToGrpcStatus(jobs.status());
    for (pb::JobStatus& j : *jobs) *resp->add_jobs() = std::move(j);
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext* ctx, const pb::CancelJobRequest* req,
                                           pb::JobStatus* resp) {
  return common::GuardHandler("Coordinator.CancelJob", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    if (absl::Status bad = CheckJobId(req->job_id()); !bad.ok()) return ToGrpcStatus(bad);
    return Answer(manager_->Cancel(req->job_id()), resp);
  });
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* ctx, const pb::WatchJobRequest* req,
                                          grpc::ServerWriter<pb::JobEvent>* writer) {
  return common::GuardHandler("Coordinator.WatchJob", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    if (absl::Status bad = CheckWatchJobRequest(*req); !bad.ok()) return ToGrpcStatus(bad);
    return ToGrpcStatus(manager_->Watch(
        req->job_id(), req->from_step(), req->no_follow(),
        [&](const pb::JobEvent& e) { return !ctx->IsCancelled() && writer->Write(e); },
        [&] { return !ctx->IsCancelled(); }));
  });
}

grpc::Status CoordinatorService::GetTimeline(grpc::ServerContext* ctx,
                                             const pb::GetTimelineRequest* req,
                                             pb::Timeline* resp) {
  return common::GuardHandler("Coordinator.GetTimeline", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    if (absl::Status bad = CheckGetTimelineRequest(*req); !bad.ok()) return ToGrpcStatus(bad);
    return Answer(manager_->Timeline(req->job_id(), req->last_steps()), resp);
  });
}

grpc::Status CoordinatorService::GetCluster(grpc::ServerContext* ctx, const pb::GetClusterRequest*,
                                            pb::ClusterStatus* resp) {
  return common::GuardHandler("Coordinator.GetCluster", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    *resp = manager_->Cluster();
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::RegisterStage(grpc::ServerContext* ctx,
                                               const pb::RegisterStageRequest* req,
                                               pb::RegisterStageResponse* resp) {
  return common::GuardHandler("Coordinator.RegisterStage", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    return Answer(manager_->RegisterStage(*req, common::RpcSecurity::PeerIdentity(*ctx)), resp);
  });
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* ctx, const pb::HeartbeatRequest* req,
                                           pb::HeartbeatResponse* resp) {
  return common::GuardHandler("Coordinator.Heartbeat", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    if (absl::Status bad = CheckHeartbeatRequest(*req); !bad.ok()) return ToGrpcStatus(bad);
    *resp = manager_->Heartbeat(*req);
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::RendezvousSet(grpc::ServerContext* ctx,
                                               const pb::RendezvousSetRequest* req,
                                               pb::RendezvousSetResponse*) {
  return common::GuardHandler("Coordinator.RendezvousSet", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    return ServeRendezvousSet(manager_->rendezvous(), *req);
  });
}

grpc::Status CoordinatorService::RendezvousGet(grpc::ServerContext* ctx,
                                               const pb::RendezvousGetRequest* req,
                                               pb::RendezvousGetResponse* resp) {
  return common::GuardHandler("Coordinator.RendezvousGet", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    return ServeRendezvousGet(manager_->rendezvous(), *ctx, *req, resp);
  });
}

}  // namespace pipetrain::coordinator
