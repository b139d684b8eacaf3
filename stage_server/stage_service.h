// The Stage gRPC service. It only translates between proto messages and the stage's
// domain code; until the executor and peer links exist (issue "Stage server"), every
// RPC answers UNIMPLEMENTED.
#pragma once

#include "pipetrain/v1/stage.grpc.pb.h"

namespace pipetrain::stage_server {

class StageService final : public pipetrain::v1::Stage::Service {};

}  // namespace pipetrain::stage_server
