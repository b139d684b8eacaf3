#include "common/server_runner.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/health_check_service_interface.h"

namespace pipetrain::common {
namespace {

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

constexpr int kHttp2FrameBytes = 4 << 20;
constexpr int kLookaheadBytes = 64 << 20;
constexpr int kReadChunkBytes = 4 << 20;

template <typename Sink>
void SetBulkArgs(Sink&& set) {
  set(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
  set(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kLookaheadBytes);
  set(GRPC_ARG_TCP_READ_CHUNK_SIZE, kReadChunkBytes);
  set(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, kReadChunkBytes / 4);
  set(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, kReadChunkBytes);
}

pthread_t main_thread;

// Threads that libraries start before main() (OpenBLAS's pool) do not block the
// signals; one that receives SIGTERM would kill the process with the default action.
// This hands the signal to the main thread, whose sigwait() takes it.
void ForwardToMainThread(int sig) { pthread_kill(main_thread, sig); }

}  // namespace

void ApplyBulkTransferArgs(grpc::ServerBuilder& builder) {
  SetBulkArgs([&](const char* key, int value) { builder.AddChannelArgument(key, value); });
  // Peer links and the coordinator ping every 10 s to notice a vanished peer
  // (common/channel_args.h); without these the server would answer an idle link's
  // pings with GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

void ApplyBulkTransferArgs(grpc::ChannelArguments& args) {
  SetBulkArgs([&](const char* key, int value) { args.SetInt(key, value); });
}

void BlockTerminationSignals() {
  main_thread = pthread_self();
  struct sigaction action = {};
  action.sa_handler = ForwardToMainThread;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

absl::StatusOr<RunningServer> StartServer(grpc::ServerBuilder& builder,
                                          const HostPort& listen,
                                          const std::string& name,
                                          const RpcSecurity& security,
                                          const std::string& exposure) {
  grpc::EnableDefaultHealthCheckService(true);
  int bound_port = 0;
  builder.AddListeningPort(listen.ToString(), security.ServerCredentials(), &bound_port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  ApplyBulkTransferArgs(builder);
  RunningServer out;
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat(
        name, " could not listen on ", listen.ToString(),
        ": the address is in use or not local to this host; choose another --listen"));
  }
  out.address = listen;
  out.address.port = bound_port;
  if (!IsLoopbackHost(listen.host) && !security.tls()) {
    LogWarning(name, absl::StrCat("listening on ", out.address.ToString(),
                                  " without TLS: anyone who can reach this port can ", exposure,
                                  "; pass --tls-cert/--tls-key/--tls-ca"));
  }
  // The one line scripts and tests read to learn the port.
  std::cout << name << " listening on " << out.address.ToString() << std::endl;
  return out;
}

absl::StatusOr<RunningServer> StartHealthServer(const HostPort& listen, const std::string& name) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(listen.ToString(), grpc::InsecureServerCredentials(), &bound_port);
  RunningServer out;
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat(
        name, " could not serve health on ", listen.ToString(),
        ": the address is in use or not local to this host; choose another --health-listen"));
  }
  out.address = listen;
  out.address.port = bound_port;
  std::cout << name << " health listening on " << out.address.ToString() << std::endl;
  return out;
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSignals();
  int sig = 0;
  sigwait(&set, &sig);
  LogInfo("server", absl::StrCat("received signal ", sig, ", shutting down"));
  return sig;
}

bool TerminationSignalWithin(absl::Duration timeout) {
  const sigset_t set = TerminationSignals();
  const struct timespec wait = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  // EINTR (another signal) or EAGAIN (the time is over): no termination signal.
  return sigtimedwait(&set, nullptr, &wait) > 0;
}

void WaitForTerminationSignal(grpc::Server* server, absl::Duration grace) {
  WaitForTerminationSignal();
  server->Shutdown(std::chrono::system_clock::now() + absl::ToChronoSeconds(grace));
}

}  // namespace pipetrain::common
