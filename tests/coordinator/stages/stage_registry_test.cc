// Tests of the stage registry under a fake clock: ids, secrets, heartbeats and loss,
// acquiring and releasing stages for jobs, the snapshot the API shows, and a stage of
// an earlier coordinator's registry heartbeating to a new one.
#include "coordinator/stages/stage_registry.h"

#include <map>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using pipetrain::v1::DeviceInfo;
using pipetrain::v1::StageInfo;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr absl::Duration kTimeout = absl::Seconds(10);
constexpr uint64_t kGiB = uint64_t{1} << 30;

DeviceInfo Device(uint64_t memory_bytes, const std::string& name = "cpu0") {
  DeviceInfo device;
  device.set_kind("cpu");
  device.set_name(name);
  device.set_memory_bytes(memory_bytes);
  return device;
}

class StageRegistryTest : public ::testing::Test {
 protected:
  // Registers and keeps the secret for Beat; returns the id.
  std::string RegisterOrDie(const std::string& address, uint64_t memory = kGiB) {
    auto registered = registry_.Register(address, Device(memory));
    EXPECT_THAT(registered, IsOk());
    if (!registered.ok()) return "";
    secrets_[registered->stage_id] = registered->secret;
    return registered->stage_id;
  }
  // A heartbeat with the secret of the stage's latest registration.
  bool Beat(const std::string& stage_id) {
    return registry_.Heartbeat(stage_id, secrets_[stage_id]);
  }
  static std::vector<std::string> Ids(const std::vector<StageRecord>& stages) {
    std::vector<std::string> ids;
    for (const StageRecord& stage : stages) ids.push_back(stage.stage_id);
    return ids;
  }

  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  StageRegistry registry_{kTimeout, [this] { return now_; }};
  std::map<std::string, std::string> secrets_;  // stage id -> its latest secret
};

TEST_F(StageRegistryTest, RegisterGivesIdsAndKeepsThemPerAddress) {
  EXPECT_EQ(RegisterOrDie("10.0.0.1:5000"), "stage-1");
  EXPECT_EQ(RegisterOrDie("10.0.0.2:5000"), "stage-2");
  ASSERT_TRUE(registry_.Acquire("job-1", 1).has_value());
  now_ += absl::Seconds(3);
  auto again =
      registry_.Register("10.0.0.1:5000", Device(2 * kGiB, "cpu-new"), secrets_["stage-1"]);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->stage_id, "stage-1");
  auto found = registry_.Find("stage-1");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->device.name(), "cpu-new");
  EXPECT_EQ(found->job_id, "job-1");  // the job holding it keeps it
  EXPECT_EQ(found->last_heartbeat, now_);
  EXPECT_EQ(RegisterOrDie("10.0.0.3:5000"), "stage-3");
  EXPECT_EQ(registry_.LiveCount(), 3);
  EXPECT_THAT(registry_.Register("", Device(kGiB)), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(registry_.Find("stage-9").has_value());
}

// A second registration from a live stage's address, without that stage's
// secret, is refused and changes nothing; a restarted process (no secret) gets in once
// the old record's heartbeats have expired, and the message says how long that is.
TEST_F(StageRegistryTest, NoOneTakesOverALiveStagesAddress) {
  const std::string a = RegisterOrDie("10.0.0.1:5000", kGiB);
  const std::string old_secret = secrets_[a];
  now_ += absl::Seconds(4);
  auto hijack = registry_.Register("10.0.0.1:5000", Device(64 * kGiB, "forged"), "guess");
  EXPECT_THAT(hijack, StatusIs(absl::StatusCode::kAlreadyExists,
                               AllOf(HasSubstr("stage-1"), HasSubstr("10.0.0.1:5000"),
                                     HasSubstr("retry in 6s"))));
  EXPECT_THAT(registry_.Register("10.0.0.1:5000", Device(kGiB)),
              StatusIs(absl::StatusCode::kAlreadyExists));
  // Untouched: the same device, and the stage's own heartbeats still count.
  ASSERT_TRUE(registry_.Find(a).has_value());
  EXPECT_EQ(registry_.Find(a)->device.name(), "cpu0");
  EXPECT_TRUE(registry_.Heartbeat(a, old_secret));

  // The heartbeat above restarted the clock: 10 s of silence is still live, 10.1 s not.
  now_ += kTimeout;
  EXPECT_THAT(registry_.Register("10.0.0.1:5000", Device(kGiB)),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("retry in 100ms")));
  now_ += absl::Milliseconds(100);
  auto restarted = registry_.Register("10.0.0.1:5000", Device(2 * kGiB, "cpu-restarted"));
  ASSERT_THAT(restarted, IsOk());
  EXPECT_EQ(restarted->stage_id, a);  // the same id, a new secret
  EXPECT_NE(restarted->secret, old_secret);
  EXPECT_FALSE(registry_.Heartbeat(a, old_secret));
  EXPECT_TRUE(registry_.Heartbeat(a, restarted->secret));
}

