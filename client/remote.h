// What every verb that talks to the coordinator shares: the --address flag (falling back
// to $PIPETRAIN_ADDRESS, then 127.0.0.1:7400), a stub on a channel that fails fast when
// nobody listens, deadlines, and one mapping from an RPC's status to message and exit code.
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include "absl/strings/string_view.h"
#include "common/flags.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::client {

inline constexpr char kDefaultAddress[] = "127.0.0.1:7400";
inline constexpr char kAddressEnv[] = "PIPETRAIN_ADDRESS";
inline constexpr int kUnaryDeadlineSeconds = 10;

// $PIPETRAIN_ADDRESS when set and not empty, else 127.0.0.1:7400.
std::string DefaultAddress();

// Adds --address HOST:PORT to a verb's flags, starting *address at DefaultAddress().
void AddAddressFlag(common::FlagSet& flags, std::string* address);

// The help text's exit-code paragraph of remote verbs.
std::string RemoteExitCodes(absl::string_view exit_one_means,
                            absl::string_view exit_zero_means = "success");

// One verb's connection to the coordinator.
class Remote {
 public:
  // `verb` names the verb in messages ("status" -> "pipetrain status: ...").
  Remote(std::string verb, std::string address);

  pipetrain::v1::Coordinator::Stub& stub() { return *stub_; }
  const std::string& address() const { return address_; }

  // A unary call's context: 10 s deadline, and no waiting for a channel that is down.
  void PrepareUnary(grpc::ClientContext& context) const;
  // A stream's context: no deadline (it lasts as long as the job), no waiting either.
  // Since nothing bounds the stream, first waits up to 10 s for the connection; a refused
  // connection returns OK at once and lets the call itself fail with the details.
  grpc::Status PrepareStream(grpc::ClientContext& context) const;

  // Prints what went wrong and what to do to `err` and returns the exit code:
  // UNAVAILABLE or DEADLINE_EXCEEDED -> 3 (cannot reach the coordinator; also when
  // something other than a gRPC server answers), INVALID_ARGUMENT
  // -> 2 (message after `invalid_prefix`), NOT_FOUND -> 2 (and where the jobs are listed),
  // anything else -> 1.
  int Fail(const grpc::Status& status, std::ostream& err,
           absl::string_view invalid_prefix = "") const;

  // The message for a stream that broke while following `job_id`; returns exit code 3.
  int LostWhileFollowing(const grpc::Status& status, const std::string& job_id,
                         std::ostream& err) const;

 private:
  std::string verb_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pipetrain::v1::Coordinator::Stub> stub_;
};

// Checks an --address value; on error prints a usage error and returns false.
bool CheckAddress(const common::FlagSet& flags, const std::string& address, std::ostream& err);

}  // namespace pipetrain::client
