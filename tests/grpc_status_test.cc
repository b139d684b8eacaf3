#include "common/grpc_status.h"

#include <set>
#include <stdexcept>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

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

// No exception leaves a handler: gRPC would answer UNKNOWN "Unexpected error" naming nothing.
TEST(GrpcStatusTest, GuardHandlerTurnsExceptionsIntoStatusesNamingTheMethod) {
  const grpc::Status fine = GuardHandler("Svc.Ok", [] { return grpc::Status::OK; });
  EXPECT_TRUE(fine.ok());
  const grpc::Status refused = GuardHandler("Svc.Refused", [] {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "field x: bad");
  });
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.error_message(), "field x: bad");
  const grpc::Status too_long = GuardHandler("Svc.Alloc", []() -> grpc::Status {
    std::vector<char> huge;
    huge.reserve(huge.max_size() + 1);  // past max_size: std::length_error, nothing allocated
    return grpc::Status::OK;
  });
  EXPECT_EQ(too_long.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(too_long.error_message(), HasSubstr("Svc.Alloc: a size in the request is too large"));
  const grpc::Status bad_alloc = GuardHandler("Svc.New", []() -> grpc::Status {
    throw std::bad_alloc();
  });
  EXPECT_EQ(bad_alloc.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(bad_alloc.error_message(), HasSubstr("Svc.New: out of memory"));
  const grpc::Status other = GuardHandler("Svc.Throws", []() -> grpc::Status {
    throw std::runtime_error("boom");
  });
  EXPECT_EQ(other.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(other.error_message(), "Svc.Throws: unexpected error: boom");
}

}  // namespace
}  // namespace pipetrain::common