// Another spelling of a live stage's address, with
// no secret, was once taken as a new stage at the same endpoint. Every spelling of it is
// refused as the same text is, naming the address, the stage and the secret it needs;
// the stage's own re-registration (with its secret) under another spelling keeps its id.
TEST_F(StageRegistryTest, AnotherSpellingOfALiveStagesAddressIsTheSameAddress) {
  const std::string a = RegisterOrDie("127.0.0.1:7401");
  for (const std::string alias : {"localhost:7401", "LOCALHOST:7401", "127.0.0.1:07401",
                                  "[::1]:7401", "[::ffff:127.0.0.1]:7401", "127.1:7401",
                                  "localhost.:7401"}) {
    EXPECT_THAT(registry_.Register(alias, Device(64 * kGiB, "forged")),
                StatusIs(absl::StatusCode::kAlreadyExists,
                         AllOf(HasSubstr(alias), HasSubstr("stage-1"),
                               HasSubstr("(as 127.0.0.1:7401)"),
                               HasSubstr("registration_secret"))))
        << alias;
  }
  EXPECT_EQ(registry_.Snapshot().size(), 1u);
  EXPECT_EQ(registry_.Find(a)->device.name(), "cpu0");
  // Other endpoints stay other stages: another port, another loopback address, a name.
  EXPECT_NE(RegisterOrDie("127.0.0.1:7402"), a);
  EXPECT_NE(RegisterOrDie("127.0.0.2:7401"), a);
  EXPECT_NE(RegisterOrDie("node-a:7401"), a);
  EXPECT_EQ(registry_.Snapshot().size(), 4u);
  // The stage itself, with its secret, under another spelling: the same record, the
  // address as it now gives it.
  auto again = registry_.Register("localhost:7401", Device(kGiB), secrets_[a]);
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->stage_id, a);
  EXPECT_EQ(registry_.Find(a)->address, "localhost:7401");
  EXPECT_EQ(registry_.Snapshot().size(), 4u);
  // A job continuing on its stages finds it under the spelling it recorded.
  std::vector<std::optional<StageRecord>> taken = registry_.AcquireAt("job-1", {"127.0.0.1:7401"});
  ASSERT_TRUE(taken[0].has_value());
  EXPECT_EQ(taken[0]->stage_id, a);
}

TEST(AddressKeyTest, SpellingsOfOneEndpointShareAKey) {
  EXPECT_EQ(AddressKey("LOCALHOST:7400"), AddressKey("127.0.0.1:7400"));
  EXPECT_EQ(AddressKey("[::1]:7400"), AddressKey("127.0.0.1:07400"));
  EXPECT_EQ(AddressKey("10.0.0.1:5000"), AddressKey("[::ffff:10.0.0.1]:5000"));
  EXPECT_EQ(AddressKey("10.0.0.1:5000"), AddressKey("10.0.1:5000"));  // inet_aton's form
  EXPECT_EQ(AddressKey("[2001:DB8::0:1]:5000"), AddressKey("[2001:db8::1]:5000"));
  EXPECT_EQ(AddressKey("Node-A.example.:5000"), AddressKey("node-a.example:5000"));
  EXPECT_NE(AddressKey("10.0.0.1:5000"), AddressKey("10.0.0.1:5001"));
  EXPECT_NE(AddressKey("10.0.0.1:5000"), AddressKey("10.0.0.2:5000"));
  EXPECT_NE(AddressKey("[fe80::1%eth0]:5000"), AddressKey("[fe80::1%eth1]:5000"));
  EXPECT_EQ(AddressKey("[::1"), "[::1");  // does not parse: its own key
}

TEST_F(StageRegistryTest, ALostOrMarkedLostRecordCanBeReplaced) {
  const std::string a = RegisterOrDie("10.0.0.1:5000");
  registry_.MarkLost(a);  // the step driver found it unreachable
  auto back = registry_.Register("10.0.0.1:5000", Device(kGiB));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->stage_id, a);
  EXPECT_EQ(registry_.LiveCount(), 1);
}

