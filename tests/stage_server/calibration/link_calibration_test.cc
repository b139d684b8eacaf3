// One link timed for pipeline.schedule "auto" (stage_server/calibration/link_calibration.h): over an
// in-memory pair, the receiver sees the ping, then a 4-byte and a `bytes` tensor per
// round (never zeros) and answers each with one element; the sender's figures are
// positive and finite; the sender hanging up after the last answer is no failure of the
// receiver's, a sender gone before its last question is. Between two stage runtimes over real gRPC (StageRuntime::
// CalibrateTransfer): the sender may come first, a wrong secret is refused, and
// out-of-range requests are refused naming the calibration.
#include "stage_server/calibration/link_calibration.h"

#include <cmath>
#include <thread>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/link/exchange_service.h"
#include "stage_server/link/local_channel.h"
#include "stage_server/runtime/stage_runtime.h"
#include "tests/testing/fake_coordinator.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Hands every call to `inner`; the test channels below change one call each.
class Forwarding : public TensorChannel {
 public:
  explicit Forwarding(std::unique_ptr<TensorChannel> inner) : inner_(std::move(inner)) {}
  void BeginStep(uint64_t step) override { inner_->BeginStep(step); }
  absl::Status Send(const common::FrameTag& tag, std::shared_ptr<const common::Tensor> tensor,
                    absl::Time deadline) override {
    return inner_->Send(tag, std::move(tensor), deadline);
  }
  absl::StatusOr<common::PiecewiseTensor> Receive(const common::FrameTag& tag,
                                                  absl::Time deadline) override {
    return inner_->Receive(tag, deadline);
  }
  absl::Status Flush(absl::Time deadline) override { return inner_->Flush(deadline); }
  uint64_t bytes_sent() const override { return inner_->bytes_sent(); }
  uint64_t bytes_received() const override { return inner_->bytes_received(); }

 private:
  std::unique_ptr<TensorChannel> inner_;
};

// Records what crosses it, in order: (micro-batch, bytes, whether any value was zero).
class Recording final : public Forwarding {
 public:
  using Forwarding::Forwarding;
  struct Seen {
    uint32_t micro_batch = 0;
    uint64_t bytes = 0;
    bool has_zero = false;
  };
  absl::StatusOr<common::PiecewiseTensor> Receive(const common::FrameTag& tag,
                                                  absl::Time deadline) override {
    absl::StatusOr<common::PiecewiseTensor> t = Forwarding::Receive(tag, deadline);
    if (t.ok()) {
      std::vector<float> values(t->num_bytes() / sizeof(float));
      t->CopyTo(std::as_writable_bytes(std::span<float>(values)));
      bool zero = false;
      for (float v : values) zero = zero || v == 0.0f;
      seen.push_back({tag.micro_batch, t->num_bytes(), zero});
    }
    return t;
  }

  std::vector<Seen> seen;
};

// Its Flush ends as `flush` says: the sender hanging up once it holds the last answer
// (UNAVAILABLE, as a peer link's closed stream), or the deadline passing.
class FlushEnds final : public Forwarding {
 public:
  FlushEnds(std::unique_ptr<TensorChannel> inner, absl::Status flush)
      : Forwarding(std::move(inner)), flush_(std::move(flush)) {}
  absl::Status Flush(absl::Time) override { return flush_; }

 private:
  absl::Status flush_;
};

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

TEST(LinkCalibrationTest, ThePingThenATinyAndALargeTensorEachRound) {
  auto [up, down] = MakeLocalChannelPair();
  Recording receiver(std::move(down));
  constexpr uint64_t kBytes = 1 << 16;
  constexpr int kRepetitions = 3;
  absl::Status answered = absl::UnknownError("not run");
  std::thread answering(
      [&] { answered = AnswerLink(receiver, "calibrate-link-1", kRepetitions, Soon()); });
  ASSERT_THAT(PingLink(*up, "calibrate-link-1", Soon()), IsOk());
  absl::StatusOr<LinkTimes> times = TimeLink(*up, "calibrate-link-1", kBytes, kRepetitions, Soon());
  answering.join();
  ASSERT_THAT(times, IsOk());
  ASSERT_THAT(answered, IsOk());
  EXPECT_GT(times->transfer_s_per_byte, 0);
  EXPECT_TRUE(std::isfinite(times->transfer_s_per_byte));
  EXPECT_GE(times->send_busy_s, 0);
  EXPECT_TRUE(std::isfinite(times->send_busy_s));
  ASSERT_EQ(static_cast<int>(receiver.seen.size()), LinkCalibrationMessages(kRepetitions));
  ASSERT_EQ(LinkCalibrationMessages(kRepetitions), 1 + 2 * (kRepetitions + 1));
  for (size_t i = 0; i < receiver.seen.size(); ++i) {
    const Recording::Seen& s = receiver.seen[i];
    EXPECT_EQ(s.micro_batch, i);
    EXPECT_EQ(s.bytes, i > 0 && i % 2 == 0 ? kBytes : sizeof(float)) << "message " << i;
    EXPECT_FALSE(s.has_zero) << "message " << i;
  }
}

