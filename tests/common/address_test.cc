#include "common/address.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

TEST(AddressTest, Parses) {
  auto a = ParseHostPort("127.0.0.1:7400", 1, "--listen");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 7400);
  auto b = ParseHostPort("localhost", 7400, "--listen");
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(b->port, 7400);
  auto c = ParseHostPort("[::1]:0", 7400, "--listen");
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, 0);
  EXPECT_EQ(c->ToString(), "[::1]:0");
  EXPECT_EQ(a->ToString(), "127.0.0.1:7400");
}

TEST(AddressTest, RejectsWithTheFieldName) {
  EXPECT_THAT(ParseHostPort("", 1, "--listen"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--listen '' is not HOST:PORT")));
  EXPECT_THAT(ParseHostPort("h:99999", 1, "--coordinator"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--coordinator"), HasSubstr("0 to 65535"))));
  EXPECT_THAT(ParseHostPort("h:", 1, "x"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("port is empty")));
  EXPECT_THAT(ParseHostPort(":80", 1, "x"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host is empty")));
  EXPECT_THAT(ParseHostPort("::1:80", 1, "x"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[ADDRESS]:PORT")));
  EXPECT_THAT(ParseHostPort("[::1", 1, "x"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("missing ']'")));
}

TEST(AddressTest, Loopback) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.3.0.9"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
}

}  // namespace
}  // namespace pipetrain::common
