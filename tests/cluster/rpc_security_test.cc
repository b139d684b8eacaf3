// common/rpc_security: loading the TLS and token flags (errors name flag and file), the
// bearer check, and a real in-process stage server with mutual TLS and a token: peers
// with the CA's certificates get in, a foreign CA, a plaintext client and a client
// without a certificate do not, and a control call without the token changes nothing.
#include "common/rpc_security.h"

#include <chrono>

#include "common/server_runner.h"
#include "common/testing/status_matchers.h"
#include "coordinator/planner/planner.h"
#include "coordinator/runner/stage_configure.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/stage.grpc.pb.h"
#include "stage_server/runtime/stage_runtime.h"
#include "stage_server/stage_service.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::common {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Runs deploy/certs/make-dev-certs.sh DIR HOSTS...
void MakeCerts(const std::string& dir, std::vector<std::string> hosts) {
  hosts.insert(hosts.begin(),
               {std::string(PIPETRAIN_SOURCE_DIR) + "/deploy/certs/make-dev-certs.sh", dir});
  auto r = testing::RunCommand(hosts, 30s);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->exit_code, 0) << r->err;
}

SecurityFlags Tls(const std::string& dir, const std::string& name) {
  SecurityFlags f;
  f.tls_cert = dir + "/" + name + ".pem";
  f.tls_key = dir + "/" + name + "-key.pem";
  f.tls_ca = dir + "/ca.pem";
  return f;
}

TEST(RpcSecurityTest, NothingGivenIsPlaintextWithoutToken) {
  auto s = RpcSecurity::Load({});
  ASSERT_THAT(s, IsOk());
  EXPECT_FALSE(s->tls());
  EXPECT_EQ(s->token(), "");
}

