// The RendezvousSet / RendezvousGet RPCs translated onto a RendezvousStore: used by
// the CoordinatorService, and on its own (RendezvousService) by tests and benchmarks
// that need the rendezvous without a whole coordinator. No logic of its own.
#pragma once

#include "common/rpc_security.h"
#include "coordinator/rendezvous/rendezvous_store.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::coordinator {

grpc::Status ServeRendezvousSet(RendezvousStore& store, const pipetrain::v1::RendezvousSetRequest& req);
// Waits no longer than the call's own deadline allows (less a margin, so that the
// caller gets this store's DEADLINE_EXCEEDED naming the key, not gRPC's).
grpc::Status ServeRendezvousGet(RendezvousStore& store, const grpc::ServerContext& ctx,
                                const pipetrain::v1::RendezvousGetRequest& req,
                                pipetrain::v1::RendezvousGetResponse* resp);

// Only the two rendezvous RPCs of the Coordinator service (the others answer
// UNIMPLEMENTED), with the same token check as the coordinator's.
class RendezvousService final : public pipetrain::v1::Coordinator::Service {
 public:
  explicit RendezvousService(RendezvousStore* store,
                             common::RpcSecurity security = common::RpcSecurity())
      : store_(store), security_(std::move(security)) {}

  grpc::Status RendezvousSet(grpc::ServerContext* ctx, const pipetrain::v1::RendezvousSetRequest* req,
                             pipetrain::v1::RendezvousSetResponse*) override;
  grpc::Status RendezvousGet(grpc::ServerContext* ctx, const pipetrain::v1::RendezvousGetRequest* req,
                             pipetrain::v1::RendezvousGetResponse* resp) override;

 private:
  RendezvousStore* store_;
  const common::RpcSecurity security_;
};

}  // namespace pipetrain::coordinator