// Found under load between two stage runtimes: the sender had every answer and hung up
// before the receiver's last write was reported done, and the receiver's error failed
// the whole calibration. A hang-up after the last answer is the receiver's success; a
// flush past the deadline is still its failure.
TEST(LinkCalibrationTest, ASenderThatHangsUpAfterTheLastAnswerIsNoFailure) {
  for (const absl::Status& flush :
       {absl::UnavailableError("the upstream stage closed the stream"),
        absl::DeadlineExceededError("sends did not drain before the deadline")}) {
    SCOPED_TRACE(flush.ToString());
    auto [up, down] = MakeLocalChannelPair();
    FlushEnds receiver(std::move(down), flush);
    absl::Status answered = absl::UnknownError("not run");
    std::thread answering([&] { answered = AnswerLink(receiver, "calibrate-link-4", 1, Soon()); });
    ASSERT_THAT(PingLink(*up, "calibrate-link-4", Soon()), IsOk());
    ASSERT_THAT(TimeLink(*up, "calibrate-link-4", 1 << 10, 1, Soon()), IsOk());
    answering.join();
    if (flush.code() == absl::StatusCode::kUnavailable) {
      EXPECT_THAT(answered, IsOk());
    } else {
      EXPECT_THAT(answered, StatusIs(absl::StatusCode::kDeadlineExceeded));
    }
  }
}

// A sender gone before its last question leaves the receiver waiting for it: that is
// the receiver's failure, at its deadline.
TEST(LinkCalibrationTest, ASenderGoneBeforeItsLastQuestionFailsTheReceiver) {
  auto [up, down] = MakeLocalChannelPair();
  FlushEnds receiver(std::move(down), absl::UnavailableError("the upstream stage closed"));
  absl::Status answered = absl::UnknownError("not run");
  std::thread answering([&] {
    answered = AnswerLink(receiver, "calibrate-link-5", 1, absl::Now() + absl::Milliseconds(300));
  });
  ASSERT_THAT(PingLink(*up, "calibrate-link-5", Soon()), IsOk());
  answering.join();
  EXPECT_FALSE(answered.ok());
}

TEST(LinkCalibrationTest, BadSizesAndRepetitionsAreRefused) {
  auto [up, down] = MakeLocalChannelPair();
  for (const auto& [bytes, repetitions] :
       std::vector<std::pair<uint64_t, int>>{{0, 1}, {6, 1}, {8, 0}}) {
    EXPECT_THAT(TimeLink(*up, "calibrate-link-2", bytes, repetitions, Soon()),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("calibrate-link-2")))
        << bytes << " bytes, " << repetitions << " repetitions";
  }
  EXPECT_EQ(up->bytes_sent(), 0u) << "nothing was sent";
}

TEST(LinkCalibrationTest, AnAnswerOfTheWrongSizeIsNamed) {
  auto [up, down] = MakeLocalChannelPair();
  ASSERT_THAT(common::Tensor::Create(common::DType::kF32, {2}), IsOk());
  auto two = std::make_shared<const common::Tensor>(
      *common::Tensor::Create(common::DType::kF32, {2}));
  ASSERT_THAT(down->Send({.job_id = "calibrate-link-3", .micro_batch = 0,
                          .kind = common::TensorKind::kGradient},
                         two, Soon()),
              IsOk());
  EXPECT_THAT(PingLink(*up, "calibrate-link-3", Soon()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("message 0")));
}

// Two stage runtimes; the receiver's Exchange served on a real gRPC port.
class TransferCalibrationTest : public ::testing::Test {
 protected:
  TransferCalibrationTest() : exchange_(&receiver_.acceptor()), server_(&exchange_) {}