TEST(RpcSecurityTest, PartialTlsNamesTheMissingFlags) {
  SecurityFlags f;
  f.tls_cert = "/x/cert.pem";
  EXPECT_THAT(RpcSecurity::Load(f).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tls-key and --tls-ca missing")));
  f.tls_key = "/x/key.pem";
  EXPECT_THAT(RpcSecurity::Load(f).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-ca missing")));
}

TEST(RpcSecurityTest, UnreadableOrNonPemFilesNameFlagAndFile) {
  TempDir dir;
  MakeCerts(dir.path(), {"127.0.0.1"});
  SecurityFlags f = Tls(dir.path(), "127.0.0.1");
  f.tls_key = dir.File("nope.pem");
  EXPECT_THAT(RpcSecurity::Load(f).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--tls-key"), HasSubstr("nope.pem"), HasSubstr("cannot read"))));
  testing::WriteFileOrDie(dir.File("junk.pem"), "hello");
  f = Tls(dir.path(), "127.0.0.1");
  f.tls_ca = dir.File("junk.pem");
  EXPECT_THAT(RpcSecurity::Load(f).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--tls-ca"), HasSubstr("junk.pem"), HasSubstr("not a PEM"))));
  EXPECT_THAT(RpcSecurity::Load(Tls(dir.path(), "127.0.0.1")), IsOk());
}

TEST(RpcSecurityTest, TokenFileIsTrimmedAndMustNotBeEmpty) {
  TempDir dir;
  testing::WriteFileOrDie(dir.File("token"), "  s3cret\n");
  testing::WriteFileOrDie(dir.File("empty"), "\n \n");
  SecurityFlags f;
  f.token_file = dir.File("token");
  auto s = RpcSecurity::Load(f);
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->token(), "s3cret");
  f.token_file = dir.File("empty");
  EXPECT_THAT(RpcSecurity::Load(f).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--token-file"), HasSubstr("empty"))));
  f.token_file = dir.File("missing");
  EXPECT_THAT(RpcSecurity::Load(f).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--token-file"), HasSubstr("missing"))));
}

TEST(RpcSecurityTest, BearerCheck) {
  EXPECT_THAT(CheckBearerToken(std::nullopt, ""), IsOk());
  EXPECT_THAT(CheckBearerToken(std::nullopt, "t0k"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr(kMissingTokenMessage)));
  EXPECT_THAT(CheckBearerToken("Basic abc", "t0k"),
              StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(CheckBearerToken("Bearer t0kk", "t0k"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("wrong bearer token")));
  EXPECT_THAT(CheckBearerToken("Bearer ", "t0k"), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(CheckBearerToken("Bearer t0k", "t0k"), IsOk());
  EXPECT_THAT(CheckBearerToken("bearer t0k ", "t0k"), IsOk());
}

// A one-stage job that the stage accepts when the call is allowed at all, configured as
// the coordinator configures its stages.
pb::ConfigureRequest TinyConfigure() {
  planner::PlanOptions o;
  o.model = {.vocab_size = 256, .seq_len = 8, .d_model = 16, .n_heads = 2, .n_layers = 1};
  o.schedule = planner::ScheduleKind::kGpipe;
  o.batch_size = 2;
  auto plan = planner::MakePlan(o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  pb::OptimizerConfig adam;
  adam.set_lr(0.01f);
  return coordinator::BuildConfigureRequest(*plan, 0, 0, adam,
                                            {"job-1", {"127.0.0.1:1"}, "secret", 5000});
}

// A stage server (in this process) with mutual TLS from `server_dir` and a token.
class SecureStageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeCerts(dir_.File("a"), {"127.0.0.1"});
    MakeCerts(dir_.File("b"), {"127.0.0.1"});  // another CA
    testing::WriteFileOrDie(dir_.File("token"), "stage-token\n");
    SecurityFlags f = Tls(dir_.File("a"), "127.0.0.1");
    f.token_file = dir_.File("token");
    auto security = RpcSecurity::Load(f);
    ASSERT_THAT(security, IsOk());
    stage_server::RuntimeOptions options;
    options.security = *security;
    runtime_ = std::make_unique<stage_server::StageRuntime>(options);
    service_ = std::make_unique<stage_server::StageService>(runtime_.get());
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    auto running = StartServer(builder, {"127.0.0.1", 0}, "test-stage", *security);
    ASSERT_THAT(running, IsOk());
    server_ = std::move(running->server);
    address_ = running->address.ToString();
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + 2s);
  }

  std::unique_ptr<pb::Stage::Stub> Stub(const std::shared_ptr<grpc::ChannelCredentials>& creds) {
    return pb::Stage::NewStub(grpc::CreateChannel(address_, creds));
  }
  std::shared_ptr<grpc::ChannelCredentials> Creds(const std::string& ca_dir,
                                                  const std::string& name) {
    auto s = RpcSecurity::Load(Tls(dir_.File(ca_dir), name));
    EXPECT_THAT(s, IsOk());
    return s.ok() ? s->ChannelCredentials() : nullptr;
  }
  static void Prepare(grpc::ClientContext& ctx, const std::string& token = "") {
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  }
  grpc::Status Health(const std::shared_ptr<grpc::ChannelCredentials>& creds) {
    auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address_, creds));
    grpc::ClientContext ctx;
    Prepare(ctx);
    grpc::health::v1::HealthCheckResponse resp;
    return stub->Check(&ctx, {}, &resp);
  }
  // GetStats with the token: the stage's configured job.
  std::string JobId() {
    grpc::ClientContext ctx;
    Prepare(ctx, "stage-token");
    pb::StageStats stats;
    grpc::Status s = Stub(Creds("a", "client"))->GetStats(&ctx, {}, &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return stats.job_id();
  }

  TempDir dir_;
  std::unique_ptr<stage_server::StageRuntime> runtime_;
  std::unique_ptr<stage_server::StageService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(SecureStageTest, ClientWithTheCasCertificateGetsIn) {
  EXPECT_TRUE(Health(Creds("a", "client")).ok());
  EXPECT_TRUE(Health(Creds("a", "127.0.0.1")).ok());
}

TEST_F(SecureStageTest, ForeignCaPlaintextAndCertificatelessClientsAreRefused) {
  grpc::Status foreign = Health(Creds("b", "client"));
  EXPECT_EQ(foreign.error_code(), grpc::StatusCode::UNAVAILABLE) << foreign.error_message();
  grpc::Status plaintext = Health(grpc::InsecureChannelCredentials());
  EXPECT_EQ(plaintext.error_code(), grpc::StatusCode::UNAVAILABLE) << plaintext.error_message();
  grpc::SslCredentialsOptions no_cert;  // trusts the server, shows no certificate
  no_cert.pem_root_certs = testing::ReadFileOrDie(dir_.File("a/ca.pem"));
  grpc::Status anonymous = Health(grpc::SslCredentials(no_cert));
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAVAILABLE) << anonymous.error_message();
}

TEST_F(SecureStageTest, ControlCallsNeedTheTokenAndARefusalChangesNothing) {
  auto stub = Stub(Creds("a", "client"));
  pb::ConfigureResponse resp;
  {
    grpc::ClientContext ctx;
    Prepare(ctx);
    grpc::Status s = stub->Configure(&ctx, TinyConfigure(), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(s.error_message(), HasSubstr("missing bearer token"));
  }
  EXPECT_EQ(JobId(), "");
  {
    grpc::ClientContext ctx;
    Prepare(ctx, "not-the-token");
    grpc::Status s = stub->Configure(&ctx, TinyConfigure(), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  }
  EXPECT_EQ(JobId(), "");
  {
    grpc::ClientContext ctx;
    Prepare(ctx);
    pb::StageStats stats;
    EXPECT_EQ(stub->GetStats(&ctx, {}, &stats).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    Prepare(ctx, "stage-token");
    grpc::Status s = stub->Configure(&ctx, TinyConfigure(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(JobId(), "job-1");
}

}  // namespace
}  // namespace pipetrain::common
