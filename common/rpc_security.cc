#include "common/rpc_security.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/user_path.h"

namespace pipetrain::common {
namespace {

absl::StatusOr<std::string> ReadFlagFile(const std::string& flag, const std::string& path) {
  // A token or PEM file is small; a FIFO or device named here must not block start-up.
  absl::StatusOr<std::string> text =
      ReadRegularFile(path, kMaxSecretFileBytes, absl::StrCat("--", flag));
  if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
  return text;
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  ASSIGN_OR_RETURN(std::string pem, ReadFlagFile(flag, path));
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " ", path, ": not a PEM file (no '-----BEGIN' line); "
        "deploy/certs/make-dev-certs.sh makes a CA and certificates"));
  }
  return pem;
}

// Equal strings in time that depends only on their lengths.
bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

void AddSecurityFlags(FlagSet& flags, SecurityFlags* out, const std::string& token_help) {
  flags.AddString("tls-cert", &out->tls_cert,
                  "this process's certificate (PEM), served and shown to servers it calls; "
                  "with --tls-key and --tls-ca turns on mutual TLS",
                  "FILE");
  flags.AddString("tls-key", &out->tls_key, "the private key of --tls-cert (PEM)", "FILE");
  flags.AddString("tls-ca", &out->tls_ca,
                  "the CA (PEM) that every peer's certificate must be signed by", "FILE");
  if (!token_help.empty()) flags.AddString("token-file", &out->token_file, token_help, "FILE");
}

absl::Status CheckBearerToken(std::optional<absl::string_view> authorization,
                              const std::string& expected) {
  if (expected.empty()) return absl::OkStatus();
  if (!authorization.has_value()) return absl::UnauthenticatedError(kMissingTokenMessage);
  absl::string_view value = absl::StripAsciiWhitespace(*authorization);
  constexpr absl::string_view kBearer = "Bearer ";
  if (value.size() < kBearer.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kBearer.size()), kBearer)) {
    return absl::UnauthenticatedError(absl::StrCat(
        kMissingTokenMessage, " (the authorization header is not 'Bearer <token>')"));
  }
  if (!ConstantTimeEqual(absl::StripAsciiWhitespace(value.substr(kBearer.size())), expected)) {
    return absl::PermissionDeniedError(
        "wrong bearer token: use the token in the server's --token-file");
  }
  return absl::OkStatus();
}

absl::StatusOr<RpcSecurity> RpcSecurity::Load(const SecurityFlags& flags) {
  RpcSecurity out;
  const int given = !flags.tls_cert.empty() + !flags.tls_key.empty() + !flags.tls_ca.empty();
  if (given != 0 && given != 3) {
    std::string missing;
    for (auto [name, value] : {std::pair<const char*, const std::string*>{"--tls-cert", &flags.tls_cert},
                               {"--tls-key", &flags.tls_key},
                               {"--tls-ca", &flags.tls_ca}}) {
      if (value->empty()) absl::StrAppend(&missing, missing.empty() ? "" : " and ", name);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        missing, " missing: TLS needs all three of --tls-cert, --tls-key and --tls-ca "
        "(or none of them for plaintext)"));
  }
  if (given == 3) {
    ASSIGN_OR_RETURN(out.cert_pem_, ReadPem("tls-cert", flags.tls_cert));
    ASSIGN_OR_RETURN(out.key_pem_, ReadPem("tls-key", flags.tls_key));
    ASSIGN_OR_RETURN(out.ca_pem_, ReadPem("tls-ca", flags.tls_ca));
  }
  if (!flags.token_file.empty()) {
    ASSIGN_OR_RETURN(std::string token, ReadFlagFile("token-file", flags.token_file));
    out.set_token(token);
    if (out.token_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--token-file ", flags.token_file, ": the file is empty; put the token in it"));
    }
  }
  return out;
}

void RpcSecurity::set_token(absl::string_view token) {
  token_ = std::string(absl::StripAsciiWhitespace(token));
}

std::shared_ptr<grpc::ServerCredentials> RpcSecurity::ServerCredentials() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = ca_pem_;
  options.pem_key_cert_pairs.push_back({key_pem_, cert_pem_});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> RpcSecurity::ChannelCredentials() const {
  if (!tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca_pem_;
  options.pem_private_key = key_pem_;
  options.pem_cert_chain = cert_pem_;
  return grpc::SslCredentials(options);
}

void RpcSecurity::AddToken(grpc::ClientContext& context) const {
  if (!token_.empty()) context.AddMetadata(kAuthorizationKey, absl::StrCat("Bearer ", token_));
}

std::string RpcSecurity::PeerIdentity(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  std::string identity;
  for (const grpc::string_ref& id : auth->GetPeerIdentity()) {
    absl::StrAppend(&identity, identity.empty() ? "" : ",",
                    absl::string_view(id.data(), id.size()));
  }
  return identity;
}

grpc::Status RpcSecurity::Authorize(const grpc::ServerContextBase& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationKey);
  std::optional<absl::string_view> value;
  if (it != metadata.end()) value = absl::string_view(it->second.data(), it->second.size());
  return ToGrpcStatus(CheckBearerToken(value, token_));
}

}  // namespace pipetrain::common
