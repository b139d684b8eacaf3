#include "client/remote.h"

#include <chrono>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "common/address.h"
#include "common/channel_args.h"
#include "common/grpc_status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace pipetrain::client {
namespace {

constexpr int kDefaultPort = 7400;

std::string EnvOr(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::string Normalize(const std::string& address) {
  auto hp = common::ParseHostPort(address, kDefaultPort, "--address");
  return hp.ok() ? hp->ToString() : address;
}

// gRPC reports a failed handshake as UNAVAILABLE with the TLS library's words.
bool LooksLikeTls(absl::string_view message) {
  for (absl::string_view word : {"ssl", "SSL", "tls", "TLS", "handshake", "certificate"}) {
    if (absl::StrContains(message, word)) return true;
  }
  return false;
}

}  // namespace

std::string DefaultAddress() {
  const char* env = std::getenv(kAddressEnv);
  return env != nullptr && env[0] != '\0' ? std::string(env) : std::string(kDefaultAddress);
}

void AddRemoteFlags(common::FlagSet& flags, RemoteFlags* remote) {
  remote->address = DefaultAddress();
  flags.AddString("address", &remote->address,
                  absl::StrCat("the coordinator; $", kAddressEnv, " sets the default"),
                  "HOST:PORT");
  common::SecurityFlags& s = remote->security_flags;
  flags.AddString("tls-cert", &s.tls_cert,
                  absl::StrCat("client certificate (PEM) for a coordinator with mutual TLS; "
                               "with --tls-key and --tls-ca. Default $", kTlsCertEnv),
                  "FILE");
  flags.AddString("tls-key", &s.tls_key,
                  absl::StrCat("the private key of --tls-cert (PEM); default $", kTlsKeyEnv),
                  "FILE");
  flags.AddString("tls-ca", &s.tls_ca,
                  absl::StrCat("the CA (PEM) the coordinator's certificate is signed by; "
                               "default $", kTlsCaEnv),
                  "FILE");
  flags.AddString("token-file", &s.token_file,
                  absl::StrCat("send the bearer token in this file; $", kTokenEnv,
                               " holds the token itself otherwise"),
                  "FILE");
}

std::string RemoteExitCodes(absl::string_view exit_one_means, absl::string_view exit_zero_means) {
  return absl::StrCat("Exit codes:\n  0  ", exit_zero_means, "\n  1  ", exit_one_means,
                      "\n  2  usage error, invalid input (spec, address, file), unknown job, or a "
                      "missing or wrong token\n"
                      "  3  cannot reach the coordinator");
}

bool CheckRemoteFlags(const common::FlagSet& flags, RemoteFlags* remote, std::ostream& err) {
  auto hp = common::ParseHostPort(remote->address, kDefaultPort, "--address");
  if (!hp.ok()) {
    UsageError(flags, hp.status().message(), err);
    return false;
  }
  common::SecurityFlags s = remote->security_flags;
  for (auto [value, env] : {std::pair<std::string*, const char*>{&s.tls_cert, kTlsCertEnv},
                            {&s.tls_key, kTlsKeyEnv},
                            {&s.tls_ca, kTlsCaEnv}}) {
    if (value->empty()) *value = EnvOr(env);
  }
  auto security = common::RpcSecurity::Load(s);
  if (!security.ok()) {
    UsageError(flags, security.status().message(), err);
    return false;
  }
  remote->security = *std::move(security);
  if (s.token_file.empty()) remote->security.set_token(EnvOr(kTokenEnv));
  return true;
}

Remote::Remote(std::string verb, const RemoteFlags& remote)
    : verb_(std::move(verb)), address_(Normalize(remote.address)), security_(remote.security) {
  channel_ = grpc::CreateCustomChannel(address_, security_.ChannelCredentials(),
                                       common::ChannelArgumentsFor(common::ChannelUse::kCli));
  stub_ = pipetrain::v1::Coordinator::NewStub(channel_);
}

grpc::Status Remote::GetJob(const std::string& job_id, pipetrain::v1::JobStatus* job,
                            bool include_history) {
  grpc::ClientContext context;
  PrepareUnary(context);
  pipetrain::v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_include_history(include_history);
  return stub_->GetJob(&context, request, job);
}

void Remote::PrepareUnary(grpc::ClientContext& context, int deadline_seconds) const {
  security_.AddToken(context);
  context.set_wait_for_ready(false);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_seconds));
}

