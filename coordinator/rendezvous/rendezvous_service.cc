#include "coordinator/rendezvous/rendezvous_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;
using common::ToGrpcStatus;

namespace {
// Answering this much before the caller's deadline lets our message reach it.
constexpr absl::Duration kAnswerMargin = absl::Milliseconds(200);
}  // namespace

grpc::Status ServeRendezvousSet(RendezvousStore& store, const pb::RendezvousSetRequest& req) {
  return ToGrpcStatus(store.Set(req.job_id(), req.key(), req.value()));
}

grpc::Status ServeRendezvousGet(RendezvousStore& store, const grpc::ServerContext& ctx,
                                const pb::RendezvousGetRequest& req,
                                pb::RendezvousGetResponse* resp) {
  if (req.wait_ms() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("rendezvous: job ", req.job_id(), ": key '", req.key(),
                     "': wait_ms is negative (", req.wait_ms(), ")")));
  }
  absl::Duration wait = absl::Milliseconds(req.wait_ms());
  const absl::Duration left = absl::FromChrono(ctx.deadline()) - absl::Now() - kAnswerMargin;
  wait = std::max(absl::ZeroDuration(), std::min(wait, left));
  absl::StatusOr<std::string> value = store.Get(req.job_id(), req.key(), wait);
  if (!value.ok()) return ToGrpcStatus(value.status());
  resp->set_value(*std::move(value));
  return grpc::Status::OK;
}

grpc::Status RendezvousService::RendezvousSet(grpc::ServerContext* ctx,
                                              const pb::RendezvousSetRequest* req,
                                              pb::RendezvousSetResponse*) {
  return common::GuardHandler("Rendezvous.RendezvousSet", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    return ServeRendezvousSet(*store_, *req);
  });
}

grpc::Status RendezvousService::RendezvousGet(grpc::ServerContext* ctx,
                                              const pb::RendezvousGetRequest* req,
                                              pb::RendezvousGetResponse* resp) {
  return common::GuardHandler("Rendezvous.RendezvousGet", [&]() -> grpc::Status {
    if (grpc::Status denied = security_.Authorize(*ctx); !denied.ok()) return denied;
    return ServeRendezvousGet(*store_, *ctx, *req, resp);
  });
}

}  // namespace pipetrain::coordinator
