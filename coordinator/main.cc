// pipetrain-coordinator: plans jobs, drives their steps and serves the API. main reads
// as its steps: the flags parsed, then checked into options (exit 2 on a bad flag),
// the job manager and servers started (exit 1 when one cannot start), a wait for
// SIGINT/SIGTERM, and the stop.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/rpc_security.h"
#include "common/server_runner.h"
#include "common/status_macros.h"
#include "coordinator/api/coordinator_service.h"
#include "coordinator/api/http_api.h"
#include "coordinator/jobs/job_events.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/runner/job_paths.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace pipetrain {
namespace {

constexpr int kDefaultPort = 7400;
constexpr int kDefaultHttpPort = 7401;

// The command line as given; the initial values are the flags' defaults.
struct Flags {
  std::string listen = "127.0.0.1:7400";
  std::string state_dir, http, health_listen, tensorboard_dir;
  std::string on_stop = "recover";
  std::vector<std::string> data_roots;
  double heartbeat_timeout = 5;
  double stage_deadline = 30;
  int64_t events_in_memory = coordinator::kDefaultEventsInMemory;
  bool help = false, version = false;
  common::SecurityFlags security;
};

// What the flags mean, checked.
struct Options {
  common::HostPort address;
  std::optional<common::HostPort> health_address, http_address;
  common::RpcSecurity security;
  coordinator::ManagerOptions manager;
};

// What runs until the stop, in the order it starts (and stops in reverse).
struct Running {
  std::unique_ptr<coordinator::JobManager> manager;
  std::unique_ptr<coordinator::HttpApi> api;
  std::unique_ptr<coordinator::CoordinatorService> service;
  common::RunningServer server;
  std::optional<common::RunningServer> health;
};

constexpr char kDescription[] =
    "Plans pipeline-parallel training jobs over the registered stage servers, drives\n"
    "them step by step, checkpoints them, and serves the pipetrain API (gRPC service\n"
    "pipetrain.v1.Coordinator, gRPC health and reflection; JSON and /metrics over HTTP\n"
    "with --http).\n"
    "Jobs, their step history and logs are kept in DIR/jobs.db (SQLite), checkpoints in\n"
    "DIR/checkpoints/JOB/step-N/, TensorBoard event files (every step's scalars) in\n"
    "DIR/tensorboard/JOB/ (tensorboard --logdir DIR/tensorboard).\n"
    "\n"
    "Stopping: runs until SIGINT or SIGTERM. A job running then (or recovering, or\n"
    "waiting for its stages) stops after its current step with a checkpoint, and\n"
    "--on-stop says what it becomes: with recover (the default) it is recorded\n"
    "RECOVERING, for the next coordinator on DIR to continue (FAILED, naming the\n"
    "checkpoint, with fault_tolerance.max_restarts 0); with cancel it ends CANCELLED,\n"
    "naming the step, the checkpoint and 'pipetrain resume JOB' (for stops meant as\n"
    "final, such as scancel). Queued jobs stay QUEUED either way and start on the next\n"
    "coordinator on DIR. Stage servers signalled at the same moment (scancel signals\n"
    "every process of a job) keep serving a job that holds them until it lets them go,\n"
    "for up to their --stop-grace, so that its step and checkpoint can finish.\n"
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
    "trials: deploy/certs/make-dev-certs.sh.";

// Where it serves and keeps its state (in the help's order, before DefineLimitFlags').
void DefinePlaceFlags(common::FlagSet& flags, Flags& f) {
  flags.AddString("listen", &f.listen, "gRPC address to serve on; port 0 picks a free port",
                  "HOST:PORT");
  flags.AddString("state-dir", &f.state_dir,
                  "folder for the job store and checkpoints (created)", "DIR");
  flags.AddRepeated("data-root", &f.data_roots,
                    "jobs' data, validation data and init_from must resolve inside DIR (after "
                    "symlinks); unset: the working folder or the state dir; / for any file",
                    "DIR");
  flags.AddString("tensorboard-dir", &f.tensorboard_dir,
                  "write each job's TensorBoard event files to DIR/JOB instead of "
                  "STATE_DIR/tensorboard/JOB (created)",
                  "DIR");
  flags.AddString("health-listen", &f.health_listen,
                  "serve only the gRPC health service here, in plaintext, for probes that cannot "
                  "present a client certificate (Kubernetes grpc probes)",
                  "HOST:PORT");
  flags.AddString("http", &f.http,
                  "also serve the JSON API (/api/jobs, /api/cluster) and Prometheus metrics "
                  "(/metrics) here",
                  "HOST:PORT");
}

// Deadlines and bounds, the stop, security, help.
void DefineLimitFlags(common::FlagSet& flags, Flags& f) {
  flags.AddDouble("heartbeat-timeout", &f.heartbeat_timeout,
                  "seconds without a heartbeat after which a stage is marked lost", "S");
  flags.AddDouble("stage-deadline", &f.stage_deadline,
                  "seconds a stage waits for a neighbour's tensor before its step fails; a "
                  "job whose stage dies or drops off the network fails within about S + 3 s, "
                  "naming it (keep S above one micro-batch's pass on the slowest stage)",
                  "S");
  flags.AddInt("events-in-memory", &f.events_in_memory,
               "events (steps, log lines) of each running job kept in memory for its "
               "watchers; older ones are read from the job store, so memory stays bounded "
               "however long a job runs",
               "N");
  flags.AddString("on-stop", &f.on_stop,
                  "what a job running on SIGINT/SIGTERM becomes once its current step is done "
                  "and checkpointed: recover (RECOVERING, continued by the next coordinator on "
                  "the same --state-dir) or cancel (CANCELLED, continued with 'pipetrain resume "
                  "JOB'); queued jobs stay QUEUED either way",
                  "recover|cancel");
  common::AddSecurityFlags(flags, &f.security,
                           "require this bearer token (the file's contents, trimmed) on every "
                           "call and HTTP request, and send it to the stages");
  flags.AddBool("help", &f.help, "print this help and exit");
  flags.AddBool("version", &f.version, "print the version and exit");
  flags.MarkRequired("state-dir");
}

// Parses the command line into `f` and loads the TLS files and token; the exit code
// when the program ends here (--help, --version, a usage error), else nullopt.
std::optional<int> ParseFlags(int argc, char** argv, Flags& f,
                              absl::StatusOr<common::RpcSecurity>& security) {
  common::FlagSet flags(
      "pipetrain-coordinator",
      "--state-dir DIR [--listen HOST:PORT] [--http HOST:PORT] [--data-root DIR]...\n"
      "    [--tensorboard-dir DIR] [--on-stop recover|cancel]\n"
      "    [--tls-cert FILE --tls-key FILE --tls-ca FILE] [--token-file FILE]",
      kDescription);
  DefinePlaceFlags(flags, f);
  DefineLimitFlags(flags, f);
  auto positionals = flags.Parse(common::Args(argc, argv));
  absl::Status status = positionals.status();
  if (status.ok() && !positionals->empty()) {
    status = absl::InvalidArgumentError("unexpected argument '" + (*positionals)[0] + "'");
  }
  const bool runs = !f.help && !f.version;
  if (status.ok() && runs && f.state_dir.empty()) {
    status = absl::InvalidArgumentError(
        "--state-dir DIR is required: the folder that keeps the job store and checkpoints");
  }
  if (status.ok() && runs) {
    security = common::RpcSecurity::Load(f.security);
    status = security.status();
  }
  return common::HandleStandardFlags(flags, status, f.help, f.version);
}

// An optional HOST:PORT flag: nullopt when unset.
absl::StatusOr<std::optional<common::HostPort>> OptionalAddress(const std::string& value,
                                                                int default_port,
                                                                const char* flag) {
  if (value.empty()) return std::nullopt;
  ASSIGN_OR_RETURN(common::HostPort a, common::ParseHostPort(value, default_port, flag));
  return a;
}

absl::StatusOr<coordinator::OnStop> OnStopOf(const std::string& value) {
  if (value == "recover") return coordinator::OnStop::kRecover;
  if (value == "cancel") return coordinator::OnStop::kCancel;
  return absl::InvalidArgumentError(
      absl::StrCat("--on-stop must be recover or cancel, not '", value, "'"));
}

absl::Status CheckNumbers(const Flags& f) {
  const Flags defaults;
  if (!(f.heartbeat_timeout > 0)) {
    return absl::InvalidArgumentError("--heartbeat-timeout must be > 0 seconds");
  }
  if (!(f.stage_deadline >= 1 && f.stage_deadline <= 86400)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stage-deadline must be between 1 and 86400 seconds (default ",
        defaults.stage_deadline, ")"));
  }
  if (f.events_in_memory < 1 || f.events_in_memory > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--events-in-memory must be between 1 and 1000000 (default ", defaults.events_in_memory,
        ")"));
  }
  return absl::OkStatus();
}

