// The real StageConnector: each connection is a StageClient (gRPC, with the
// coordinator's TLS and bearer token), and a CallControl's cancel becomes the call's
// grpc::ClientContext::TryCancel. Translation only.
#pragma once

#include <memory>
#include <string>

#include "common/rpc_security.h"
#include "coordinator/stages/stage_connection.h"

namespace pipetrain::coordinator {

class GrpcStageConnector : public StageConnector {
 public:
  explicit GrpcStageConnector(common::RpcSecurity security) : security_(std::move(security)) {}
  std::unique_ptr<StageConnection> Connect(const std::string& address) override;

 private:
  const common::RpcSecurity security_;
};

// `given` when set (tests hand in fakes), else a GrpcStageConnector with `security`.
std::shared_ptr<StageConnector> ConnectorOrGrpc(std::shared_ptr<StageConnector> given,
                                                const common::RpcSecurity& security);

}  // namespace pipetrain::coordinator
