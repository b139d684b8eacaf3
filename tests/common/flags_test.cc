#include "common/flags.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Fixture {
  std::string listen = "127.0.0.1:7400";
  int64_t steps = 10;
  double lr = 0.001;
  bool json = false;
  std::vector<std::string> sets;
  FlagSet flags{"prog", "VERB [flags]", "Does things."};
  Fixture() {
    flags.AddString("listen", &listen, "where", "HOST:PORT");
    flags.AddInt("steps", &steps, "how many");
    flags.AddDouble("lr", &lr, "rate");
    flags.AddBool("json", &json, "as JSON");
    flags.AddRepeated("set", &sets, "override", "FIELD=VALUE");
  }
};

TEST(FlagsTest, ParsesEveryForm) {
  Fixture f;
  auto pos = f.flags.Parse({"a.json", "--listen", "0.0.0.0:1", "--steps=5", "--json",
                            "--lr", "0.5", "--set", "x=1", "--set=y=2", "b", "--", "--c"});
  ASSERT_THAT(pos, IsOk());
  EXPECT_THAT(*pos, ElementsAre("a.json", "b", "--c"));
  EXPECT_EQ(f.listen, "0.0.0.0:1");
  EXPECT_EQ(f.steps, 5);
  EXPECT_DOUBLE_EQ(f.lr, 0.5);
  EXPECT_TRUE(f.json);
  EXPECT_THAT(f.sets, ElementsAre("x=1", "y=2"));
}

TEST(FlagsTest, BoolTakesExplicitValue) {
  Fixture f;
  f.json = true;
  ASSERT_THAT(f.flags.Parse({"--json=false"}), IsOk());
  EXPECT_FALSE(f.json);
  EXPECT_THAT(f.flags.Parse({"--json=maybe"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--json takes true or false")));
}

TEST(FlagsTest, ErrorsNameTheFlag) {
  Fixture f;
  EXPECT_THAT(f.flags.Parse({"--nope"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown flag --nope")));
  EXPECT_THAT(f.flags.Parse({"--steps", "ten"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--steps takes a whole number, not 'ten'")));
  EXPECT_THAT(f.flags.Parse({"--lr", "fast"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lr takes a number")));
  EXPECT_THAT(f.flags.Parse({"--listen"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--listen needs a value (HOST:PORT)")));
}

TEST(FlagsTest, HelpListsFlagsAndDefaults) {
  Fixture f;
  const std::string help = f.flags.Help();
  EXPECT_THAT(help, HasSubstr("Usage: prog VERB [flags]"));
  EXPECT_THAT(help, HasSubstr("Does things."));
  EXPECT_THAT(help, HasSubstr("--listen HOST:PORT"));
  EXPECT_THAT(help, HasSubstr("(default \"127.0.0.1:7400\")"));
  EXPECT_THAT(help, HasSubstr("(default 10)"));
  EXPECT_THAT(help, HasSubstr("--set FIELD=VALUE"));
  EXPECT_THAT(help, HasSubstr("(repeatable)"));
}

TEST(FlagsTest, RequiredFlagsSayRequiredInsteadOfTheirDefault) {
  Fixture f;
  f.flags.MarkRequired("steps");
  const std::string help = f.flags.Help();
  EXPECT_THAT(help, HasSubstr("how many (required)"));
  EXPECT_THAT(help, ::testing::Not(HasSubstr("(default 10)")));
  EXPECT_THAT(help, HasSubstr("(default \"127.0.0.1:7400\")"));
}

TEST(FlagsTest, ShortAliasesWithOneDash) {
  bool follow = false;
  std::string out;
  FlagSet flags("prog", "", "");
  flags.AddBool("follow", &follow, "keep following");
  flags.AddString("out", &out, "where", "FILE");
  flags.AddShort('f', "follow");
  flags.AddShort('o', "out");
  auto pos = flags.Parse({"job-1", "-f", "-o", "t.json"});
  ASSERT_THAT(pos, IsOk());
  EXPECT_THAT(*pos, ElementsAre("job-1"));
  EXPECT_TRUE(follow);
  EXPECT_EQ(out, "t.json");
  ASSERT_THAT(flags.Parse({"-o=u.json", "--follow=false"}), IsOk());
  EXPECT_EQ(out, "u.json");
  EXPECT_FALSE(follow);
  EXPECT_THAT(flags.Parse({"-x"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown flag -x")));
  EXPECT_THAT(flags.Parse({"-o"}), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("--out needs a value (FILE)")));
  EXPECT_THAT(flags.Help(), HasSubstr("-f, --follow"));
  EXPECT_THAT(flags.Help(), HasSubstr("-o, --out FILE"));
}

TEST(FlagsTest, StandardFlagsExitCodes) {
  Fixture f;
  EXPECT_EQ(HandleStandardFlags(f.flags, absl::OkStatus(), false, false), std::nullopt);
  EXPECT_EQ(HandleStandardFlags(f.flags, absl::InvalidArgumentError("x"), false, false), 2);
  EXPECT_EQ(HandleStandardFlags(f.flags, absl::InvalidArgumentError("x"), true, false), 0);
}

}  // namespace
}  // namespace pipetrain::common
