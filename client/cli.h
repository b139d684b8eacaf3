// The `pipetrain` command line: a table of verbs, each a thin call into a library or
// one coordinator RPC. RunCli is the whole program minus process set-up, so tests can
// drive it and check its output and exit code.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/flags.h"

namespace pipetrain::client {

// Exit codes every verb uses.
inline constexpr int kExitOk = 0;
inline constexpr int kExitJobFailed = 1;    // the job (or an in-process run) failed
inline constexpr int kExitUsage = 2;        // usage error or invalid spec
inline constexpr int kExitUnreachable = 3;  // cannot reach the coordinator

struct Verb {
  std::string name;
  std::string summary;  // one line for `pipetrain --help`
  std::function<int(const std::vector<std::string>& args, std::ostream& out,
                     std::ostream& err)>
      run;
};

// The verbs this build has, in the order --help lists them.
const std::vector<Verb>& Verbs();

// Parses a verb's flags; `help` is its --help flag's target. Returns the exit code to
// leave with when the verb should stop: kExitOk after printing the help to `out`,
// kExitUsage after a parse error or a positional argument (there must be none when
// `positionals` is null), printed to `err` with a hint. nullopt: go on.
std::optional<int> ParseVerbFlags(common::FlagSet& flags, const std::vector<std::string>& args,
                                  const bool& help, std::ostream& out, std::ostream& err,
                                  std::vector<std::string>* positionals = nullptr);

// Prints "PROGRAM: message" and the --help hint to `err`; returns kExitUsage.
int UsageError(const common::FlagSet& flags, absl::string_view message, std::ostream& err);

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
