// A hostile client against a real coordinator and a real stage server: raw bytes over
// grpc::GenericStub, so nothing of our client library stands between it and the
// servers. Nonsense registrations, a takeover of a live stage's address (under any
// spelling of it), over-limit fields, overflowing model sizes, a Configure whose buffers
// cannot be had, and malformed protobuf bytes to every method of both services. Every
// answer must name what is wrong, never be UNKNOWN, and be INTERNAL only for malformed
// bytes (gRPC's own parser answers those before our code runs: docs/USAGE.md,
// "Malformed requests"); both processes must still serve afterwards.
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "google/protobuf/descriptor.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/stage.pb.h"
#include "tests/testing/cluster_jobs.h"
#include "tests/testing/local_cluster.h"

namespace pipetrain::testing {
namespace {

namespace pb = ::pipetrain::v1;
using ::testing::AnyOf;
using ::testing::HasSubstr;

struct Answer {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  std::string message;
  std::string body;
};

std::ostream& operator<<(std::ostream& os, const Answer& a) {
  return os << "code " << a.code << " '" << a.message.substr(0, 300) << "'";
}

// One call of `method` ("/pipetrain.v1.Coordinator/GetJob") with `bytes` as the only
// request message, waiting at most 30 s.
Answer Call(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
            const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  Answer answer;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status status) {
                   answer.code = status.error_code();
                   answer.message = status.error_message();
                   done.Notify();
                 });
  // The call's own deadline ends it; this one only keeps a broken call from hanging.
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(60))) {
    ctx.TryCancel();
    done.WaitForNotification();
  }
  if (answer.code == grpc::StatusCode::OK) {
    std::vector<grpc::Slice> slices;
    if (response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) answer.body.append(s.begin(), s.end());
    }
  }
  return answer;
}

Answer Call(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
            const google::protobuf::Message& message) {
  return Call(channel, method, message.SerializeAsString());
}

// The answer to a well-formed but hostile request: refused with `code`, naming `field`.
void ExpectRefused(const Answer& a, grpc::StatusCode code, const std::string& field) {
  EXPECT_EQ(a.code, code) << a;
  EXPECT_THAT(a.message, HasSubstr(field)) << a;
}

// One coordinator and one stage for the whole binary: every test leaves them serving.
ProcessCluster& TheCluster() {
  static ProcessCluster cluster(1);
  return cluster;
}

class HostileClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = TheCluster().Get();
    ASSERT_NE(cluster_, nullptr) << "the cluster did not start: " << TheCluster().failure();
  }

  static std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  std::shared_ptr<grpc::Channel> coordinator() { return Channel(cluster_->address()); }
  std::shared_ptr<grpc::Channel> stage() { return Channel(cluster_->stage_addresses()[0]); }

  // The cluster as GetCluster shows it, after asserting both servers still answer.
  pb::ClusterStatus ExpectBothServe() {
    Answer c = Call(coordinator(), "/pipetrain.v1.Coordinator/GetCluster", pb::GetClusterRequest());
    EXPECT_EQ(c.code, grpc::StatusCode::OK) << c;
    Answer s = Call(stage(), "/pipetrain.v1.Stage/GetStats", pb::GetStatsRequest());
    EXPECT_EQ(s.code, grpc::StatusCode::OK) << s;
    pb::ClusterStatus cluster;
    EXPECT_TRUE(cluster.ParseFromString(c.body));
    return cluster;
  }

  LocalCluster* cluster_ = nullptr;
};

pb::RegisterStageRequest Registration(const std::string& address) {
  pb::RegisterStageRequest r;
  r.set_address(address);
  r.mutable_device()->set_kind("cpu");
  r.mutable_device()->set_name("forged");
  r.mutable_device()->set_memory_bytes(uint64_t{1} << 40);
  r.mutable_device()->set_threads(1);
  return r;
}

TEST_F(HostileClientTest, NonsenseRegistrationsAreRefusedByField) {
  const std::string kMethod = "/pipetrain.v1.Coordinator/RegisterStage";
  struct Case {
    std::function<void(pb::RegisterStageRequest&)> spoil;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.set_address("no port"); }, "address"},
      {[](auto& r) { r.set_address("127.0.0.1:0"); }, "address"},
      {[](auto& r) { r.set_address("127.0.0.1:70000"); }, "address"},
      {[](auto& r) {
         std::string address(10002, 'h');
         address.replace(10000, 2, ":1");
         r.set_address(address);
       },
       "address is 10002 bytes"},
      {[](auto& r) { r.mutable_device()->set_threads(-1); }, "device.threads"},
      {[](auto& r) { r.mutable_device()->set_kind("abacus"); }, "device.kind 'abacus'"},
      {[](auto& r) { r.mutable_device()->set_peak_flops(std::nan("")); }, "device.peak_flops"},
      {[](auto& r) {
         r.mutable_device()->set_peak_flops(std::numeric_limits<double>::infinity());
       },
       "device.peak_flops"},
      {[](auto& r) { r.mutable_device()->set_memory_bytes(0); }, "device.memory_bytes"},
      {[](auto& r) { r.mutable_device()->set_name(std::string(5000, 'n')); }, "device.name"},
  };
  for (const Case& c : cases) {
    pb::RegisterStageRequest r = Registration("127.0.0.1:1");
    c.spoil(r);
    ExpectRefused(Call(coordinator(), kMethod, r), grpc::StatusCode::INVALID_ARGUMENT, c.field);
  }
  // Nothing of them was recorded: the cluster still has its one stage.
  EXPECT_EQ(ExpectBothServe().stages_size(), 1);
}

