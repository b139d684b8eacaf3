#include "common/channel_args.h"

#include "common/server_runner.h"

namespace pipetrain::common {
namespace {

void SetKeepalive(grpc::ChannelArguments& args, int every_ms, int timeout_ms) {
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, every_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, timeout_ms);
}

}  // namespace

grpc::ChannelArguments ChannelArgumentsFor(ChannelUse use) {
  grpc::ChannelArguments args;
  switch (use) {
    case ChannelUse::kStageControl:
      args.SetMaxReceiveMessageSize(-1);
      args.SetMaxSendMessageSize(-1);
      SetKeepalive(args, 10000, 5000);
      break;
    case ChannelUse::kPeerLink:
      args.SetMaxReceiveMessageSize(kMaxMessageBytes);
      args.SetMaxSendMessageSize(kMaxMessageBytes);
      SetKeepalive(args, 10000, 5000);
      args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
      ApplyBulkTransferArgs(args);
      break;
    case ChannelUse::kCli:
      args.SetMaxReceiveMessageSize(kMaxMessageBytes);
      SetKeepalive(args, 30000, 10000);
      break;
    case ChannelUse::kRegistration:
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 500);
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 500);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
      break;
  }
  return args;
}

}  // namespace pipetrain::common
