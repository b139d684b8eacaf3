#include "client/remote.h"

#include <chrono>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "common/address.h"
#include "common/grpc_status.h"
#include "common/server_runner.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace pipetrain::client {
namespace {

constexpr int kDefaultPort = 7400;
// A followed job can be quiet for minutes between steps; keepalive pings notice a
// coordinator whose host vanished without closing the connection. The coordinator's
// servers accept pings this often (common/server_runner.cc).
constexpr int kKeepaliveMs = 30'000;
constexpr int kKeepaliveTimeoutMs = 10'000;

std::string Normalize(const std::string& address) {
  auto hp = common::ParseHostPort(address, kDefaultPort, "--address");
  return hp.ok() ? hp->ToString() : address;
}

}  // namespace

std::string DefaultAddress() {
  const char* env = std::getenv(kAddressEnv);
  return env != nullptr && env[0] != '\0' ? std::string(env) : std::string(kDefaultAddress);
}

void AddAddressFlag(common::FlagSet& flags, std::string* address) {
  *address = DefaultAddress();
  flags.AddString("address", address,
                  absl::StrCat("the coordinator; $", kAddressEnv, " sets the default"),
                  "HOST:PORT");
}

std::string RemoteExitCodes(absl::string_view exit_one_means, absl::string_view exit_zero_means) {
  return absl::StrCat("Exit codes:\n  0  ", exit_zero_means, "\n  1  ", exit_one_means,
                      "\n  2  usage error, invalid input (spec, address, file) or unknown job\n"
                      "  3  cannot reach the coordinator");
}

bool CheckAddress(const common::FlagSet& flags, const std::string& address, std::ostream& err) {
  auto hp = common::ParseHostPort(address, kDefaultPort, "--address");
  if (hp.ok()) return true;
  UsageError(flags, hp.status().message(), err);
  return false;
}

Remote::Remote(std::string verb, std::string address)
    : verb_(std::move(verb)), address_(Normalize(address)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(common::kMaxMessageBytes);  // long histories and timelines
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
  stub_ = pipetrain::v1::Coordinator::NewStub(channel_);
}

void Remote::PrepareUnary(grpc::ClientContext& context) const {
  context.set_wait_for_ready(false);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(kUnaryDeadlineSeconds));
}

grpc::Status Remote::PrepareStream(grpc::ClientContext& context) const {
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
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      err << prefix << "cannot reach the coordinator at " << address_ << " ("
          << status.error_message()
          << "). Start a local cluster with 'deploy/local/cluster.sh up', or point --address / "
          << kAddressEnv << " at a running coordinator.\n";
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

}  // namespace pipetrain::client