// With TLS, the record keeps the certificate identity: while it is live, another
// identity is refused even with the secret; once lost, anyone authenticated may take it.
TEST_F(StageRegistryTest, ALiveRecordRefusesAnotherTlsIdentity) {
  auto first = registry_.Register("10.0.0.1:5000", Device(kGiB), "", "stage-a.example");
  ASSERT_THAT(first, IsOk());
  EXPECT_THAT(registry_.Register("10.0.0.1:5000", Device(kGiB), first->secret, "intruder"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("stage-a.example"), HasSubstr("intruder"))));
  auto same = registry_.Register("10.0.0.1:5000", Device(kGiB), first->secret, "stage-a.example");
  ASSERT_THAT(same, IsOk());
  now_ += kTimeout + absl::Seconds(1);
  EXPECT_THAT(registry_.Register("10.0.0.1:5000", Device(kGiB), "", "redeployed"), IsOk());
}

TEST_F(StageRegistryTest, HeartbeatsKeepStagesAliveAndRevive) {
  const std::string a = RegisterOrDie("a:1");
  const std::string b = RegisterOrDie("b:1");
  EXPECT_FALSE(registry_.Heartbeat("stage-99", secrets_[a]));

  now_ += absl::Seconds(8);
  EXPECT_TRUE(Beat(a));
  now_ += absl::Seconds(2);  // b is exactly at the timeout: not lost yet
  EXPECT_THAT(registry_.Sweep(), IsEmpty());
  now_ += absl::Seconds(1);
  EXPECT_THAT(registry_.Sweep(), ElementsAre(b));
  EXPECT_THAT(registry_.Sweep(), IsEmpty());  // only newly lost ones are reported
  EXPECT_EQ(registry_.LiveCount(), 1);
  EXPECT_TRUE(registry_.Find(b)->lost);

  EXPECT_TRUE(Beat(b));
  EXPECT_FALSE(registry_.Find(b)->lost);
  EXPECT_EQ(registry_.LiveCount(), 2);
}

TEST_F(StageRegistryTest, AcquireIsAllOrNothingOldestFirst) {
  const std::string s1 = RegisterOrDie("a:1");
  const std::string s2 = RegisterOrDie("b:1");
  const std::string s3 = RegisterOrDie("c:1");
  EXPECT_FALSE(registry_.Acquire("job-1", 4).has_value());
  EXPECT_EQ(registry_.FreeCount(), 3);  // the failed acquire took nothing

  auto taken = registry_.Acquire("job-1", 2);
  ASSERT_TRUE(taken.has_value());
  EXPECT_THAT(Ids(*taken), ElementsAre(s1, s2));
  for (const StageRecord& stage : *taken) EXPECT_EQ(stage.job_id, "job-1");
  EXPECT_FALSE(registry_.Acquire("job-2", 2).has_value());
  EXPECT_EQ(registry_.Find(s3)->job_id, "");
  auto rest = registry_.Acquire("job-2", 1);
  ASSERT_TRUE(rest.has_value());
  EXPECT_THAT(Ids(*rest), ElementsAre(s3));
  EXPECT_EQ(registry_.FreeCount(), 0);
  EXPECT_FALSE(registry_.Acquire("", 0).has_value());

  registry_.Release("job-1");
  EXPECT_EQ(registry_.FreeCount(), 2);
  EXPECT_EQ(registry_.Find(s1)->job_id, "");
  EXPECT_EQ(registry_.Find(s3)->job_id, "job-2");
  auto again = registry_.Acquire("job-3", 2);
  ASSERT_TRUE(again.has_value());
  EXPECT_THAT(Ids(*again), ElementsAre(s1, s2));
}

TEST_F(StageRegistryTest, AcquireFiltersByMemory) {
  const std::string small = RegisterOrDie("a:1", kGiB);
  const std::string big1 = RegisterOrDie("b:1", 8 * kGiB);
  const std::string big2 = RegisterOrDie("c:1", 16 * kGiB);
  EXPECT_EQ(registry_.FreeCount(4 * kGiB), 2);
  EXPECT_FALSE(registry_.Acquire("job-1", 3, 4 * kGiB).has_value());
  auto taken = registry_.Acquire("job-1", 2, 8 * kGiB);
  ASSERT_TRUE(taken.has_value());
  EXPECT_THAT(Ids(*taken), ElementsAre(big1, big2));
  EXPECT_EQ(registry_.Find(small)->job_id, "");
}