coordinator::ManagerOptions ManagerOptionsOf(const Flags& f, const common::RpcSecurity& security,
                                             common::DataRoots roots) {
  coordinator::ManagerOptions options;
  options.state_dir = f.state_dir;
  options.events_in_memory = static_cast<size_t>(f.events_in_memory);
  options.tensorboard_dir = f.tensorboard_dir;
  options.heartbeat_timeout = absl::Seconds(f.heartbeat_timeout);
  options.heartbeat_interval = std::min(absl::Seconds(1), options.heartbeat_timeout / 3);
  options.runner.recv_deadline_ms = static_cast<int>(f.stage_deadline * 1000);
  options.runner.security = security;
  options.runner.data_roots = std::move(roots);
  return options;
}

// Every flag checked; the error names the flag.
absl::StatusOr<Options> CheckFlags(const Flags& f, common::RpcSecurity security) {
  Options o;
  ASSIGN_OR_RETURN(o.address, common::ParseHostPort(f.listen, kDefaultPort, "--listen"));
  ASSIGN_OR_RETURN(o.health_address, OptionalAddress(f.health_listen, 0, "--health-listen"));
  ASSIGN_OR_RETURN(o.http_address, OptionalAddress(f.http, kDefaultHttpPort, "--http"));
  RETURN_IF_ERROR(CheckNumbers(f));
  ASSIGN_OR_RETURN(const coordinator::OnStop on_stop, OnStopOf(f.on_stop));
  ASSIGN_OR_RETURN(common::DataRoots roots, coordinator::JobDataRoots(f.data_roots, f.state_dir));
  o.manager = ManagerOptionsOf(f, security, std::move(roots));
  o.manager.on_stop = on_stop;
  o.security = std::move(security);
  return o;
}