TEST_F(HostileClientTest, ALiveStagesAddressCannotBeTakenOver) {
  const std::string live = cluster_->stage_addresses()[0];
  pb::RegisterStageRequest r = Registration(live);
  r.set_registration_secret("0123456789abcdef0123456789abcdef");  // a guess
  const Answer a = Call(coordinator(), "/pipetrain.v1.Coordinator/RegisterStage", r);
  ExpectRefused(a, grpc::StatusCode::ALREADY_EXISTS, live);
  EXPECT_THAT(a.message, HasSubstr("stage-1"));
  EXPECT_THAT(a.message, HasSubstr("retry in"));
  const pb::ClusterStatus cluster = ExpectBothServe();
  ASSERT_EQ(cluster.stages_size(), 1);
  EXPECT_NE(cluster.stages(0).device().name(), "forged");
  EXPECT_EQ(cluster.stages(0).state(), pb::StageInfo::IDLE);
}

// The same stage's address spelt otherwise (a name for its IP, a port with a
// leading zero), without its secret, was once taken as a new stage at that address.
TEST_F(HostileClientTest, AnotherSpellingOfALiveStagesAddressIsNoNewStage) {
  const std::string live = cluster_->stage_addresses()[0];  // 127.0.0.1:PORT
  const std::string port = live.substr(live.rfind(':') + 1);
  for (const std::string& alias : {"localhost:" + port, "127.0.0.1:0" + port, "[::1]:" + port}) {
    const Answer a = Call(coordinator(), "/pipetrain.v1.Coordinator/RegisterStage",
                          Registration(alias));
    ExpectRefused(a, grpc::StatusCode::ALREADY_EXISTS, alias);
    EXPECT_THAT(a.message, HasSubstr("stage-1"));
    EXPECT_THAT(a.message, HasSubstr("registration_secret"));
  }
  const pb::ClusterStatus cluster = ExpectBothServe();
  ASSERT_EQ(cluster.stages_size(), 1);
  EXPECT_EQ(cluster.stages(0).address(), live);
  EXPECT_NE(cluster.stages(0).device().name(), "forged");
}

TEST_F(HostileClientTest, OverLimitFieldsAreRefusedWithTheirSize) {
  const std::string kSubmit = "/pipetrain.v1.Coordinator/SubmitJob";
  pb::SubmitJobRequest submit;
  submit.mutable_spec()->set_name(std::string(1000, 'x'));
  ExpectRefused(Call(coordinator(), kSubmit, submit), grpc::StatusCode::INVALID_ARGUMENT,
                "name is 1000 bytes; the limit is 256");
  // A 100 MB name: within the server's message limit, refused by ours.
  submit.mutable_spec()->set_name(std::string(100 << 20, 'x'));
  ExpectRefused(Call(coordinator(), kSubmit, submit), grpc::StatusCode::INVALID_ARGUMENT,
                "spec is ");
  pb::GetJobRequest get;
  get.set_job_id(std::string(1 << 20, 'j'));
  ExpectRefused(Call(coordinator(), "/pipetrain.v1.Coordinator/GetJob", get),
                grpc::StatusCode::INVALID_ARGUMENT, "job_id is 1048576 bytes");
  pb::ListJobsRequest list;
  list.set_limit(-7);
  ExpectRefused(Call(coordinator(), "/pipetrain.v1.Coordinator/ListJobs", list),
                grpc::StatusCode::INVALID_ARGUMENT, "limit");
  pb::HeartbeatRequest beat;
  beat.set_stage_id("stage-1");
  beat.set_registration_secret(std::string(1 << 16, 's'));
  ExpectRefused(Call(coordinator(), "/pipetrain.v1.Coordinator/Heartbeat", beat),
                grpc::StatusCode::INVALID_ARGUMENT, "registration_secret");
  // Nothing was stored: the listing is empty.
  const Answer jobs = Call(coordinator(), "/pipetrain.v1.Coordinator/ListJobs",
                           pb::ListJobsRequest());
  ASSERT_EQ(jobs.code, grpc::StatusCode::OK) << jobs;
  pb::ListJobsResponse listed;
  ASSERT_TRUE(listed.ParseFromString(jobs.body));
  EXPECT_EQ(listed.jobs_size(), 0);
  ExpectBothServe();
}

