#include "common/grpc_status.h"

#include <set>

#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

using ::pipetrain::testing::StatusIs;

constexpr int kNumCodes = 17;  // OK .. UNAUTHENTICATED

TEST(GrpcStatusTest, EveryAbslCodeMapsToTheSameGrpcCodeAndBack) {
  std::set<int> seen;
  for (int i = 0; i < kNumCodes; ++i) {
    const auto code = static_cast<absl::StatusCode>(i);
    const grpc::StatusCode g = ToGrpcCode(code);
    EXPECT_EQ(static_cast<int>(g), i) << absl::StatusCodeToString(code);
    EXPECT_EQ(FromGrpcCode(g), code) << absl::StatusCodeToString(code);
    seen.insert(static_cast<int>(g));
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kNumCodes)) << "mapping is not one to one";
}

TEST(GrpcStatusTest, EveryGrpcCodeMapsBack) {
  for (int i = 0; i < kNumCodes; ++i) {
    const auto g = static_cast<grpc::StatusCode>(i);
    EXPECT_EQ(ToGrpcCode(FromGrpcCode(g)), g) << i;
  }
}

TEST(GrpcStatusTest, NamedCodesLineUp) {
  EXPECT_EQ(ToGrpcCode(absl::StatusCode::kInvalidArgument), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcCode(absl::StatusCode::kUnavailable), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(FromGrpcCode(grpc::StatusCode::UNAUTHENTICATED), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(FromGrpcCode(grpc::StatusCode::RESOURCE_EXHAUSTED),
            absl::StatusCode::kResourceExhausted);
}

TEST(GrpcStatusTest, UnknownValuesBecomeUnknown) {
  EXPECT_EQ(FromGrpcCode(static_cast<grpc::StatusCode>(99)), absl::StatusCode::kUnknown);
  EXPECT_EQ(ToGrpcCode(static_cast<absl::StatusCode>(99)), grpc::StatusCode::UNKNOWN);
}

TEST(GrpcStatusTest, StatusKeepsCodeAndMessageBothWays) {
  for (int i = 1; i < kNumCodes; ++i) {
    const auto code = static_cast<absl::StatusCode>(i);
    absl::Status s(code, "field 'spec.model.d_model' must be > 0");
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), i);
    EXPECT_EQ(g.error_message(), "field 'spec.model.d_model' must be > 0");
    EXPECT_THAT(FromGrpcStatus(g), StatusIs(code, "field 'spec.model.d_model' must be > 0"));
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

}  // namespace
}  // namespace pipetrain::common
