// The gRPC settings of every channel a pipetrain process opens, in one table: message
// limits, keepalive pings (which must agree with what servers allow, see
// common/server_runner.cc), reconnect backoff and bulk-transfer tuning, by what the
// channel is for.
#pragma once

#include "grpcpp/support/channel_arguments.h"

namespace pipetrain::common {

enum class ChannelUse {
  // The coordinator's calls to a stage (Configure, RunStep, chunk export and import):
  // no message limit (a chunk of a large model is one message), and pings every 10 s
  // so that a stage whose host vanished fails its RunStep in ~15 s, not at the step
  // deadline.
  kStageControl,
  // A stage's stream to its downstream neighbour: the servers' message limit, the bulk
  // transfer settings, and pings even while idle between steps.
  kPeerLink,
  // The CLI's calls to the coordinator: long histories and timelines may exceed gRPC's
  // 4 MiB default; pings every 30 s keep `logs -f` and `submit`'s follow view honest.
  kCli,
  // A stage's registration and heartbeats: reconnect within seconds of a coordinator
  // restart instead of gRPC's default backoff, which grows to two minutes.
  kRegistration,
};

grpc::ChannelArguments ChannelArgumentsFor(ChannelUse use);

}  // namespace pipetrain::common
