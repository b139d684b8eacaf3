// Parses listen and peer addresses: "HOST:PORT", "[v6]:PORT", or a bare "HOST" that
// takes a default port. Port 0 asks the OS for a free port.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace pipetrain::common {

struct HostPort {
  std::string host;  // without brackets
  int port = 0;
  std::string ToString() const;  // brackets an IPv6 host
};

// `field` names the flag or spec field in error messages.
absl::StatusOr<HostPort> ParseHostPort(const std::string& text, int default_port,
                                       const std::string& field);

// True for 127.0.0.0/8, ::1 and "localhost".
bool IsLoopbackHost(const std::string& host);

}  // namespace pipetrain::common