// A root of / lets a job read anything this user can: said once, at start.
void WarnIfUnconfined(const common::DataRoots& roots) {
  if (roots.allows_everything()) {
    common::LogWarning("coordinator",
                       "a data root is /: a job may name any file this user can read as its "
                       "data or init_from; confine jobs with --data-root DIR (repeatable)");
  }
}

absl::StatusOr<std::unique_ptr<coordinator::HttpApi>> StartHttp(coordinator::JobManager* manager,
                                                                const common::HostPort& at,
                                                                const std::string& token) {
  ASSIGN_OR_RETURN(std::unique_ptr<coordinator::HttpApi> api,
                   coordinator::HttpApi::Start(manager, at.host, at.port, token));
  if (!common::IsLoopbackHost(at.host)) {
    common::LogWarning(
        "coordinator",
        absl::StrCat("the HTTP API on ", at.host, ":", api->port(),
                     " is plain HTTP: anyone who can reach it can read jobs and the cluster",
                     token.empty() ? "" : ", and see the bearer token clients send",
                     "; keep --http on 127.0.0.1 or put it behind a TLS proxy"));
  }
  std::cout << "coordinator http listening on " << at.host << ":" << api->port() << std::endl;
  return api;
}

absl::Status StartGrpc(const Options& o, Running& r) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  r.service = std::make_unique<coordinator::CoordinatorService>(r.manager.get(), o.security);
  grpc::ServerBuilder builder;
  builder.RegisterService(r.service.get());
  ASSIGN_OR_RETURN(r.server,
                   common::StartServer(builder, o.address, "coordinator", o.security, "submit jobs"));
  if (o.health_address) {
    ASSIGN_OR_RETURN(r.health, common::StartHealthServer(*o.health_address, "coordinator"));
  }
  return absl::OkStatus();
}

// The job manager (jobs a previous coordinator left continue), the HTTP API, the gRPC
// servers.
absl::Status Start(Options& o, Running& r) {
  WarnIfUnconfined(o.manager.runner.data_roots);
  ASSIGN_OR_RETURN(r.manager, coordinator::JobManager::Create(o.manager));
  if (o.http_address) {
    ASSIGN_OR_RETURN(r.api, StartHttp(r.manager.get(), *o.http_address, o.security.token()));
  }
  return StartGrpc(o, r);
}

// Jobs stop first (each finishes its current step, is checkpointed and recorded as
// --on-stop says, and frees its stages), so that the watchers' streams end with the
// jobs' last state and stages signalled with us hear from their heartbeats that they
// may go; then the servers stop.
void Stop(Running& r) {
  r.manager->Shutdown();
  r.server.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (r.health) r.health->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  r.api.reset();
}

int Exit(const absl::Status& status, int code) {
  std::cerr << "pipetrain-coordinator: " << status.message() << "\n";
  return code;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  using namespace pipetrain;
  common::BlockTerminationSignals();
  // Not common::KeepFreedMemoryForReuse(): that is for the stages' tensor buffers; the
  // coordinator gives freed memory back, so its resident size follows what it holds
  // (pipetrain-bench coordinator-load), not the peak of every burst of watchers.
  Flags flags;
  absl::StatusOr<common::RpcSecurity> security = common::RpcSecurity();
  if (std::optional<int> code = ParseFlags(argc, argv, flags, security)) return *code;
  absl::StatusOr<Options> options = CheckFlags(flags, *std::move(security));
  if (!options.ok()) return Exit(options.status(), 2);
  Running running;
  if (absl::Status s = Start(*options, running); !s.ok()) return Exit(s, 1);
  common::LogInfo("coordinator", absl::StrCat("state in ", flags.state_dir));
  common::WaitForTerminationSignal();
  Stop(running);
  common::LogInfo("coordinator", "stopped");
  return 0;
}