TEST_F(StageRegistryTest, AcquireNeverTakesLostStages) {
  const std::string s1 = RegisterOrDie("a:1");
  const std::string s2 = RegisterOrDie("b:1");
  const std::string s3 = RegisterOrDie("c:1");
  registry_.MarkLost(s1);
  now_ += absl::Seconds(11);             // s2 and s3 time out too...
  EXPECT_TRUE(Beat(s3));  // ...but s3 comes back
  EXPECT_EQ(registry_.FreeCount(), 1);
  EXPECT_FALSE(registry_.Acquire("job-1", 2).has_value());
  auto taken = registry_.Acquire("job-1", 1);
  ASSERT_TRUE(taken.has_value());
  EXPECT_THAT(Ids(*taken), ElementsAre(s3));
  EXPECT_EQ(registry_.Find(s2)->job_id, "");
}

TEST_F(StageRegistryTest, LostStageStaysHeldUntilReleased) {
  RegisterOrDie("a:1");
  const std::string s2 = RegisterOrDie("b:1");
  ASSERT_TRUE(registry_.Acquire("job-1", 2).has_value());
  registry_.MarkLost(s2);
  EXPECT_TRUE(registry_.Find(s2)->lost);
  EXPECT_EQ(registry_.Find(s2)->job_id, "job-1");
  EXPECT_EQ(registry_.LiveCount(), 1);
  registry_.Release("job-1");
  EXPECT_EQ(registry_.Find(s2)->job_id, "");
  EXPECT_EQ(registry_.FreeCount(), 1);  // s1 only: s2 is free but lost
  registry_.MarkLost("stage-99");       // unknown ids are ignored
  EXPECT_EQ(registry_.LiveCount(), 1);
  EXPECT_TRUE(Beat(s2));
  EXPECT_EQ(registry_.FreeCount(), 2);
}

// What a heartbeat answers as `held` (a stage told to stop waits while it is true).
TEST_F(StageRegistryTest, HeldFromAcquireOrAcquireAtUntilReleased) {
  const std::string s1 = RegisterOrDie("a:1");
  const std::string s2 = RegisterOrDie("b:1");
  const std::string s3 = RegisterOrDie("c:1");
  EXPECT_FALSE(registry_.Held(s1));
  EXPECT_FALSE(registry_.Held("stage-99"));
  ASSERT_TRUE(registry_.Acquire("job-1", 2).has_value());
  EXPECT_TRUE(registry_.Held(s1));
  EXPECT_TRUE(registry_.Held(s2));
  EXPECT_FALSE(registry_.Held(s3));
  // Recovering onto a stage holds it too.
  ASSERT_TRUE(registry_.AcquireAt("job-2", {"c:1"})[0].has_value());
  EXPECT_TRUE(registry_.Held(s3));
  // A lost stage its job still holds is held until the job lets it go.
  registry_.MarkLost(s2);
  EXPECT_TRUE(registry_.Held(s2));
  registry_.ReleaseStage("job-1", s2);
  EXPECT_FALSE(registry_.Held(s2));
  EXPECT_TRUE(registry_.Held(s1));
  registry_.Release("job-1");
  EXPECT_FALSE(registry_.Held(s1));
  EXPECT_TRUE(registry_.Held(s3));
  registry_.Release("job-2");
  EXPECT_FALSE(registry_.Held(s3));
}

