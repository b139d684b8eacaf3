// The `pipetrain` command line: a table of verbs, each a thin call into a library or
// one coordinator RPC. RunCli is the whole program minus process set-up, so tests can
// drive it and check its output and exit code.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace pipetrain::client {

// Exit codes every verb uses.
inline constexpr int kExitOk = 0;
inline constexpr int kExitJobFailed = 1;    // the job failed or was cancelled
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

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
