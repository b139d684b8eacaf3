#include "bench/json_command.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace pipetrain::bench {

absl::StatusOr<std::string> CommandOutput(const std::string& command, int* exit_status) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", command));
  std::string output;
  char chunk[1 << 16];
  while (size_t n = fread(chunk, 1, sizeof(chunk), pipe)) output.append(chunk, n);
  *exit_status = pclose(pipe);
  return output;
}

absl::StatusOr<nlohmann::json> RunJsonCommand(const std::string& command) {
  int status = 0;
  absl::StatusOr<std::string> output = CommandOutput(command, &status);
  if (!output.ok()) return output.status();
  const size_t end = output->find_last_not_of('\n');
  const size_t newline = end == std::string::npos ? std::string::npos : output->rfind('\n', end);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  const std::string last_line =
      end == std::string::npos ? "" : output->substr(begin, end - begin + 1);
  const nlohmann::json j = nlohmann::json::parse(last_line, nullptr, /*allow_exceptions=*/false);
  if (status != 0 || !j.is_object()) {
    return absl::InternalError(
        absl::StrCat(command, " failed (status ", status,
                     "): ", output->substr(output->size() > 400 ? output->size() - 400 : 0)));
  }
  return j;
}

}  // namespace pipetrain::bench
