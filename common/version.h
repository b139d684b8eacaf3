// What this build is: the pipetrain version and the features compiled in, as printed
// by every binary's --version.
#pragma once

#include <string>

namespace pipetrain::common {

// e.g. "0.1.0 (cuda: on, grpc 1.51.1, protobuf 3.21.12)"
std::string VersionString();
const char* ProjectVersion();
bool BuiltWithCuda();

}  // namespace pipetrain::common
