// pipetrain: the command-line client.
#include <iostream>

#include "client/cli.h"
#include "common/flags.h"

int main(int argc, char** argv) {
  return pipetrain::client::RunCli(pipetrain::common::Args(argc, argv), std::cout,
                                   std::cerr);
}