grpc::Status Remote::PrepareStream(grpc::ClientContext& context) const {
  security_.AddToken(context);
  context.set_wait_for_ready(false);
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::seconds(kUnaryDeadlineSeconds);
  grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY && state != GRPC_CHANNEL_TRANSIENT_FAILURE &&
         state != GRPC_CHANNEL_SHUTDOWN) {
    if (!channel_->WaitForStateChange(state, deadline)) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("no connection within ", kUnaryDeadlineSeconds, " s"));
    }
    state = channel_->GetState(/*try_to_connect=*/true);
  }
  return grpc::Status::OK;
}

int Remote::Fail(const grpc::Status& status, std::ostream& err,
                 absl::string_view invalid_prefix) const {
  const std::string prefix = absl::StrCat("pipetrain ", verb_, ": ");
  switch (status.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:  // the message says to pass a token
      err << prefix << "the coordinator at " << address_ << " refused the call: "
          << status.error_message() << " (UNAUTHENTICATED)\n";
      return kExitUsage;
    case grpc::StatusCode::PERMISSION_DENIED:
      err << prefix << "the coordinator at " << address_ << " refused the call: "
          << status.error_message() << " (PERMISSION_DENIED). --token-file or " << kTokenEnv
          << " must hold the token in the coordinator's --token-file.\n";
      return kExitUsage;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      if (LooksLikeTls(status.error_message())) {
        err << prefix << "cannot reach the coordinator at " << address_
            << ": the TLS handshake failed (" << status.error_message() << "). "
            << (security_.tls()
                    ? "Check that --tls-ca is the CA that signed the coordinator's certificate, "
                      "that the certificate names this host, and that the coordinator "
                      "trusts the CA of --tls-cert."
                    : "The coordinator may require mutual TLS: pass --tls-cert, --tls-key and "
                      "--tls-ca (or PIPETRAIN_TLS_CERT/KEY/CA).")
            << "\n";
        return kExitUnreachable;
      }
      err << prefix << "cannot reach the coordinator at " << address_ << " ("
          << status.error_message()
          << "). Start a local cluster with 'deploy/local/cluster.sh up', or point --address / "
          << kAddressEnv << " at a running coordinator."
          << (security_.tls() ? " If it is running, check that it trusts the CA of --tls-cert."
                              : " If it requires TLS, pass --tls-cert, --tls-key and --tls-ca.")
          << "\n";
      return kExitUnreachable;
    case grpc::StatusCode::INVALID_ARGUMENT:
      err << prefix << invalid_prefix << status.error_message() << "\n";
      return kExitUsage;
    case grpc::StatusCode::NOT_FOUND:
      err << prefix << status.error_message() << "; 'pipetrain list' shows the jobs\n";
      return kExitUsage;
    case grpc::StatusCode::UNIMPLEMENTED:
      if (absl::StrContains(status.error_message(), "http2 header with status")) {
        // An HTTP server or proxy answered, not gRPC: the address is wrong.
        err << prefix << "the server at " << address_ << " is not a pipetrain coordinator ("
            << status.error_message() << "). Check --address / " << kAddressEnv
            << ", and http_proxy / no_proxy if a proxy is in the way.\n";
        return kExitUnreachable;
      }
      err << prefix << "the coordinator at " << address_ << " does not support this yet ("
          << status.error_message() << "); upgrade it to this CLI's version\n";
      return kExitJobFailed;
    default:
      err << prefix << status.error_message() << " ("
          << absl::StatusCodeToString(common::FromGrpcCode(status.error_code())) << ")\n";
      return kExitJobFailed;
  }
}

int Remote::LostWhileFollowing(const grpc::Status& status, const std::string& job_id,
                               std::ostream& err) const {
  err << "pipetrain " << verb_ << ": lost the coordinator at " << address_ << " while following "
      << job_id << " (" << status.error_message()
      << "). The job may still be running; check with 'pipetrain status " << job_id
      << " --address " << address_ << "'.\n";
  return kExitUnreachable;
}

std::optional<int> ParseJobIdVerb(common::FlagSet& flags, const std::vector<std::string>& args,
                                  const bool& help, RemoteFlags* connection,
                                  std::ostream& out, std::ostream& err, std::string* job_id) {
  std::vector<std::string> positionals;
  if (auto code = ParseVerbFlags(flags, args, help, out, err, &positionals)) return code;
  if (positionals.size() != 1) {
    return UsageError(flags, "takes one job id (see 'pipetrain list')", err);
  }
  if (!CheckRemoteFlags(flags, connection, err)) return kExitUsage;
  *job_id = positionals[0];
  return std::nullopt;
}

}  // namespace pipetrain::client
