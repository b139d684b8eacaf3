// Runs a helper program of a benchmark (a Python or node script measuring a baseline)
// through the shell and reads the one JSON object it prints on its last line.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace pipetrain::bench {

// Everything the command writes to stdout (add 2>&1 for stderr too); an error when it
// cannot be started.
absl::StatusOr<std::string> CommandOutput(const std::string& command, int* exit_status);

// The JSON object on the command's last line; anything before it (an interpreter's
// warnings) is ignored. An error, with the output's tail, when the command fails or
// its last line is not a JSON object.
absl::StatusOr<nlohmann::json> RunJsonCommand(const std::string& command);

}  // namespace pipetrain::bench
