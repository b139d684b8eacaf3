// Starts a gRPC server on a listen address (port 0 picks a free one), prints the bound
// address on stdout for scripts and tests, and runs until SIGINT or SIGTERM.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/address.h"
#include "common/rpc_security.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"

namespace pipetrain::common {

// Largest gRPC message any pipetrain server accepts or sends (tensor frames are far
// smaller; this bounds what a bad client can make a server buffer).
inline constexpr int kMaxMessageBytes = 256 << 20;

// HTTP/2 and TCP settings for bulk tensor traffic, for servers and channels alike:
// large frames and read chunks and a deep flow-control window, so that a 4 MiB tensor
// frame is not cut into 16 KiB HTTP/2 frames read 8 KiB at a time.
void ApplyBulkTransferArgs(grpc::ServerBuilder& builder);
void ApplyBulkTransferArgs(grpc::ChannelArguments& args);

// Call first thing in main(), before any thread starts, so that every thread inherits
// the blocked SIGINT/SIGTERM and WaitForTerminationSignal() receives them.
void BlockTerminationSignals();

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  HostPort address;  // with the port actually bound
};

// Adds the listening port (mutual TLS when `security` has it, else plaintext), health
// checking and message limits to `builder`, builds and starts it. `name` is used in
// messages ("coordinator"); `exposure` says what anyone who reaches a plaintext server
// on a non-loopback address can do ("submit jobs"), in the warning printed then.
absl::StatusOr<RunningServer> StartServer(grpc::ServerBuilder& builder,
                                          const HostPort& listen,
                                          const std::string& name,
                                          const RpcSecurity& security = RpcSecurity(),
                                          const std::string& exposure = "call its API");

// A second, plaintext server with only the gRPC health service (overall status
// SERVING while the process runs), for probes that cannot present a client
// certificate, such as Kubernetes' grpc probes. Prints "NAME health listening on ...".
absl::StatusOr<RunningServer> StartHealthServer(const HostPort& listen, const std::string& name);

// Blocks until SIGINT or SIGTERM, then shuts the server down, letting calls in
// flight finish for at most `grace`.
void WaitForTerminationSignal(grpc::Server* server, absl::Duration grace);
// Blocks until SIGINT or SIGTERM; returns the signal. For servers with work to wind
// down before the gRPC server shuts down.
int WaitForTerminationSignal();
// Waits at most `timeout` for SIGINT or SIGTERM (blocked by BlockTerminationSignals);
// true if one came. For a server winding down that a second signal stops at once.
bool TerminationSignalWithin(absl::Duration timeout);

}  // namespace pipetrain::common
