// The stage's side of registration against an in-process fake coordinator: heartbeats
// carry the registration's secret, and a coordinator that restarted and gave this
// stage's id to another stage makes it register again rather than pass for that one;
// held() follows the heartbeats' answers, and is false once the coordinator is gone.
#include "stage_server/registration.h"

#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_coordinator.h"

namespace pipetrain::stage_server {
namespace {

using namespace std::chrono_literals;
namespace pb = ::pipetrain::v1;

// Polls `done` every 10 ms until it holds or 10 s pass.
bool WaitFor(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

bool SawHeartbeat(const testing::FakeCoordinator& fake, const std::string& id,
                  const std::string& secret) {
  for (const pb::HeartbeatRequest& h : fake.heartbeats()) {
    if (h.stage_id() == id && h.registration_secret() == secret) return true;
  }
  return false;
}

TEST(RegistrationTest, HeartbeatsCarryTheSecretAndARefusedOneRegistersAgain) {
  testing::FakeCoordinator fake;
  testing::TestServer server(&fake);
  pb::RegisterStageRequest request;
  request.set_address("127.0.0.1:7001");
  Registration registration(server.address(), request, [] { return std::string("job-7"); },
                            common::RpcSecurity());
  ASSERT_TRUE(WaitFor([&] { return SawHeartbeat(fake, "stage-1", "secret-1"); }));
  EXPECT_EQ(registration.stage_id(), "stage-1");
  EXPECT_EQ(registration.registration_secret(), "secret-1");
  EXPECT_EQ(fake.heartbeats().front().job_id(), "job-7");

  // The coordinator restarts and another stage registers first, taking stage-1.
  pb::RegisterStageRequest other;
  other.set_address("127.0.0.1:7002");
  const size_t before_restart = fake.heartbeats().size();
  const std::vector<pb::RegisterStageResponse> taken = fake.ForgetStages({other});
  ASSERT_EQ(taken.size(), 1u);
  ASSERT_EQ(taken[0].stage_id(), "stage-1");
  ASSERT_EQ(taken[0].registration_secret(), "secret-2");

  // Our stage-1 heartbeat carries secret-1, is refused, and the stage registers anew.
  ASSERT_TRUE(WaitFor([&] { return SawHeartbeat(fake, "stage-2", "secret-3"); }));
  EXPECT_EQ(registration.stage_id(), "stage-2");
  EXPECT_EQ(registration.registration_secret(), "secret-3");
  // In between, the old registration's heartbeats were sent (and refused).
  const std::vector<pb::HeartbeatRequest> beats = fake.heartbeats();
  ASSERT_GT(beats.size(), before_restart);
  EXPECT_EQ(beats[before_restart].stage_id(), "stage-1");
  EXPECT_EQ(beats[before_restart].registration_secret(), "secret-1");
  const std::vector<pb::RegisterStageRequest> registrations = fake.registrations();
  ASSERT_EQ(registrations.size(), 3u);
  EXPECT_EQ(registrations[0].address(), "127.0.0.1:7001");
  EXPECT_EQ(registrations[2].address(), "127.0.0.1:7001");
  // The first registration carried no secret; the second the one its refused heartbeat
  // had, so a coordinator that still holds this stage's live record lets it replace it.
  EXPECT_EQ(registrations[0].registration_secret(), "");
  EXPECT_EQ(registrations[2].registration_secret(), "secret-1");
}

TEST(RegistrationTest, HeldFollowsTheHeartbeatsAndEndsWithTheCoordinator) {
  testing::FakeCoordinator fake;
  auto server = std::make_unique<testing::TestServer>(&fake);
  pb::RegisterStageRequest request;
  request.set_address("127.0.0.1:7001");
  Registration registration(server->address(), request, [] { return std::string("job-7"); },
                            common::RpcSecurity());
  ASSERT_TRUE(WaitFor([&] { return SawHeartbeat(fake, "stage-1", "secret-1"); }));
  EXPECT_FALSE(registration.held());
  fake.SetHeld(true);
  EXPECT_TRUE(WaitFor([&] { return registration.held(); }));
  fake.SetHeld(false);
  EXPECT_TRUE(WaitFor([&] { return !registration.held(); }));
  // Asked at once, the answer is this moment's, not the latest periodic one's.
  fake.SetHeld(true);
  EXPECT_TRUE(registration.HeartbeatNow());
  fake.SetHeld(false);
  EXPECT_FALSE(registration.HeartbeatNow());
  fake.SetHeld(true);
  ASSERT_TRUE(WaitFor([&] { return registration.held(); }));
  // The coordinator goes away while it holds the stage: nothing will let it go, and
  // nothing is left to finish a step on it.
  server.reset();
  EXPECT_TRUE(WaitFor([&] { return !registration.held(); }));
  EXPECT_FALSE(registration.HeartbeatNow());
}

}  // namespace
}  // namespace pipetrain::stage_server