  StageRuntime::TransferCalibration Transfer(bool send, std::string secret = "s3cret") const {
    return {.calibration_id = "calibrate-link-9", .peer_secret = std::move(secret),
            .send = send, .peer_address = send ? server_.address() : "", .bytes = 1 << 18,
            .repetitions = 3, .deadline = absl::Seconds(5)};
  }

  static RuntimeOptions Cpu() {
    RuntimeOptions o;
    o.device.kind = DeviceSpec::Kind::kCpu;
    return o;
  }

  StageRuntime sender_{Cpu()};
  StageRuntime receiver_{Cpu()};
  ExchangeService exchange_;
  pipetrain::testing::TestServer server_;
};

TEST_F(TransferCalibrationTest, TheSenderMayComeFirstAndTimesTheLink) {
  absl::StatusOr<LinkTimes> sent = absl::UnknownError("not run");
  std::thread sending([&] { sent = sender_.CalibrateTransfer(Transfer(true)); });
  absl::SleepFor(absl::Milliseconds(200));  // the sender is refused and asks again
  absl::StatusOr<LinkTimes> received = receiver_.CalibrateTransfer(Transfer(false));
  sending.join();
  ASSERT_THAT(sent, IsOk());
  ASSERT_THAT(received, IsOk());
  EXPECT_GT(sent->transfer_s_per_byte, 0);
  EXPECT_LT(sent->transfer_s_per_byte, 1e-3) << "256 KiB over loopback takes under 256 s";
  EXPECT_GE(sent->send_busy_s, 0);
  EXPECT_EQ(received->transfer_s_per_byte, 0) << "the receiver only answers";
  EXPECT_EQ(received->send_busy_s, 0);
}

TEST_F(TransferCalibrationTest, AWrongSecretIsRefused) {
  absl::StatusOr<LinkTimes> received = absl::UnknownError("not run");
  StageRuntime::TransferCalibration expected = Transfer(false);
  expected.deadline = absl::Seconds(2);
  std::thread receiving([&] { received = receiver_.CalibrateTransfer(expected); });
  absl::SleepFor(absl::Milliseconds(200));
  // Refused (PERMISSION_DENIED, or the write the refusal cut short), never timed.
  StageRuntime::TransferCalibration wrong = Transfer(true, "not-the-secret");
  wrong.deadline = absl::Seconds(2);
  absl::StatusOr<LinkTimes> sent = sender_.CalibrateTransfer(wrong);
  EXPECT_FALSE(sent.ok());
  EXPECT_THAT(sent.status().message(), HasSubstr("calibrate-link-9"));
  receiving.join();
  EXPECT_THAT(received, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("calibrate-link-9")));
}

// Each refusal names the field that failed, and comes at once: a sender's peer address
// that is not HOST:PORT is not tried until the deadline.
TEST_F(TransferCalibrationTest, OutOfRangeRequestsAreRefusedNamingTheField) {
  std::vector<std::pair<StageRuntime::TransferCalibration, std::string>> bad;
  auto with = [&](auto change, const std::string& field) {
    StageRuntime::TransferCalibration t = Transfer(true);
    t.deadline = absl::Seconds(60);
    change(t);
    bad.push_back({t, field});
  };
  with([](auto& t) { t.bytes = 0; }, "transfer.bytes (0)");
  with([](auto& t) { t.bytes = 6; }, "transfer.bytes (6)");
  with([](auto& t) { t.bytes = StageRuntime::kMaxRingCalibrationBytes + 4; }, "transfer.bytes");
  with([](auto& t) { t.repetitions = 0; }, "repetitions (0)");
  with([](auto& t) { t.peer_secret = ""; }, "transfer.peer_secret");
  with([](auto& t) { t.peer_address = ""; }, "transfer.peer_address ''");
  with([](auto& t) { t.peer_address = "not an address"; }, "transfer.peer_address 'not an");
  with([](auto& t) { t.peer_address = "127.0.0.1"; }, "transfer.peer_address '127.0.0.1'");
  with([](auto& t) { t.peer_address = "127.0.0.1:99999"; }, "transfer.peer_address");
  const absl::Time start = absl::Now();
  for (const auto& [request, field] : bad) {
    EXPECT_THAT(sender_.CalibrateTransfer(request),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("calibrate-link-9"), HasSubstr(field))))
        << field;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "a refusal waited for its deadline";
  StageRuntime::TransferCalibration no_id = Transfer(true);
  no_id.calibration_id = "";
  EXPECT_THAT(sender_.CalibrateTransfer(no_id),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("transfer.calibration_id")));
}

}  // namespace
}  // namespace pipetrain::stage_server
