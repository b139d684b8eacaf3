// pipetrain-coordinator: plans jobs, drives their steps and serves the API.
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/rpc_security.h"
#include "common/server_runner.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/http_api.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_paths.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace {
constexpr int kDefaultPort = 7400;
constexpr int kDefaultHttpPort = 7401;
}  // namespace

int main(int argc, char** argv) {
  using namespace pipetrain;
  common::BlockTerminationSignals();
  // Not common::KeepFreedMemoryForReuse(): that is for the stages' tensor buffers; the
  // coordinator gives freed memory back, so its resident size follows what it holds
  // (pipetrain-bench coordinator-load), not the peak of every burst of watchers.

  std::string listen = "127.0.0.1:7400", state_dir, http, health_listen, tensorboard_dir;
  std::vector<std::string> data_roots;
  double heartbeat_timeout = 5, stage_deadline = 30;
  int64_t events_in_memory = coordinator::kDefaultEventsInMemory;
  bool help = false, version = false;
  common::SecurityFlags security_flags;
  common::FlagSet flags(
      "pipetrain-coordinator",
      "--state-dir DIR [--listen HOST:PORT] [--http HOST:PORT] [--data-root DIR]...\n"
      "    [--tensorboard-dir DIR] [--tls-cert FILE --tls-key FILE --tls-ca FILE]\n"
      "    [--token-file FILE]",
      "Plans pipeline-parallel training jobs over the registered stage servers, drives\n"
      "them step by step, checkpoints them, and serves the pipetrain API (gRPC service\n"
      "pipetrain.v1.Coordinator, gRPC health and reflection; JSON and /metrics over HTTP\n"
      "with --http).\n"
      "Jobs, their step history and logs are kept in DIR/jobs.db (SQLite), checkpoints in\n"
      "DIR/checkpoints/JOB/step-N/, TensorBoard event files (every step's scalars) in\n"
      "DIR/tensorboard/JOB/ (tensorboard --logdir DIR/tensorboard). Runs until SIGINT or\n"
      "SIGTERM; a job running then stops after its current step and is recorded\n"
      "RECOVERING, for the next coordinator on DIR to continue (FAILED, naming its last\n"
      "checkpoint, with fault_tolerance.max_restarts 0).\n"
      "\n"
      "Data: a job names files the coordinator reads (data.corpus, data.tokens,\n"
      "data.validation_tokens, init_from). Each must resolve, after symlinks, inside the\n"
      "coordinator's working folder or its --state-dir, else the job is refused. With\n"
      "--data-root DIR (repeatable) the DIRs take the working folder's place (with the\n"
      "state dir's checkpoints/, which 'pipetrain resume' names); --data-root / lets a job\n"
      "name any file this user can read. Whatever the roots, a path must be a regular file\n"
      "(or a folder for init_from): FIFOs, devices and sockets are refused unopened.\n"
      "\n"
      "Security: with --tls-cert/--tls-key/--tls-ca every gRPC connection (CLI, stages) is\n"
      "mutual TLS: clients must show a certificate signed by the CA, and the coordinator\n"
      "shows its own to the stages it calls. With --token-file every call (CLI, HTTP API,\n"
      "stage registration) must carry \"authorization: Bearer <token>\", and the\n"
      "coordinator sends the token on its calls to the stages. Certificates for tests and\n"
      "trials: deploy/certs/make-dev-certs.sh.");
  flags.AddString("listen", &listen, "gRPC address to serve on; port 0 picks a free port",
                  "HOST:PORT");
  flags.AddString("state-dir", &state_dir, "folder for the job store and checkpoints (created)",
                  "DIR");
  flags.AddRepeated("data-root", &data_roots,
                    "jobs' data, validation data and init_from must resolve inside DIR (after "
                    "symlinks); unset: the working folder or the state dir; / for any file",
                    "DIR");
  flags.AddString("tensorboard-dir", &tensorboard_dir,
                  "write each job's TensorBoard event files to DIR/JOB instead of "
                  "STATE_DIR/tensorboard/JOB (created)",
                  "DIR");
  flags.AddString("health-listen", &health_listen,
                  "serve only the gRPC health service here, in plaintext, for probes that cannot "
                  "present a client certificate (Kubernetes grpc probes)",
                  "HOST:PORT");
  flags.AddString("http", &http,
                  "also serve the JSON API (/api/jobs, /api/cluster) and Prometheus metrics "
                  "(/metrics) here",
                  "HOST:PORT");
  flags.AddDouble("heartbeat-timeout", &heartbeat_timeout,
                  "seconds without a heartbeat after which a stage is marked lost", "S");
  flags.AddDouble("stage-deadline", &stage_deadline,
                  "seconds a stage waits for a neighbour's tensor before its step fails; a "
                  "job whose stage dies or drops off the network fails within about S + 3 s, "
                  "naming it (keep S above one micro-batch's pass on the slowest stage)",
                  "S");
  flags.AddInt("events-in-memory", &events_in_memory,
               "events (steps, log lines) of each running job kept in memory for its "
               "watchers; older ones are read from the job store, so memory stays bounded "
               "however long a job runs",
               "N");
  common::AddSecurityFlags(flags, &security_flags,
                           "require this bearer token (the file's contents, trimmed) on every "
                           "call and HTTP request, and send it to the stages");
  flags.AddBool("help", &help, "print this help and exit");
  flags.AddBool("version", &version, "print the version and exit");
  flags.MarkRequired("state-dir");
  auto positionals = flags.Parse(common::Args(argc, argv));
  absl::Status parse_status = positionals.status();
  if (parse_status.ok() && !positionals->empty()) {
    parse_status = absl::InvalidArgumentError("unexpected argument '" + (*positionals)[0] + "'");
  }
  if (parse_status.ok() && !help && !version && state_dir.empty()) {
    parse_status = absl::InvalidArgumentError(
        "--state-dir DIR is required: the folder that keeps the job store and checkpoints");
  }
  absl::StatusOr<common::RpcSecurity> security = common::RpcSecurity();
  if (parse_status.ok() && !help && !version) {
    security = common::RpcSecurity::Load(security_flags);
    parse_status = security.status();
  }
  if (auto code = common::HandleStandardFlags(flags, parse_status, help, version)) return *code;

  auto address = common::ParseHostPort(listen, kDefaultPort, "--listen");
  if (!address.ok()) {
    std::cerr << "pipetrain-coordinator: " << address.status().message() << "\n";
    return 2;
  }
  std::optional<common::HostPort> health_address;
  if (!health_listen.empty()) {
    auto a = common::ParseHostPort(health_listen, 0, "--health-listen");
    if (!a.ok()) {
      std::cerr << "pipetrain-coordinator: " << a.status().message() << "\n";
      return 2;
    }
    health_address = *a;
  }
  std::optional<common::HostPort> http_address;
  if (!http.empty()) {
    auto a = common::ParseHostPort(http, kDefaultHttpPort, "--http");
    if (!a.ok()) {
      std::cerr << "pipetrain-coordinator: " << a.status().message() << "\n";
      return 2;
    }
    http_address = *a;
  }
  if (!(heartbeat_timeout > 0)) {
    std::cerr << "pipetrain-coordinator: --heartbeat-timeout must be > 0 seconds\n";
    return 2;
  }
  if (!(stage_deadline >= 1 && stage_deadline <= 86400)) {
    std::cerr << "pipetrain-coordinator: --stage-deadline must be between 1 and 86400 "
                 "seconds (default 30)\n";
    return 2;
  }

  if (events_in_memory < 1 || events_in_memory > 1000000) {
    std::cerr << "pipetrain-coordinator: --events-in-memory must be between 1 and 1000000 "
                 "(default " << coordinator::kDefaultEventsInMemory << ")\n";
    return 2;
  }
  absl::StatusOr<common::DataRoots> roots = coordinator::JobDataRoots(data_roots, state_dir);
  if (!roots.ok()) {
    std::cerr << "pipetrain-coordinator: " << roots.status().message() << "\n";
    return 2;
  }
  if (roots->allows_everything()) {
    common::LogWarning("coordinator",
                       "a data root is /: a job may name any file this user can read as its "
                       "data or init_from; confine jobs with --data-root DIR (repeatable)");
  }

  coordinator::ManagerOptions options;
  options.state_dir = state_dir;
  options.events_in_memory = static_cast<size_t>(events_in_memory);
  options.tensorboard_dir = tensorboard_dir;
  options.heartbeat_timeout = absl::Seconds(heartbeat_timeout);
  options.heartbeat_interval = std::min(absl::Seconds(1), options.heartbeat_timeout / 3);
  options.runner.recv_deadline_ms = static_cast<int>(stage_deadline * 1000);
  options.runner.security = *security;
  options.runner.data_roots = *std::move(roots);
  auto manager = coordinator::JobManager::Create(options);
  if (!manager.ok()) {
    std::cerr << "pipetrain-coordinator: " << manager.status().message() << "\n";
    return 1;
  }
  std::unique_ptr<coordinator::HttpApi> api;
  if (http_address) {
    auto started = coordinator::HttpApi::Start(manager->get(), http_address->host,
                                               http_address->port, security->token());
    if (!started.ok()) {
      std::cerr << "pipetrain-coordinator: " << started.status().message() << "\n";
      return 1;
    }
    api = *std::move(started);
    if (!common::IsLoopbackHost(http_address->host)) {
      common::LogWarning(
          "coordinator",
          absl::StrCat("the HTTP API on ", http_address->host, ":", api->port(),
                       " is plain HTTP: anyone who can reach it can read jobs and the cluster",
                       security->token().empty() ? "" : ", and see the bearer token clients send",
                       "; keep --http on 127.0.0.1 or put it behind a TLS proxy"));
    }
    std::cout << "coordinator http listening on " << http_address->host << ":" << api->port()
              << std::endl;
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  coordinator::CoordinatorService service(manager->get(), *security);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  auto server = common::StartServer(builder, *address, "coordinator", *security, "submit jobs");
  if (!server.ok()) {
    std::cerr << "pipetrain-coordinator: " << server.status().message() << "\n";
    return 1;
  }
  std::optional<common::RunningServer> health;
  if (health_address) {
    auto started = common::StartHealthServer(*health_address, "coordinator");
    if (!started.ok()) {
      std::cerr << "pipetrain-coordinator: " << started.status().message() << "\n";
      return 1;
    }
    health = *std::move(started);
  }
  common::LogInfo("coordinator", absl::StrCat("state in ", state_dir));
  common::WaitForTerminationSignal();
  // Jobs stop first (each finishes its current step and is recorded), so that the
  // watchers' streams end with the jobs' last state; then the servers stop.
  (*manager)->Shutdown();
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (health) health->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  api.reset();
  common::LogInfo("coordinator", "stopped");
  return 0;
}
