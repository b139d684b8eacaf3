// Security of every pipetrain connection: mutual TLS from --tls-cert/--tls-key/--tls-ca
// (all three or none) and the bearer token from --token-file, turned into gRPC server
// and channel credentials, call metadata, and the check a server makes on each call.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/flags.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"

namespace pipetrain::common {

// The flags as given: file names, empty when not given.
struct SecurityFlags {
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  std::string token_file;
};

// Adds --tls-cert, --tls-key, --tls-ca and --token-file to `flags`. `token_help` says
// what the token is for in this binary; empty: no --token-file (benchmarks).
void AddSecurityFlags(FlagSet& flags, SecurityFlags* out, const std::string& token_help);

inline constexpr char kAuthorizationKey[] = "authorization";
inline constexpr char kMissingTokenMessage[] =
    "missing bearer token: pass --token-file or set PIPETRAIN_TOKEN";

// Checks the value of an "authorization" header or metadata entry (nullopt when absent)
// against `expected` ("Bearer <expected>"). OK when `expected` is empty (no token
// required); UNAUTHENTICATED when absent, PERMISSION_DENIED when wrong. Compares in
// time independent of where the token differs.
absl::Status CheckBearerToken(std::optional<absl::string_view> authorization,
                              const std::string& expected);

class RpcSecurity {
 public:
  RpcSecurity() = default;  // plaintext, no token

  // Reads the PEM files and the token file. Given only some of the TLS flags, or an
  // empty token file, or a file that cannot be read or is not PEM: INVALID_ARGUMENT
  // naming the flag and the file.
  static absl::StatusOr<RpcSecurity> Load(const SecurityFlags& flags);

  bool tls() const { return !cert_pem_.empty(); }
  const std::string& token() const { return token_; }
  // For the CLI's PIPETRAIN_TOKEN (the token itself); trimmed like a file's contents.
  void set_token(absl::string_view token);

  // Mutual TLS (client certificates required and verified against the CA) or plaintext.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  // TLS with this process's certificate as the client certificate, or plaintext. With
  // TLS the target's host must be one of the server certificate's names (SANs).
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;

  // Adds "authorization: Bearer <token>" to a call; nothing without a token.
  void AddToken(grpc::ClientContext& context) const;
  // The server side: OK when no token is required or the call carries this token.
  grpc::Status Authorize(const grpc::ServerContextBase& context) const;
  // The caller's verified certificate identity (its subject alternative names, else
  // its common name, joined by ","), or "" without TLS: what a registration is tied to.
  static std::string PeerIdentity(const grpc::ServerContextBase& context);

 private:
  std::string cert_pem_, key_pem_, ca_pem_;
  std::string token_;
};

}  // namespace pipetrain::common
