// pipetrain-stage: holds one pipeline stage on one device and runs its programs.
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/cuda_probe.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "common/rpc_security.h"
#include "common/server_runner.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "stage_server/compute/onednn_matmul.h"
#include "stage_server/runtime/device_spec.h"
#include "stage_server/exec/emulated_chunk.h"
#include "stage_server/runtime/fault_injection.h"
#include "stage_server/registration.h"
#include "stage_server/runtime/stage_runtime.h"
#include "stage_server/stage_service.h"
#include "stage_server/stop_drain.h"

namespace {

// DeviceInfo.bf16: how this device runs training.precision bf16.
std::string Bf16Support(pipetrain::stage_server::DeviceSpec::Kind kind) {
  using Kind = pipetrain::stage_server::DeviceSpec::Kind;
  switch (kind) {
    case Kind::kCuda:
      return "native";  // cuBLAS bf16 products (cuda_backend_bf16.cc)
    case Kind::kEmulated:
      return "native";
    default:
      return pipetrain::compute::OneDnnMatmul::bf16_native() ? "native" : "slow";
  }
}

// After the first SIGINT/SIGTERM: serves on while the coordinator holds this stage for
// a job, for up to `grace` (stop_drain.h), then stops serving as before.
void StopServing(grpc::Server* server, std::optional<pipetrain::common::RunningServer>& health,
                 pipetrain::stage_server::Registration* registration,
                 const pipetrain::stage_server::StageRuntime& runtime, absl::Duration grace) {
  using namespace pipetrain;
  stage_server::StopDrain drain;
  drain.grace = grace;
  // Asked afresh: the latest periodic heartbeat may predate the job that took the stage.
  drain.held = [registration] {
    return registration != nullptr && registration->HeartbeatNow();
  };
  drain.job_id = [&runtime] { return runtime.current_job_id(); };
  drain.signal_within = common::TerminationSignalWithin;
  drain.log = [](const std::string& line) { common::LogInfo("stage", line); };
  stage_server::WaitWhileHeld(drain);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (health) health->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace pipetrain;
  common::BlockTerminationSignals();
  common::KeepFreedMemoryForReuse();

  std::string listen = "127.0.0.1:0", device = "cpu", coordinator, advertise, health_listen,
      fail_at, same_host = "auto";
  int64_t threads = 1, memory_limit = 0;
  double stop_grace = 30;
  bool help = false, version = false;
  common::SecurityFlags security_flags;
  common::FlagSet flags(
      "pipetrain-stage",
      "[--coordinator HOST:PORT] [--listen HOST:PORT] [--device cpu|cuda:N|emulated:NAME]\n"
      "    [--stop-grace S] [--tls-cert FILE --tls-key FILE --tls-ca FILE] [--token-file FILE]",
      "Serves one pipeline stage (gRPC service pipetrain.v1.Stage, gRPC health and\n"
      "reflection): the coordinator configures it with a chunk of the model and drives\n"
      "its steps; neighbouring stages stream activations and gradients to it directly.\n"
      "Health of service pipetrain.v1.Stage is NOT_SERVING until a job is configured.\n"
      "Runs until SIGINT or SIGTERM; without --coordinator it only waits to be driven.\n"
      "Told to stop while its coordinator holds it for a job (running, or recovering onto\n"
      "it), it keeps serving until the coordinator lets it go, for up to --stop-grace\n"
      "seconds, so that a coordinator stopped at the same moment (scancel signals every\n"
      "process of a job) can finish the job's step and take its checkpoint; a second\n"
      "SIGINT or SIGTERM, or a coordinator that no longer answers, stops it at once.\n"
      "\n"
      "Security: with --tls-cert/--tls-key/--tls-ca every connection (coordinator calls,\n"
      "registration, peer streams to and from neighbouring stages) is mutual TLS against\n"
      "the CA; the certificate must name the host in --advertise (or --listen). With\n"
      "--token-file, control calls (Configure, RunStep, ExportChunk, ImportChunk,\n"
      "GetStats) need \"authorization: Bearer <token>\", which the coordinator sends when\n"
      "it has the same --token-file, and registration sends it. Peer streams are admitted\n"
      "by their job's secret, handed out at Configure.");
  flags.AddString("listen", &listen, "address to serve on; port 0 picks a free port",
                  "HOST:PORT");
  flags.AddString("coordinator", &coordinator,
                  "register with and heartbeat to this coordinator", "HOST:PORT");
  flags.AddString("health-listen", &health_listen,
                  "serve only the gRPC health service here, in plaintext, for probes that cannot "
                  "present a client certificate (Kubernetes grpc probes)",
                  "HOST:PORT");
  flags.AddString("advertise", &advertise,
                  "address other processes use to reach this stage (default: the listen "
                  "address with the bound port)",
                  "HOST:PORT");
  flags.AddString("device", &device,
                  "compute device: cpu, cuda:N, or emulated:NAME[@SHARED] (h100, h200, a100 or "
                  "a FLOP rate such as 2e12: no arithmetic, each action takes its modelled "
                  "time; the stages of a host naming one SHARED device take turns on it)",
                  "DEVICE");
  flags.AddInt("threads", &threads, "CPU compute threads (the cpu backend's oneDNN products)");
  flags.AddInt("memory-limit", &memory_limit,
               "refuse jobs whose weights, optimizer state, buffers, snapshot reserve and links' "
               "host memory exceed this many bytes (0: no limit)",
               "BYTES");
  flags.AddString("same-host-transport", &same_host,
                  "auto: a neighbour on this host gets this stage's tensors through shared "
                  "memory (the stream carries only their headers), checked by a nonce and "
                  "falling back to the stream on any failure; off: always the stream",
                  "auto|off");
  flags.AddString("fail-at", &fail_at,
                  "testing aid: kill this process (SIGKILL) at POINT (forward, backward, "
                  "optimizer, snapshot or checkpoint) of step STEP of job JOB when it is that "
                  "job's stage STAGE; never once state was imported (a run restored after a "
                  "recovery, or a job started from init_from)",
                  "JOB:STAGE:STEP:POINT");
  flags.AddDouble("stop-grace", &stop_grace,
                  "on SIGINT/SIGTERM while the coordinator holds this stage for a job, keep "
                  "serving until it lets the stage go (the job's step done and checkpointed), "
                  "at most S seconds; 0 stops at once",
                  "S");
  common::AddSecurityFlags(flags, &security_flags,
                           "require this bearer token (the file's contents, trimmed) on "
                           "control calls, and send it when registering; the coordinator's "
                           "--token-file");
  flags.AddBool("help", &help, "print this help and exit");
  flags.AddBool("version", &version, "print the version and exit");
  auto positionals = flags.Parse(common::Args(argc, argv));
  absl::Status parse_status = positionals.status();
  if (parse_status.ok() && !positionals->empty()) {
    parse_status = absl::InvalidArgumentError("unexpected argument '" + (*positionals)[0] + "'");
  }
  if (parse_status.ok() && (threads < 1 || memory_limit < 0)) {
    parse_status = absl::InvalidArgumentError("--threads must be >= 1 and --memory-limit >= 0");
  }
  if (parse_status.ok() && same_host != "auto" && same_host != "off") {
    parse_status = absl::InvalidArgumentError(
        absl::StrCat("--same-host-transport must be auto or off, not '", same_host, "'"));
  }
  if (parse_status.ok() && !(stop_grace >= 0 && stop_grace <= 86400)) {
    parse_status = absl::InvalidArgumentError("--stop-grace must be between 0 and 86400 seconds");
  }
  absl::StatusOr<common::RpcSecurity> security = common::RpcSecurity();
  if (parse_status.ok() && !help && !version) {
    security = common::RpcSecurity::Load(security_flags);
    parse_status = security.status();
  }
  if (auto code = common::HandleStandardFlags(flags, parse_status, help, version)) return *code;
  std::shared_ptr<stage_server::FaultInjector> faults;
  if (!fail_at.empty()) {
    auto plan = stage_server::ParseFaultPlan(fail_at);
    if (!plan.ok()) {
      std::cerr << "pipetrain-stage: " << plan.status().message() << "\n";
      return 2;
    }
    faults = std::make_shared<stage_server::FaultInjector>(*plan);
    common::LogWarning("stage", "--fail-at " + fail_at + ": this stage will kill itself there");
  }

  auto address = common::ParseHostPort(listen, 0, "--listen");
  if (!address.ok()) {
    std::cerr << "pipetrain-stage: " << address.status().message() << "\n";
    return 2;
  }
  std::optional<common::HostPort> health_address;
  if (!health_listen.empty()) {
    auto a = common::ParseHostPort(health_listen, 0, "--health-listen");
    if (!a.ok()) {
      std::cerr << "pipetrain-stage: " << a.status().message() << "\n";
      return 2;
    }
    health_address = *a;
  }
  auto spec = stage_server::ParseDeviceSpec(device);
  if (!spec.ok()) {
    std::cerr << "pipetrain-stage: " << spec.status().message() << "\n";
    return 2;
  }
  pipetrain::v1::DeviceInfo info;
  info.set_kind(spec->kind == stage_server::DeviceSpec::Kind::kCpu    ? "cpu"
                : spec->kind == stage_server::DeviceSpec::Kind::kCuda ? "cuda"
                                                                      : "emulated");
  info.set_name(spec->ToString());
  info.set_threads(static_cast<int>(threads));
  // Without --memory-limit a CPU or emulated stage may use the host's memory (a CUDA
  // stage its GPU's, below): the coordinator refuses a stage of unknown memory.
  info.set_memory_bytes(memory_limit > 0 ? static_cast<uint64_t>(memory_limit)
                                         : stage_server::HostMemoryBytes());
  if (spec->kind == stage_server::DeviceSpec::Kind::kCuda) {
    const common::CudaProbe& probe = common::ProbeCuda();
    if (spec->cuda_index >= static_cast<int>(probe.devices.size())) {
      std::cerr << "pipetrain-stage: --device " << spec->ToString() << " is not available ("
                << (probe.devices.empty() ? probe.reason
                                          : absl::StrCat(probe.devices.size(), " GPU(s) found"))
                << "); use --device cpu or emulated:NAME on this machine\n";
      return 2;
    }
    info.set_name(probe.devices[spec->cuda_index].name);
    if (memory_limit == 0) info.set_memory_bytes(probe.devices[spec->cuda_index].total_memory_bytes);
  }
  if (spec->kind == stage_server::DeviceSpec::Kind::kEmulated) {
    auto emulated = stage_server::EmulatedDeviceByName(spec->emulated);
    if (!emulated.ok()) {
      std::cerr << "pipetrain-stage: " << emulated.status().message() << "\n";
      return 2;
    }
    info.set_peak_flops(emulated->flops);
  }
  info.set_device_id(stage_server::DeviceId(
      *spec, spec->kind == stage_server::DeviceSpec::Kind::kCuda
                 ? common::ProbeCuda().devices[spec->cuda_index].uuid
                 : ""));
  if (spec->kind == stage_server::DeviceSpec::Kind::kCpu) {
    info.set_cpus(stage_server::CpuAffinityList());
  }
  info.set_bf16(Bf16Support(spec->kind));
  common::LogInfo("stage", absl::StrCat("device ", spec->ToString(), " (", info.device_id(),
                                        info.cpus().empty() ? "" : ", cpus ", info.cpus(),
                                        "), bf16 ", info.bf16()));

  stage_server::RuntimeOptions options;
  options.device = *spec;
  options.threads = static_cast<int>(threads);
  options.memory_limit_bytes = static_cast<uint64_t>(memory_limit);
  options.security = *security;
  options.faults = faults;
  options.same_host_transport = same_host == "auto";
  // Replicas of a stage position meet through the coordinator and connect to each other
  // (gloo) on the host the others reach this stage at.
  options.coordinator_address = coordinator;
  options.listen_host = address->host;
  if (!advertise.empty()) {
    if (auto a = common::ParseHostPort(advertise, 0, "--advertise"); a.ok()) {
      options.listen_host = a->host;
    }
  }
  stage_server::StageRuntime runtime(options);
  stage_server::StageService service(&runtime);

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  auto server =
      common::StartServer(builder, *address, "stage", *security, "drive this stage");
  if (!server.ok()) {
    std::cerr << "pipetrain-stage: " << server.status().message() << "\n";
    return 1;
  }
  std::optional<common::RunningServer> health;
  if (health_address) {
    auto started = common::StartHealthServer(*health_address, "stage");
    if (!started.ok()) {
      std::cerr << "pipetrain-stage: " << started.status().message() << "\n";
      return 1;
    }
    health = *std::move(started);
  }
  service.SetServer(server->server.get());

  std::unique_ptr<stage_server::Registration> registration;
  if (!coordinator.empty()) {
    pipetrain::v1::RegisterStageRequest request;
    request.set_address(advertise.empty() ? server->address.ToString() : advertise);
    *request.mutable_device() = info;
    registration = std::make_unique<stage_server::Registration>(
        coordinator, request, [&runtime] { return runtime.current_job_id(); }, *security,
        [&runtime] { return stage_server::LinkPathProtos(runtime); });
  }
  common::WaitForTerminationSignal();
  StopServing(server->server.get(), health, registration.get(), runtime,
              absl::Seconds(stop_grace));
  registration.reset();
  common::LogInfo("stage", "stopped");
  return 0;
}
