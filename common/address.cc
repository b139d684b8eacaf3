#include "common/address.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::common {

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& text, int default_port,
                                       const std::string& field) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " '", text, "' is not HOST:PORT: ", why));
  };
  if (text.empty()) return bad("it is empty");
  HostPort hp;
  std::string port_text;
  if (text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) return bad("missing ']' after the IPv6 address");
    hp.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return bad("expected ':' after ']'");
      port_text = text.substr(close + 2);
      if (port_text.empty()) return bad("the port is empty");
    }
  } else {
    const size_t colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') != colon) {
      return bad("write IPv6 addresses as [ADDRESS]:PORT");
    }
    hp.host = text.substr(0, colon);
    if (colon != std::string::npos) {
      port_text = text.substr(colon + 1);
      if (port_text.empty()) return bad("the port is empty");
    }
  }
  if (hp.host.empty()) return bad("the host is empty");
  hp.port = default_port;
  if (!port_text.empty()) {
    int port = -1;
    if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
      return bad(absl::StrCat("port '", port_text, "' is not a number from 0 to 65535"));
    }
    hp.port = port;
  }
  return hp;
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace pipetrain::common
