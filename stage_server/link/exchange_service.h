// A Stage service that serves only the Exchange data plane, through a LinkAcceptor:
// for benchmarks and tests of peer links without a whole stage runtime. The full
// StageService routes Exchange the same way.
#pragma once

#include "pipetrain/v1/stage.grpc.pb.h"
#include "stage_server/link/peer_link.h"

namespace pipetrain::stage_server {

class ExchangeService final
    : public pipetrain::v1::Stage::WithRawCallbackMethod_Exchange<pipetrain::v1::Stage::Service> {
 public:
  explicit ExchangeService(LinkAcceptor* acceptor) : acceptor_(acceptor) {}
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Exchange(
      grpc::CallbackServerContext* context) override {
    return acceptor_->Accept(context);
  }

 private:
  LinkAcceptor* acceptor_;
};

}  // namespace pipetrain::stage_server
