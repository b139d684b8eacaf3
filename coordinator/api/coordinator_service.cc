#include "coordinator/api/coordinator_service.h"

#include "common/grpc_status.h"
#include "coordinator/spec/request_checks.h"
#include "coordinator/rendezvous/rendezvous_service.h"

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

absl::Status NothingToCheck() { return absl::OkStatus(); }

// Every handler's frame, the same for each request: under GuardHandler (naming what the
// request is about), the caller's token first, then the request's checks
// (request_checks.h), and only then `answer`, which hands it to the job manager.
template <typename Check, typename Respond>
grpc::Status Serve(absl::string_view method, const common::RpcSecurity& security,
                   grpc::ServerContext& ctx, const google::protobuf::Message& request,
                   Check&& check, Respond&& answer) {
  return common::GuardHandler(method, request, [&]() -> grpc::Status {
    if (grpc::Status denied = security.Authorize(ctx); !denied.ok()) return denied;
    if (absl::Status bad = check(); !bad.ok()) return ToGrpcStatus(bad);
    return answer();
  });
}

}  // namespace

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext* ctx, const pb::SubmitJobRequest* req,
                                           pb::SubmitJobResponse* resp) {
  return Serve(
      "Coordinator.SubmitJob", security_, *ctx, *req,
      [&] { return CheckJobSpecBounds(req->spec()); },
      [&]() -> grpc::Status {
        absl::StatusOr<std::string> id = manager_->Submit(req->spec());
        if (!id.ok()) return ToGrpcStatus(id.status());
        resp->set_job_id(*id);
        return grpc::Status::OK;
      });
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* ctx, const pb::GetJobRequest* req,
                                        pb::JobStatus* resp) {
  return Serve(
      "Coordinator.GetJob", security_, *ctx, *req, [&] { return CheckJobId(req->job_id()); },
      [&] { return Answer(manager_->Get(req->job_id(), req->include_history()), resp); });
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* ctx, const pb::ListJobsRequest* req,
                                          pb::ListJobsResponse* resp) {
  return Serve(
      "Coordinator.ListJobs", security_, *ctx, *req, [&] { return CheckListJobsRequest(*req); },
      [&]() -> grpc::Status {
        absl::StatusOr<std::vector<pb::JobStatus>> jobs = manager_->List(req->limit());
        if (!jobs.ok()) return ToGrpcStatus(jobs.status());
        for (pb::JobStatus& j : *jobs) *resp->add_jobs() = std::move(j);
        return grpc::Status::OK;
      });
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext* ctx, const pb::CancelJobRequest* req,
                                           pb::JobStatus* resp) {
  return Serve(
      "Coordinator.CancelJob", security_, *ctx, *req, [&] { return CheckJobId(req->job_id()); },
      [&] { return Answer(manager_->Cancel(req->job_id()), resp); });
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* ctx, const pb::WatchJobRequest* req,
                                          grpc::ServerWriter<pb::JobEvent>* writer) {
  return Serve(
      "Coordinator.WatchJob", security_, *ctx, *req, [&] { return CheckWatchJobRequest(*req); },
      [&] {
        return ToGrpcStatus(manager_->Watch(
            req->job_id(), req->from_step(), req->no_follow(),
            [&](const pb::JobEvent& e) { return !ctx->IsCancelled() && writer->Write(e); },
            [&] { return !ctx->IsCancelled(); }));
      });
}

grpc::Status CoordinatorService::GetTimeline(grpc::ServerContext* ctx,
                                             const pb::GetTimelineRequest* req,
                                             pb::Timeline* resp) {
  return Serve(
      "Coordinator.GetTimeline", security_, *ctx, *req,
      [&] { return CheckGetTimelineRequest(*req); },
      [&] { return Answer(manager_->Timeline(req->job_id(), req->last_steps()), resp); });
}

grpc::Status CoordinatorService::GetCluster(grpc::ServerContext* ctx,
                                            const pb::GetClusterRequest* req,
                                            pb::ClusterStatus* resp) {
  return Serve("Coordinator.GetCluster", security_, *ctx, *req, NothingToCheck, [&] {
    *resp = manager_->Cluster();
    return grpc::Status::OK;
  });
}

grpc::Status CoordinatorService::RegisterStage(grpc::ServerContext* ctx,
                                               const pb::RegisterStageRequest* req,
                                               pb::RegisterStageResponse* resp) {
  return Serve(
      "Coordinator.RegisterStage", security_, *ctx, *req,
      [&] { return CheckRegisterStageRequest(*req); },
      [&] {
        return Answer(manager_->RegisterStage(*req, common::RpcSecurity::PeerIdentity(*ctx)),
                      resp);
      });
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* ctx, const pb::HeartbeatRequest* req,
                                           pb::HeartbeatResponse* resp) {
  return Serve(
      "Coordinator.Heartbeat", security_, *ctx, *req, [&] { return CheckHeartbeatRequest(*req); },
      [&] {
        *resp = manager_->Heartbeat(*req);
        return grpc::Status::OK;
      });
}

// The rendezvous requests are checked where they are served (rendezvous_service.h).
grpc::Status CoordinatorService::RendezvousSet(grpc::ServerContext* ctx,
                                               const pb::RendezvousSetRequest* req,
                                               pb::RendezvousSetResponse*) {
  return Serve("Coordinator.RendezvousSet", security_, *ctx, *req, NothingToCheck,
               [&] { return ServeRendezvousSet(manager_->rendezvous(), *req); });
}

grpc::Status CoordinatorService::RendezvousGet(grpc::ServerContext* ctx,
                                               const pb::RendezvousGetRequest* req,
                                               pb::RendezvousGetResponse* resp) {
  return Serve("Coordinator.RendezvousGet", security_, *ctx, *req, NothingToCheck,
               [&] { return ServeRendezvousGet(manager_->rendezvous(), *ctx, *req, resp); });
}

}  // namespace pipetrain::coordinator
