// The Coordinator gRPC service. It only translates between proto messages and the
// coordinator's domain code; until the job store, registry and step driver exist
// (issue "Coordinator, CLI and a local cluster"), every RPC answers UNIMPLEMENTED.
#pragma once

#include "pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::coordinator {

class CoordinatorService final : public pipetrain::v1::Coordinator::Service {};

}  // namespace pipetrain::coordinator
