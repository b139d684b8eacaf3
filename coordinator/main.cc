// pipetrain-coordinator: plans jobs, drives their steps and serves the API.
#include <iostream>

#include "common/address.h"
#include "common/flags.h"
#include "common/malloc_tuning.h"
#include "common/logging.h"
#include "common/server_runner.h"
#include "coordinator/coordinator_service.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"

namespace {
constexpr int kDefaultPort = 7400;
}

int main(int argc, char** argv) {
  using namespace pipetrain;
  common::BlockTerminationSignals();
  common::KeepFreedMemoryForReuse();

  std::string listen = "127.0.0.1:7400";
  bool help = false, version = false;
  common::FlagSet flags(
      "pipetrain-coordinator", "[--listen HOST:PORT]",
      "Plans pipeline-parallel training jobs over the registered stage servers and\n"
      "serves the pipetrain API (gRPC service pipetrain.v1.Coordinator, gRPC health and\n"
      "reflection). Runs until SIGINT or SIGTERM. This build serves the API surface\n"
      "only: job and stage RPCs answer UNIMPLEMENTED until the job store lands.");
  flags.AddString("listen", &listen, "address to serve on; port 0 picks a free port",
                  "HOST:PORT");
  flags.AddBool("help", &help, "print this help and exit");
  flags.AddBool("version", &version, "print the version and exit");
  auto positionals = flags.Parse(common::Args(argc, argv));
  absl::Status parse_status = positionals.status();
  if (parse_status.ok() && !positionals->empty()) {
    parse_status = absl::InvalidArgumentError("unexpected argument '" + (*positionals)[0] + "'");
  }
  if (auto code = common::HandleStandardFlags(flags, parse_status, help, version)) return *code;

  auto address = common::ParseHostPort(listen, kDefaultPort, "--listen");
  if (!address.ok()) {
    std::cerr << "pipetrain-coordinator: " << address.status().message() << "\n";
    return 2;
  }
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  coordinator::CoordinatorService service;
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  auto server = common::StartServer(builder, *address, "coordinator");
  if (!server.ok()) {
    std::cerr << "pipetrain-coordinator: " << server.status().message() << "\n";
    return 1;
  }
  common::WaitForTerminationSignal(server->server.get(), absl::Seconds(2));
  common::LogInfo("coordinator", "stopped");
  return 0;
}
