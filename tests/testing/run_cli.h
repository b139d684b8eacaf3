// Runs the `pipetrain` CLI in this process (client::RunCli) and keeps its exit code and
// what it printed, for the tests of its verbs.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "client/cli.h"

namespace pipetrain::testing {

struct CliRun {
  int code = 0;
  std::string out, err;
};

inline CliRun Cli(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  CliRun r;
  r.code = client::RunCli(args, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

}  // namespace pipetrain::testing
