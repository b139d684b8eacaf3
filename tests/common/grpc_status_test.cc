#include "common/grpc_status.h"

#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/stage.pb.h"

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

// With the request, the guard's message says what it was about: the job, stage, step and
// chunk where the message has those fields, a stage id or address otherwise.
TEST(GrpcStatusTest, GuardHandlerNamesWhatTheRequestIsAbout) {
  pipetrain::v1::RunStepRequest step;
  step.set_job_id("job-7");
  step.set_step(12);
  const grpc::Status oom = GuardHandler("Stage.RunStep", step, []() -> grpc::Status {
    throw std::bad_alloc();
  });
  EXPECT_EQ(oom.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(oom.error_message(),
              HasSubstr("Stage.RunStep of job 'job-7' step 12: out of memory while answering"));

  pipetrain::v1::ConfigureRequest configure;
  configure.set_job_id("job-8");  // stage 0: a stage index is named even when it is 0
  const grpc::Status boom = GuardHandler("Stage.Configure", configure, []() -> grpc::Status {
    throw std::runtime_error("boom");
  });
  EXPECT_EQ(boom.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(boom.error_message(), "Stage.Configure of job 'job-8' stage 0: unexpected error: boom");

  pipetrain::v1::ExportChunkRequest chunk;
  chunk.set_job_id("job-9");
  chunk.set_chunk(2);
  EXPECT_EQ(DescribeRequest("Stage.ExportChunk", chunk),
            "Stage.ExportChunk of job 'job-9' chunk 2");

  pipetrain::v1::HeartbeatRequest beat;
  beat.set_stage_id("stage-3");
  const grpc::Status thrown = GuardHandler("Coordinator.Heartbeat", beat, []() -> grpc::Status {
    throw 42;  // not a std::exception: still answered, still named
  });
  EXPECT_EQ(thrown.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(thrown.error_message(),
              HasSubstr("Coordinator.Heartbeat stage_id 'stage-3': unexpected error"));

  pipetrain::v1::RegisterStageRequest registration;
  registration.set_address("10.0.0.1:7401");
  EXPECT_EQ(DescribeRequest("Coordinator.RegisterStage", registration),
            "Coordinator.RegisterStage address '10.0.0.1:7401'");
  // A hostile id is cut short, not echoed whole; a request without such fields names
  // the method only.
  pipetrain::v1::GetJobRequest get;
  get.set_job_id(std::string(100000, 'j'));
  EXPECT_LT(DescribeRequest("Coordinator.GetJob", get).size(), 200u);
  EXPECT_EQ(DescribeRequest("Coordinator.GetCluster", pipetrain::v1::GetClusterRequest()),
            "Coordinator.GetCluster");
}

}  // namespace
}  // namespace pipetrain::common