TEST_F(StageRegistryTest, SnapshotShowsStatesJobsAndHeartbeats) {
  RegisterOrDie("a:1");
  RegisterOrDie("b:1");
  RegisterOrDie("c:1");
  ASSERT_TRUE(registry_.Acquire("job-7", 1).has_value());  // stage-1
  now_ += absl::Milliseconds(1500);
  ASSERT_TRUE(Beat("stage-2"));
  registry_.MarkLost("stage-3");

  std::vector<StageInfo> stages = registry_.Snapshot();
  ASSERT_EQ(stages.size(), 3u);
  EXPECT_EQ(stages[0].stage_id(), "stage-1");
  EXPECT_EQ(stages[0].address(), "a:1");
  EXPECT_EQ(stages[0].state(), StageInfo::BUSY);
  EXPECT_EQ(stages[0].job_id(), "job-7");
  EXPECT_EQ(stages[0].device().memory_bytes(), kGiB);
  EXPECT_EQ(stages[0].last_heartbeat().seconds(), 1'700'000'000);
  EXPECT_EQ(stages[0].last_heartbeat().nanos(), 0);
  EXPECT_EQ(stages[1].state(), StageInfo::IDLE);
  EXPECT_EQ(stages[1].job_id(), "");
  EXPECT_EQ(stages[1].last_heartbeat().seconds(), 1'700'000'001);
  EXPECT_EQ(stages[1].last_heartbeat().nanos(), 500'000'000);
  EXPECT_EQ(stages[2].state(), StageInfo::LOST);

  // A busy stage that times out shows LOST but still names its job.
  now_ += absl::Seconds(20);
  stages = registry_.Snapshot();
  EXPECT_EQ(stages[0].state(), StageInfo::LOST);
  EXPECT_EQ(stages[0].job_id(), "job-7");
  EXPECT_EQ(stages[1].state(), StageInfo::LOST);
}

TEST_F(StageRegistryTest, HeartbeatsNeedTheLatestRegistrationsSecret) {
  auto first = registry_.Register("a:1", Device(kGiB));
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ(first->secret.size(), 32u);
  EXPECT_EQ(first->secret.find_first_not_of("0123456789abcdef"), std::string::npos);
  auto other = registry_.Register("b:1", Device(kGiB));
  ASSERT_THAT(other, IsOk());
  EXPECT_NE(other->secret, first->secret);

  now_ += absl::Seconds(11);  // both time out
  EXPECT_FALSE(registry_.Heartbeat(first->stage_id, ""));
  EXPECT_FALSE(registry_.Heartbeat(first->stage_id, other->secret));
  EXPECT_TRUE(registry_.Find(first->stage_id)->lost);  // refused heartbeats revive nothing

  // Registering again from the same address keeps the id but replaces the secret.
  auto second = registry_.Register("a:1", Device(kGiB));
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->stage_id, first->stage_id);
  EXPECT_NE(second->secret, first->secret);
  now_ += absl::Seconds(11);
  EXPECT_FALSE(registry_.Heartbeat(first->stage_id, first->secret));
  EXPECT_TRUE(registry_.Find(first->stage_id)->lost);
  EXPECT_TRUE(registry_.Heartbeat(second->stage_id, second->secret));
  EXPECT_FALSE(registry_.Find(first->stage_id)->lost);
  EXPECT_TRUE(registry_.Heartbeat(other->stage_id, other->secret));
}

// The ghost of a coordinator restart, without processes: P registered with the old
// coordinator's registry as stage-1; the new registry gave stage-1 to Q. P's heartbeat
// must not pass for Q's: it is refused, P registers and gets an id of its own, and Q's
// record is as it was.
TEST_F(StageRegistryTest, StageOfAnEarlierRegistryIsRefusedAndRegistersAnew) {
  StageRegistry before_restart{kTimeout, [this] { return now_; }};
  auto p_old = before_restart.Register("p:1", Device(kGiB, "p-device"));
  ASSERT_THAT(p_old, IsOk());
  ASSERT_EQ(p_old->stage_id, "stage-1");

  now_ += absl::Seconds(5);
  auto q = registry_.Register("q:1", Device(2 * kGiB, "q-device"));
  ASSERT_THAT(q, IsOk());
  ASSERT_EQ(q->stage_id, "stage-1");
  ASSERT_TRUE(registry_.Acquire("job-1", 1).has_value());
  const absl::Time q_seen = now_;

  now_ += absl::Seconds(1);
  EXPECT_FALSE(registry_.Heartbeat(p_old->stage_id, p_old->secret));
  auto p_new = registry_.Register("p:1", Device(kGiB, "p-device"));
  ASSERT_THAT(p_new, IsOk());
  EXPECT_EQ(p_new->stage_id, "stage-2");
  EXPECT_TRUE(registry_.Heartbeat(p_new->stage_id, p_new->secret));

  auto q_record = registry_.Find("stage-1");
  ASSERT_TRUE(q_record.has_value());
  EXPECT_EQ(q_record->address, "q:1");
  EXPECT_EQ(q_record->device.name(), "q-device");
  EXPECT_EQ(q_record->job_id, "job-1");
  EXPECT_EQ(q_record->last_heartbeat, q_seen);  // P's refused heartbeat did not count for Q
  EXPECT_EQ(q_record->secret, q->secret);
  // Q, dead since, times out although P kept heartbeating.
  now_ += absl::Seconds(10);
  EXPECT_TRUE(registry_.Heartbeat(p_new->stage_id, p_new->secret));
  EXPECT_THAT(registry_.Sweep(), ElementsAre("stage-1"));
  std::vector<StageInfo> stages = registry_.Snapshot();
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].address(), "q:1");
  EXPECT_EQ(stages[0].state(), StageInfo::LOST);
  EXPECT_EQ(stages[1].address(), "p:1");
  EXPECT_EQ(stages[1].state(), StageInfo::IDLE);
}

}  // namespace
}  // namespace pipetrain::coordinator