TEST_F(HostileClientTest, OverflowingModelSizesNameTheField) {
  pb::SubmitJobRequest submit;
  pb::ModelConfig* m = submit.mutable_spec()->mutable_model();
  m->set_vocab_size(256);
  m->set_seq_len(16);
  m->set_d_model(1 << 28);
  m->set_n_heads(1);
  m->set_n_layers(1000);
  submit.mutable_spec()->mutable_pipeline()->set_stages(1);
  submit.mutable_spec()->mutable_training()->set_steps(1);
  submit.mutable_spec()->mutable_training()->set_batch_size(1);
  ExpectRefused(Call(coordinator(), "/pipetrain.v1.Coordinator/SubmitJob", submit),
                grpc::StatusCode::INVALID_ARGUMENT, "model.n_layers");
  m->set_d_model(64);
  m->set_n_layers(std::numeric_limits<int>::max());
  ExpectRefused(Call(coordinator(), "/pipetrain.v1.Coordinator/SubmitJob", submit),
                grpc::StatusCode::INVALID_ARGUMENT, "model.n_layers");
  m->set_n_layers(2);
  submit.mutable_spec()->mutable_training()->set_batch_size(1 << 30);
  m->set_seq_len(1 << 20);
  ExpectRefused(Call(coordinator(), "/pipetrain.v1.Coordinator/SubmitJob", submit),
                grpc::StatusCode::INVALID_ARGUMENT, "model.seq_len");
  ExpectBothServe();
}

pb::ConfigureRequest Configure(int d_model, int n_layers, int micro_batch_size) {
  pb::ConfigureRequest c;
  c.set_job_id("hostile-1");
  c.set_stage(0);
  c.set_num_stages(1);
  pb::ModelConfig* m = c.mutable_model();
  m->set_vocab_size(256);
  m->set_seq_len(64);
  m->set_d_model(d_model);
  m->set_n_heads(1);
  m->set_n_layers(n_layers);
  pb::LayerRange* range = c.add_chunks();
  range->set_begin_layer(0);
  range->set_end_layer(n_layers + 2);
  c.set_micro_batch_size(micro_batch_size);
  return c;
}

TEST_F(HostileClientTest, ConfigureThatCannotBeAllocatedIsResourceExhausted) {
  const std::string kMethod = "/pipetrain.v1.Stage/Configure";
  // 12 x 65536^2 x 64 parameters: about 52 TB of training state.
  Answer a = Call(stage(), kMethod, Configure(1 << 16, 64, 1));
  ExpectRefused(a, grpc::StatusCode::RESOURCE_EXHAUSTED, "configure of job 'hostile-1' stage 0");
  EXPECT_THAT(a.message, HasSubstr("bytes"));
  // A small model with micro-batches of 2^30 rows: the activations cannot be had.
  a = Call(stage(), kMethod, Configure(64, 2, 1 << 30));
  ExpectRefused(a, grpc::StatusCode::RESOURCE_EXHAUSTED, "micro_batch_size");
  // Sizes that overflow are refused by their field before any estimate.
  a = Call(stage(), kMethod, Configure(64, std::numeric_limits<int>::max() - 2, 1));
  ExpectRefused(a, grpc::StatusCode::INVALID_ARGUMENT, "model.n_layers");
  pb::ConfigureRequest long_id = Configure(64, 2, 1);
  long_id.set_job_id(std::string(1 << 20, 'j'));
  ExpectRefused(Call(stage(), kMethod, long_id), grpc::StatusCode::INVALID_ARGUMENT, "job_id");
  ExpectBothServe();
}

// Bytes no message parses from: an unterminated varint, and a length-delimited field
// longer than what follows.
const std::vector<std::string>& MalformedPayloads() {
  static const auto* payloads = new std::vector<std::string>{
      std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
      std::string("\x0a\x7f" "abc", 5),
  };
  return *payloads;
}

TEST_F(HostileClientTest, MalformedBytesToEveryMethodNeitherCrashNorAnswerUnknown) {
  const google::protobuf::DescriptorPool* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const auto& [service_name, channel] :
       {std::pair{std::string("pipetrain.v1.Coordinator"), coordinator()},
        std::pair{std::string("pipetrain.v1.Stage"), stage()}}) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(service_name);
    ASSERT_NE(service, nullptr) << service_name;
    ASSERT_GT(service->method_count(), 0);
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string method = absl::StrCat("/", service_name, "/", service->method(i)->name());
      for (const std::string& bytes : MalformedPayloads()) {
        const Answer a = Call(channel, method, bytes);
        // INTERNAL is gRPC's own answer to a request it cannot parse (documented); a
        // stream whose message cannot be parsed ends, and our handler answers that.
        EXPECT_THAT(a.code, AnyOf(grpc::StatusCode::INTERNAL, grpc::StatusCode::INVALID_ARGUMENT,
                                  grpc::StatusCode::FAILED_PRECONDITION,
                                  grpc::StatusCode::NOT_FOUND, grpc::StatusCode::UNAUTHENTICATED,
                                  grpc::StatusCode::PERMISSION_DENIED))
            << method << ": " << a;
      }
    }
  }
  const pb::ClusterStatus cluster = ExpectBothServe();
  ASSERT_EQ(cluster.stages_size(), 1);
  EXPECT_EQ(cluster.stages(0).state(), pb::StageInfo::IDLE);
}

}  // namespace
}  // namespace pipetrain::testing
