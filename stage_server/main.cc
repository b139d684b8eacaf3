// pipetrain-stage: holds one pipeline stage on one device and runs its programs.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/cuda_probe.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/server_runner.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "stage_server/device_spec.h"
#include "stage_server/stage_service.h"

int main(int argc, char** argv) {
  using namespace pipetrain;
  common::BlockTerminationSignals();

  std::string listen = "127.0.0.1:0";
  std::string device = "cpu";
  bool help = false, version = false;
  common::FlagSet flags(
      "pipetrain-stage", "[--listen HOST:PORT] [--device cpu|cuda:N|emulated:NAME]",
      "Serves one pipeline stage (gRPC service pipetrain.v1.Stage, gRPC health and\n"
      "reflection) on one device. Runs until SIGINT or SIGTERM. This build checks the\n"
      "device and serves the API surface only: stage RPCs answer UNIMPLEMENTED until\n"
      "the executor lands.");
  flags.AddString("listen", &listen, "address to serve on; port 0 picks a free port",
                  "HOST:PORT");
  flags.AddString("device", &device, "compute device: cpu, cuda:N or emulated:NAME",
                  "DEVICE");
  flags.AddBool("help", &help, "print this help and exit");
  flags.AddBool("version", &version, "print the version and exit");
  auto positionals = flags.Parse(common::Args(argc, argv));
  absl::Status parse_status = positionals.status();
  if (parse_status.ok() && !positionals->empty()) {
    parse_status = absl::InvalidArgumentError("unexpected argument '" + (*positionals)[0] + "'");
  }
  if (auto code = common::HandleStandardFlags(flags, parse_status, help, version)) return *code;

  auto address = common::ParseHostPort(listen, 0, "--listen");
  if (!address.ok()) {
    std::cerr << "pipetrain-stage: " << address.status().message() << "\n";
    return 2;
  }
  auto spec = stage_server::ParseDeviceSpec(device);
  if (!spec.ok()) {
    std::cerr << "pipetrain-stage: " << spec.status().message() << "\n";
    return 2;
  }
  if (spec->kind == stage_server::DeviceSpec::Kind::kCuda) {
    const common::CudaProbe& probe = common::ProbeCuda();
    if (spec->cuda_index >= static_cast<int>(probe.devices.size())) {
      std::cerr << "pipetrain-stage: --device " << spec->ToString()
                << " is not available ("
                << (probe.devices.empty() ? probe.reason
                                          : absl::StrCat(probe.devices.size(), " GPU(s) found"))
                << "); use --device cpu or emulated:NAME on this machine\n";
      return 2;
    }
  }
  common::LogInfo("stage", "device " + spec->ToString());

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  stage_server::StageService service;
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  auto server = common::StartServer(builder, *address, "stage");
  if (!server.ok()) {
    std::cerr << "pipetrain-stage: " << server.status().message() << "\n";
    return 1;
  }
  common::WaitForTerminationSignal(server->server.get(), absl::Seconds(5));
  common::LogInfo("stage", "stopped");
  return 0;
}
