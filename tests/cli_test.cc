#include "client/cli.h"

#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::client {
namespace {

using ::testing::HasSubstr;

int Cli(std::vector<std::string> args, std::string* out, std::string* err) {
  std::ostringstream o, e;
  int code = RunCli(args, o, e);
  *out = o.str();
  *err = e.str();
  return code;
}

TEST(CliTest, HelpListsEveryVerbAndExitsZero) {
  std::string out, err;
  EXPECT_EQ(Cli({"--help"}, &out, &err), kExitOk);
  for (const Verb& v : Verbs()) EXPECT_THAT(out, HasSubstr(v.name));
  EXPECT_THAT(out, HasSubstr("Exit codes"));
}

TEST(CliTest, VersionPrintsTheProjectVersion) {
  std::string out, err;
  EXPECT_EQ(Cli({"--version"}, &out, &err), kExitOk);
  EXPECT_THAT(out, HasSubstr("pipetrain 0."));
  EXPECT_THAT(out, HasSubstr("grpc"));
  EXPECT_EQ(Cli({"version"}, &out, &err), kExitOk);
  EXPECT_THAT(out, HasSubstr("pipetrain 0."));
}

TEST(CliTest, UsageErrorsExitTwoAndSayWhatToDo) {
  std::string out, err;
  EXPECT_EQ(Cli({}, &out, &err), kExitUsage);
  EXPECT_EQ(Cli({"frobnicate"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("unknown verb 'frobnicate'"));
  EXPECT_THAT(err, HasSubstr("pipetrain --help"));
  EXPECT_EQ(Cli({"version", "extra"}, &out, &err), kExitUsage);
}

}  // namespace
}  // namespace pipetrain::client
