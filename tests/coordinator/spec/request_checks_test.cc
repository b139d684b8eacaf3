// Tests of the checks coordinator requests get before the job manager sees them: each
// refusal names the field and its value or its size and the limit, and a valid request
// passes.
#include "coordinator/spec/request_checks.h"

#include <cmath>
#include <limits>
#include <string>

#include "common/input_limits.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

pb::RegisterStageRequest GoodRegistration() {
  pb::RegisterStageRequest r;
  r.set_address("10.0.0.7:7001");
  r.mutable_device()->set_kind("cpu");
  r.mutable_device()->set_name("cpu");
  r.mutable_device()->set_memory_bytes(uint64_t{8} << 30);
  r.mutable_device()->set_threads(4);
  return r;
}

void ExpectRefused(const pb::RegisterStageRequest& r, const std::string& names) {
  EXPECT_THAT(CheckRegisterStageRequest(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(names)))
      << r.ShortDebugString();
}

TEST(RequestChecksTest, RegistrationFieldsAreCheckedOneByOne) {
  EXPECT_THAT(CheckRegisterStageRequest(GoodRegistration()), IsOk());
  pb::RegisterStageRequest v6 = GoodRegistration();
  v6.set_address("[::1]:7001");
  EXPECT_THAT(CheckRegisterStageRequest(v6), IsOk());

  for (const char* address : {"", "host", "host:0", "host:65536", "host:-1", "host:x",
                              "a b:7001", "host:7001/../x", "1:2:3"}) {
    pb::RegisterStageRequest r = GoodRegistration();
    r.set_address(address);
    ExpectRefused(r, "address");
  }
  pb::RegisterStageRequest r = GoodRegistration();
  std::string long_address(100002, 'h');
  long_address[100000] = ':';
  long_address[100001] = '1';
  r.set_address(long_address);
  EXPECT_THAT(CheckRegisterStageRequest(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("address is 100002 bytes"), HasSubstr("limit is 512"))));

  r = GoodRegistration();
  r.mutable_device()->set_kind("tpu");
  ExpectRefused(r, "device.kind 'tpu'");
  r = GoodRegistration();
  r.mutable_device()->set_name(std::string(1000, 'n'));
  ExpectRefused(r, "device.name is 1000 bytes");
  r = GoodRegistration();
  r.mutable_device()->set_threads(-3);
  ExpectRefused(r, "device.threads must be in [0, 4096] (got -3)");
  r = GoodRegistration();
  r.mutable_device()->set_threads(1 << 20);
  ExpectRefused(r, "device.threads");
  r = GoodRegistration();
  r.mutable_device()->set_memory_bytes(0);
  ExpectRefused(r, "device.memory_bytes is 0 (unknown)");
  for (double flops : {std::nan(""), std::numeric_limits<double>::infinity(), -1.0, 1e30}) {
    r = GoodRegistration();
    r.mutable_device()->set_peak_flops(flops);
    ExpectRefused(r, "device.peak_flops");
  }
  r = GoodRegistration();
  r.set_registration_secret(std::string(10000, 's'));
  ExpectRefused(r, "registration_secret is 10000 bytes");
}

TEST(RequestChecksTest, SpecStringsListsAndStepSizeAreBounded) {
  pb::JobSpec spec;
  spec.set_name("small job");
  spec.mutable_model()->set_seq_len(64);
  spec.mutable_training()->set_batch_size(8);
  spec.mutable_data()->add_tokens("train_*.bin");
  EXPECT_THAT(CheckJobSpecBounds(spec), IsOk());

  pb::JobSpec big = spec;
  big.set_name(std::string(100 << 20, 'x'));  // a 100 MB name
  EXPECT_THAT(CheckJobSpecBounds(big), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("the limit is 1048576")));
  big = spec;
  big.set_name(std::string(common::kMaxJobNameBytes + 1, 'x'));
  EXPECT_THAT(CheckJobSpecBounds(big),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("name is 257 bytes; the limit is 256")));
  big = spec;
  big.set_init_from(std::string(5000, 'p'));
  EXPECT_THAT(CheckJobSpecBounds(big),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("init_from is 5000 bytes")));
  big = spec;
  const std::string one_file = "val.bin";
  for (int i = 0; i <= common::kMaxTokenFiles; ++i) {
    *big.mutable_data()->add_validation_tokens() = one_file;
  }
  EXPECT_THAT(CheckJobSpecBounds(big),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.validation_tokens has 4097 entries; the limit is 4096")));
  big = spec;
  big.mutable_data()->add_tokens(std::string(5000, 't'));
  EXPECT_THAT(CheckJobSpecBounds(big), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("data.tokens[1] is 5000 bytes")));
  big = spec;
  big.mutable_pipeline()->set_schedule(std::string(100, 's'));
  EXPECT_THAT(CheckJobSpecBounds(big),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pipeline.schedule")));
  big = spec;
  big.mutable_training()->set_batch_size(1 << 20);
  big.mutable_model()->set_seq_len(1 << 20);
  EXPECT_THAT(CheckJobSpecBounds(big),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("training.batch_size x model.seq_len is 1099511627776 tokens")));
}

TEST(RequestChecksTest, IdsAndCountsInQueries) {
  EXPECT_THAT(CheckJobId("job-12"), IsOk());
  EXPECT_THAT(CheckJobId(std::string(200, 'j')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id is 200 bytes")));
  pb::ListJobsRequest list;
  list.set_limit(-1);
  EXPECT_THAT(CheckListJobsRequest(list),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("limit must be >= 0")));
  list.set_limit(0);
  EXPECT_THAT(CheckListJobsRequest(list), IsOk());
  pb::WatchJobRequest watch;
  watch.set_job_id("job-1");
  watch.set_from_step(-5);
  EXPECT_THAT(CheckWatchJobRequest(watch),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from_step must be >= 0")));
  pb::GetTimelineRequest timeline;
  timeline.set_job_id("job-1");
  timeline.set_last_steps(-1);
  EXPECT_THAT(CheckGetTimelineRequest(timeline),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("last_steps must be >= 0")));
  pb::HeartbeatRequest beat;
  beat.set_stage_id(std::string(300, 's'));
  EXPECT_THAT(CheckHeartbeatRequest(beat),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage_id is 300 bytes")));
}

// A heartbeat's peer links are bounded in number and text: the registry keeps them.
TEST(RequestChecksTest, AHeartbeatsLinksAreBounded) {
  pb::HeartbeatRequest beat;
  beat.set_stage_id("stage-1");
  for (int i = 0; i < 8; ++i) {
    pb::LinkPath& l = *beat.add_links();
    l.set_peer_stage(i);
    l.set_sending("shared memory (16 slots of 4.0 MiB)");
    l.set_receiving("tcp (--same-host-transport off)");
  }
  EXPECT_THAT(CheckHeartbeatRequest(beat), IsOk());
  pb::HeartbeatRequest long_path = beat;
  long_path.mutable_links(3)->set_receiving(std::string(600, 'x'));
  EXPECT_THAT(CheckHeartbeatRequest(long_path),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("links.receiving is 600 bytes")));
  beat.add_links();
  EXPECT_THAT(CheckHeartbeatRequest(beat),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("links: 9 reported, at most 8")));
}

}  // namespace
}  // namespace pipetrain::coordinator
