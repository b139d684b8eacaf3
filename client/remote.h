// What every verb that talks to the coordinator shares: the --address flag (falling back
// to $PIPETRAIN_ADDRESS, then 127.0.0.1:7400), the TLS and token flags (falling back to
// $PIPETRAIN_TLS_CERT/KEY/CA and $PIPETRAIN_TOKEN), a stub on a channel that fails fast
// when nobody listens, deadlines, and one mapping from an RPC's status to exit code.
#pragma once

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/flags.h"
#include "common/rpc_security.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::client {

inline constexpr char kDefaultAddress[] = "127.0.0.1:7400";
inline constexpr char kAddressEnv[] = "PIPETRAIN_ADDRESS";
inline constexpr char kTlsCertEnv[] = "PIPETRAIN_TLS_CERT";
inline constexpr char kTlsKeyEnv[] = "PIPETRAIN_TLS_KEY";
inline constexpr char kTlsCaEnv[] = "PIPETRAIN_TLS_CA";
inline constexpr char kTokenEnv[] = "PIPETRAIN_TOKEN";  // the token itself
inline constexpr int kUnaryDeadlineSeconds = 10;
// SubmitJob answers once the coordinator has mapped and scanned every token file of the
// job (each id against the vocabulary): seconds per GB read from a cold disk.
inline constexpr int kSubmitDeadlineSeconds = 600;

// $PIPETRAIN_ADDRESS when set and not empty, else 127.0.0.1:7400.
std::string DefaultAddress();

// How a verb reaches the coordinator: the flags as given, then what they load.
struct RemoteFlags {
  std::string address;
  common::SecurityFlags security_flags;
  common::RpcSecurity security;  // filled by CheckRemoteFlags
};

// Adds --address HOST:PORT (starting at DefaultAddress()), --tls-cert, --tls-key,
// --tls-ca and --token-file to a verb's flags.
void AddRemoteFlags(common::FlagSet& flags, RemoteFlags* remote);

// Checks the address and loads TLS files and the token, each flag falling back to its
// environment variable; a partial TLS set, an unreadable file or an empty token file
// prints a usage error naming the flag and returns false.
bool CheckRemoteFlags(const common::FlagSet& flags, RemoteFlags* remote, std::ostream& err);

// Parses a verb's flags and its one job id, then CheckRemoteFlags; nullopt: go on,
// otherwise the exit code (help printed, or a usage error).
std::optional<int> ParseJobIdVerb(common::FlagSet& flags, const std::vector<std::string>& args,
                                  const bool& help, RemoteFlags* connection,
                                  std::ostream& out, std::ostream& err, std::string* job_id);

// The help text's exit-code paragraph of remote verbs.
std::string RemoteExitCodes(absl::string_view exit_one_means,
                            absl::string_view exit_zero_means = "success");

// One verb's connection to the coordinator.
class Remote {
 public:
  // `verb` names the verb in messages ("status" -> "pipetrain status: ..."); `remote`
  // has passed CheckRemoteFlags.
  Remote(std::string verb, const RemoteFlags& remote);

  pipetrain::v1::Coordinator::Stub& stub() { return *stub_; }
  const std::string& address() const { return address_; }

  // A unary call's context: a deadline (10 s unless given), no waiting for a channel
  // that is down, and the bearer token when there is one.
  void PrepareUnary(grpc::ClientContext& context,
                    int deadline_seconds = kUnaryDeadlineSeconds) const;
  // A stream's context: no deadline (it lasts as long as the job), no waiting either.
  // Carries the token. Since nothing bounds the stream, first waits up to 10 s for the
  // connection; a refused
  // connection returns OK at once and lets the call itself fail with the details.
  grpc::Status PrepareStream(grpc::ClientContext& context) const;

  // Prints what went wrong and what to do to `err` and returns the exit code:
  // UNAVAILABLE or DEADLINE_EXCEEDED -> 3 (cannot reach the coordinator; also when
  // something other than a gRPC server answers), INVALID_ARGUMENT
  // -> 2 (message after `invalid_prefix`), NOT_FOUND -> 2 (and where the jobs are listed),
  // UNAUTHENTICATED or PERMISSION_DENIED -> 2 (and how to pass the token), anything
  // else -> 1.
  // GetJob as a unary call (history included when asked).
  grpc::Status GetJob(const std::string& job_id, pipetrain::v1::JobStatus* job,
                      bool include_history = false);

  int Fail(const grpc::Status& status, std::ostream& err,
           absl::string_view invalid_prefix = "") const;

  // The message for a stream that broke while following `job_id`; returns exit code 3.
  int LostWhileFollowing(const grpc::Status& status, const std::string& job_id,
                         std::ostream& err) const;

 private:
  std::string verb_;
  std::string address_;
  common::RpcSecurity security_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pipetrain::v1::Coordinator::Stub> stub_;
};

}  // namespace pipetrain::client
