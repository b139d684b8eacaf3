// The one place where absl status codes and gRPC status codes meet: a one-to-one map
// both ways, so a status crosses an RPC with its code and message unchanged.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace pipetrain::common {

grpc::StatusCode ToGrpcCode(absl::StatusCode code);
absl::StatusCode FromGrpcCode(grpc::StatusCode code);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace pipetrain::common
