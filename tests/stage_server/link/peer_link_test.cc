// Integration: two ends of a real peer link over gRPC on 127.0.0.1 (port 0), in one
// process: tensors arrive intact in any order, and every kind of bad frame, bad peer
// or lost peer ends in the documented status, never a hang.
#include "stage_server/link/exchange_service.h"
#include "stage_server/link/link_limits.h"
#include "stage_server/link/peer_link.h"

#include <cstring>
#include <random>

#include "common/channel_args.h"
#include "common/server_runner.h"
#include "common/testing/status_matchers.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/stage.grpc.pb.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using common::FrameTag;
using common::Tensor;
using common::TensorKind;


std::shared_ptr<const Tensor> RandomTensor(std::vector<int64_t> shape, std::mt19937& rng) {
  auto t = std::make_shared<Tensor>(*Tensor::Create(common::DType::kF32, std::move(shape)));
  for (float& x : t->data<float>()) x = std::uniform_real_distribution<float>(-2, 2)(rng);
  return t;
}

bool SameBytes(const common::PiecewiseTensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape() || a.num_bytes() != b.num_bytes()) {
    return false;
  }
  std::vector<std::byte> gathered(a.num_bytes());
  a.CopyTo(gathered);
  return std::memcmp(gathered.data(), b.bytes().data(), b.num_bytes()) == 0;
}

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// Every test runs on both paths: the stream alone, and shared memory for both directions
// (--same-host-transport auto; the default on one host).
class PeerLinkTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    acceptor_ = std::make_unique<LinkAcceptor>();
    service_ = std::make_unique<ExchangeService>(acceptor_.get());
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    auto running = common::StartServer(builder, {"127.0.0.1", 0}, "test-stage");
    ASSERT_THAT(running.status(), IsOk());
    server_ = std::move(running->server);
    address_ = running->address.ToString();
  }
  void TearDown() override {
    up_.reset();
    down_.reset();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    acceptor_.reset();
  }

  PeerLinkOptions Options(int local, int peer, size_t frame_bytes = 1000) {
    PeerLinkOptions o;
    o.job_id = "job-1";
    o.local_stage = local;
    o.peer_stage = peer;
    o.peer_address = address_;
    o.frame_bytes = frame_bytes;
    o.same_host = GetParam();
    return o;
  }

  // Stage 0 (upstream) connects to stage 1 (downstream, this server).
  void Connect(const std::string& up_secret = "secret", size_t frame_bytes = 1000) {
    acceptor_->Expect(Options(1, 0, frame_bytes), "secret");
    auto channel =
        grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(),
                                  common::ChannelArgumentsFor(common::ChannelUse::kPeerLink));
    auto up = ConnectPeerLink(channel, Options(0, 1, frame_bytes), up_secret, In(absl::Seconds(10)));
    ASSERT_THAT(up.status(), IsOk());
    up_ = std::move(*up);
  }
  // Stage 1 expects `down`; stage 0 connects with the usual options; both ends held.
  void ConnectTo(const PeerLinkOptions& down) {
    acceptor_->Expect(down, "secret");
    auto channel = grpc::CreateCustomChannel(
        address_, grpc::InsecureChannelCredentials(),
        common::ChannelArgumentsFor(common::ChannelUse::kPeerLink));
    auto up = ConnectPeerLink(channel, Options(0, 1), "secret", In(absl::Seconds(10)));
    ASSERT_THAT(up.status(), IsOk());
    up_ = std::move(*up);
    Accept();
  }
  void Accept() {
    auto down = acceptor_->WaitForPeer("job-1", 0, In(absl::Seconds(10)));
    ASSERT_THAT(down.status(), IsOk());
    down_ = std::move(*down);
  }

  std::unique_ptr<LinkAcceptor> acceptor_;
  std::unique_ptr<ExchangeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<PeerLink> up_, down_;
};

FrameTag Tag(uint64_t step, uint32_t mb, TensorKind kind, uint32_t chunk = 0) {
  return {"job-1", step, mb, chunk, kind};
}

TEST_P(PeerLinkTest, ActivationsDownGradientsUpInAnyOrder) {
  Connect();
  Accept();
  std::mt19937 rng(21);
  for (uint64_t step = 0; step < 2; ++step) {
    up_->BeginStep(step);
    down_->BeginStep(step);
    std::vector<std::shared_ptr<const Tensor>> acts, grads;
    for (uint32_t mb = 0; mb < 4; ++mb) {
      // Sizes that do not divide the 1000-byte frames, and one empty tensor.
      acts.push_back(RandomTensor({2, 3 + mb, 37}, rng));
      ASSERT_THAT(up_->Send(Tag(step, mb, TensorKind::kActivation, mb % 2), acts.back(),
                            In(absl::Seconds(10))),
                  IsOk());
    }
    for (int mb = 3; mb >= 0; --mb) {  // received in reverse order
      auto got = down_->Receive(Tag(step, mb, TensorKind::kActivation, mb % 2), In(absl::Seconds(10)));
      ASSERT_THAT(got.status(), IsOk());
      EXPECT_TRUE(SameBytes(*got, *acts[mb])) << "micro-batch " << mb;
      grads.push_back(RandomTensor({2, 3 + static_cast<int64_t>(mb), 37}, rng));
      ASSERT_THAT(down_->Send(Tag(step, mb, TensorKind::kGradient), grads.back(), In(absl::Seconds(10))),
                  IsOk());
    }
    for (uint32_t mb = 0; mb < 4; ++mb) {
      auto got = up_->Receive(Tag(step, mb, TensorKind::kGradient), In(absl::Seconds(10)));
      ASSERT_THAT(got.status(), IsOk());
      EXPECT_TRUE(SameBytes(*got, *grads[3 - mb])) << "micro-batch " << mb;
      // On the stream: received in 1000-byte frames and kept where the network put them,
      // at least one piece per frame, none gathered into one buffer. Through shared
      // memory (once the offer is answered) it is copied out of the slots at once, so
      // that they go back to the sender: one piece.
      if (!GetParam()) {
        EXPECT_GE(got->pieces().size(), (got->num_bytes() + 999) / 1000) << "micro-batch " << mb;
      }
    }
  }
  // Both sides: a sender counts bytes when its writes complete, which may be after the
  // receiver already has them.
  ASSERT_THAT(up_->Flush(In(absl::Seconds(10))), IsOk());
  ASSERT_THAT(down_->Flush(In(absl::Seconds(10))), IsOk());
  uint64_t expected = 0;  // two steps of four (2, 3 + mb, 37) f32 tensors each way
  for (uint32_t mb = 0; mb < 4; ++mb) expected += 2 * 2 * (3 + mb) * 37 * 4;
  EXPECT_EQ(up_->bytes_sent(), expected);
  EXPECT_EQ(down_->bytes_received(), expected);
  EXPECT_EQ(down_->bytes_sent(), expected);
  EXPECT_EQ(up_->bytes_received(), expected);
  EXPECT_THAT(up_->status(), IsOk());
  EXPECT_THAT(down_->status(), IsOk());
}

TEST_P(PeerLinkTest, ANeighbourMayRunAheadByAStep) {
  Connect();
  Accept();
  std::mt19937 rng(22);
  up_->BeginStep(7);
  auto t = RandomTensor({4, 5}, rng);
  // The downstream stage has not started step 7 yet when the activation arrives.
  ASSERT_THAT(up_->Send(Tag(7, 0, TensorKind::kActivation), t, In(absl::Seconds(5))), IsOk());
  ASSERT_THAT(up_->Flush(In(absl::Seconds(5))), IsOk());
  absl::SleepFor(absl::Milliseconds(100));
  down_->BeginStep(7);
  auto got = down_->Receive(Tag(7, 0, TensorKind::kActivation), In(absl::Seconds(5)));
  ASSERT_THAT(got.status(), IsOk());
  EXPECT_TRUE(SameBytes(*got, *t));
}

TEST_P(PeerLinkTest, ReceiveHasADeadline) {
  Connect();
  Accept();
  down_->BeginStep(3);
  const absl::Time start = absl::Now();
  auto got = down_->Receive(Tag(3, 2, TensorKind::kActivation), In(absl::Milliseconds(200)));
  EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                     AllOf(HasSubstr("step 3"), HasSubstr("micro-batch 2"),
                                           HasSubstr("stage 0"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(down_->status(), IsOk()) << "a timeout does not break the link";
}

TEST_P(PeerLinkTest, ForeignJobFrameIsRejected) {
  Connect();
  Accept();
  down_->BeginStep(0);
  std::mt19937 rng(23);
  FrameTag foreign = Tag(0, 0, TensorKind::kActivation);
  foreign.job_id = "someone-else";
  ASSERT_THAT(up_->Send(foreign, RandomTensor({3}, rng), In(absl::Seconds(5))), IsOk());
  auto got = down_->Receive(Tag(0, 0, TensorKind::kActivation), In(absl::Seconds(10)));
  EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     AllOf(HasSubstr("someone-else"), HasSubstr("job_id"))));
  // The sender learns why its stream ended.
  auto back = up_->Receive(Tag(0, 0, TensorKind::kGradient), In(absl::Seconds(10)));
  EXPECT_THAT(back.status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id")));
}

// The job's bound (stage_server/link_limits): a micro-batch's activation passes, one
// announcing more than any tensor of the job could be is refused before it is buffered.
TEST_P(PeerLinkTest, ATensorLargerThanTheJobsLargestIsRefused) {
  model::TransformerConfig model;
  model.seq_len = 4;
  model.d_model = 8;
  PeerLinkOptions down = Options(1, 0);
  down.limits = LinkLimits(model, /*micro_batch_size=*/2);
  ASSERT_EQ(down.limits.max_tensor_bytes, 2u * 4 * 8 * 4);
  ConnectTo(down);
  up_->BeginStep(0);
  down_->BeginStep(0);
  std::mt19937 rng(29);
  auto fits = RandomTensor({2, 4, 8}, rng);
  ASSERT_THAT(up_->Send(Tag(0, 0, TensorKind::kActivation), fits, In(absl::Seconds(5))), IsOk());
  auto got = down_->Receive(Tag(0, 0, TensorKind::kActivation), In(absl::Seconds(10)));
  ASSERT_THAT(got.status(), IsOk());
  EXPECT_TRUE(SameBytes(*got, *fits));
  ASSERT_THAT(up_->Send(Tag(0, 1, TensorKind::kActivation), RandomTensor({2, 4, 9}, rng),
                        In(absl::Seconds(5))),
              IsOk());
  auto refused = down_->Receive(Tag(0, 1, TensorKind::kActivation), In(absl::Seconds(10)));
  EXPECT_THAT(refused.status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("total_bytes 288"), HasSubstr("limit of 256 bytes"))));
}

TEST(LinkLimitsTest, TheLargestActivationOrTiedGradientOfTheJob) {
  model::TransformerConfig model;
  model.vocab_size = 50257;
  model.seq_len = 1024;
  model.d_model = 768;
  EXPECT_EQ(LinkLimits(model, 4).max_tensor_bytes, uint64_t{4} * 1024 * 768 * 4);
  model.tie_embeddings = true;
  EXPECT_EQ(LinkLimits(model, 4).max_tensor_bytes, uint64_t{50257} * 768 * 4)
      << "the tied embedding's gradient is the larger";
  EXPECT_EQ(LinkLimits(model, 64).max_tensor_bytes, uint64_t{64} * 1024 * 768 * 4);
  // Never above the general bound, and an unsizable config keeps it.
  const uint64_t general = common::ReassemblerOptions().max_tensor_bytes;
  EXPECT_EQ(LinkLimits(model, 1 << 30).max_tensor_bytes, general);
  EXPECT_EQ(LinkLimits(model, 0).max_tensor_bytes, uint64_t{50257} * 768 * 4);
  model.tie_embeddings = false;
  EXPECT_EQ(LinkLimits(model, 0).max_tensor_bytes, general);
}

TEST(LinkLimitsTest, Bf16ActivationsHalveTheActivationBoundButNotTheTiedGradients) {
  model::TransformerConfig model;
  model.vocab_size = 50257;
  model.seq_len = 1024;
  model.d_model = 768;
  EXPECT_EQ(LinkLimits(model, 4, common::DType::kBF16).max_tensor_bytes,
            uint64_t{4} * 1024 * 768 * 2);
  model.tie_embeddings = true;  // the (V, C) gradient stays fp32
  EXPECT_EQ(LinkLimits(model, 4, common::DType::kBF16).max_tensor_bytes,
            uint64_t{50257} * 768 * 4);
}

TEST_P(PeerLinkTest, WrongKindAndStaleStepAreRejected) {
  Connect();
  Accept();
  down_->BeginStep(5);
  std::mt19937 rng(24);
  ASSERT_THAT(up_->Send(Tag(5, 0, TensorKind::kGradient), RandomTensor({3}, rng), In(absl::Seconds(5))),
              IsOk());
  EXPECT_THAT(down_->Receive(Tag(5, 0, TensorKind::kActivation), In(absl::Seconds(10))).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field kind")));

  up_.reset();
  down_.reset();
  Connect();
  Accept();
  down_->BeginStep(5);
  ASSERT_THAT(up_->Send(Tag(4, 0, TensorKind::kActivation), RandomTensor({3}, rng), In(absl::Seconds(5))),
              IsOk());
  EXPECT_THAT(down_->Receive(Tag(5, 0, TensorKind::kActivation), In(absl::Seconds(10))).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("stale"), HasSubstr("step"))));
}

TEST_P(PeerLinkTest, WrongSecretIsRefused) {
  Connect("not-the-secret");
  auto down = acceptor_->WaitForPeer("job-1", 0, In(absl::Milliseconds(500)));
  EXPECT_THAT(down.status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("did not connect")));
  up_->BeginStep(0);
  auto got = up_->Receive(Tag(0, 0, TensorKind::kGradient), In(absl::Seconds(10)));
  EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("peer_secret")));

  // The foreign peer took nothing: the stage with the job's secret still gets the slot
  // (no new Expect) and its tensors arrive.
  auto channel =
      grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(),
                                common::ChannelArgumentsFor(common::ChannelUse::kPeerLink));
  auto up = ConnectPeerLink(channel, Options(0, 1), "secret", In(absl::Seconds(10)));
  ASSERT_THAT(up.status(), IsOk());
  up_ = std::move(*up);
  Accept();
  std::mt19937 rng(5);
  auto act = RandomTensor({2, 3}, rng);
  up_->BeginStep(0);
  down_->BeginStep(0);
  ASSERT_THAT(up_->Send(Tag(0, 0, TensorKind::kActivation), act, In(absl::Seconds(10))), IsOk());
  auto arrived = down_->Receive(Tag(0, 0, TensorKind::kActivation), In(absl::Seconds(10)));
  ASSERT_THAT(arrived.status(), IsOk());
  EXPECT_TRUE(SameBytes(*arrived, *act));
}

TEST_P(PeerLinkTest, LostPeerIsUnavailableNotAHang) {
  Connect();
  Accept();
  up_->BeginStep(2);
  // The downstream stage goes away while the upstream one waits for a gradient.
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(200));
    server_->Shutdown(std::chrono::system_clock::now());
  });
  const absl::Time start = absl::Now();
  auto got = up_->Receive(Tag(2, 1, TensorKind::kGradient), In(absl::Seconds(30)));
  killer.join();
  EXPECT_THAT(got.status(), StatusIs(absl::StatusCode::kUnavailable,
                                     AllOf(HasSubstr("step 2"), HasSubstr("micro-batch 1"),
                                           HasSubstr("stage 1"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "noticed promptly";
  std::mt19937 rng(25);
  EXPECT_THAT(up_->Send(Tag(2, 1, TensorKind::kActivation), RandomTensor({3}, rng), In(absl::Seconds(1))),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST_P(PeerLinkTest, UnreachablePeerFailsBeforeTheDeadline) {
  auto channel =
      grpc::CreateCustomChannel("127.0.0.1:1", grpc::InsecureChannelCredentials(),
                                common::ChannelArgumentsFor(common::ChannelUse::kPeerLink));
  auto up = ConnectPeerLink(channel, Options(0, 1), "secret", In(absl::Milliseconds(500)));
  EXPECT_THAT(up.status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot reach stage 1")));
}

// Waits until `link`'s offer for what it sends has been answered.
std::string SettledPath(PeerLink& link) {
  const absl::Time deadline = In(absl::Seconds(10));
  std::string path = link.sending_path();
  while (absl::StrContains(path, "not answered yet") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    path = link.sending_path();
  }
  return path;
}

// With the same-host path, both directions go through shared memory once the offers are
// answered: tensors larger than a slot (4 MiB), and more of them than the region holds
// (64 MiB), arrive intact in order of asking; with it off, both stay on the stream.
TEST_P(PeerLinkTest, EachDirectionSaysItsPathAndLargeTensorsArriveIntact) {
  Connect();
  Accept();
  const std::string up_path = SettledPath(*up_), down_path = SettledPath(*down_);
  if (GetParam() && absl::StrContains(up_path + down_path, "shared-memory region")) {
    GTEST_SKIP() << "this machine cannot make the regions (a small /dev/shm?): " << up_path;
  }
  if (GetParam()) {
    EXPECT_THAT(up_path, HasSubstr("shared memory (16 slots of 4.0 MiB)"));
    EXPECT_THAT(down_path, HasSubstr("shared memory"));
    EXPECT_THAT(down_->receiving_path(), HasSubstr("shared memory"));
  } else {
    EXPECT_EQ(up_path, "tcp (--same-host-transport off)");
    EXPECT_EQ(down_path, "tcp (--same-host-transport off)");
  }
  up_->BeginStep(0);
  down_->BeginStep(0);
  std::mt19937 rng(41);
  std::vector<std::shared_ptr<const Tensor>> sent;
  for (int mb = 0; mb < 12; ++mb) {  // 12 x 9 MiB: 108 MiB through a 64 MiB region
    sent.push_back(RandomTensor({9, 1 << 18}, rng));
    ASSERT_THAT(up_->Send(Tag(0, mb, TensorKind::kActivation), sent.back(), In(absl::Seconds(20))),
                IsOk());
  }
  auto grad = RandomTensor({5, 1 << 18}, rng);
  ASSERT_THAT(down_->Send(Tag(0, 3, TensorKind::kGradient), grad, In(absl::Seconds(20))), IsOk());
  for (int mb = 11; mb >= 0; --mb) {
    auto got = down_->Receive(Tag(0, mb, TensorKind::kActivation), In(absl::Seconds(20)));
    ASSERT_THAT(got.status(), IsOk()) << mb;
    EXPECT_TRUE(SameBytes(*got, *sent[mb])) << mb;
  }
  auto got = up_->Receive(Tag(0, 3, TensorKind::kGradient), In(absl::Seconds(20)));
  ASSERT_THAT(got.status(), IsOk());
  EXPECT_TRUE(SameBytes(*got, *grad));
  EXPECT_EQ(up_->bytes_sent(), 12u * 9 * (1 << 18) * 4);
  EXPECT_EQ(down_->bytes_received(), up_->bytes_sent());
}

// On the same-host path a tensor that came in one part is viewed where the sender wrote
// it (one piece per 4 MiB slot, no copy) until the receiver drops it. A receiver that
// keeps every tensor never stalls the sender (it keeps at most half the slots; the
// rest are copied out), and what it kept stays intact after both ends closed.
TEST_P(PeerLinkTest, TensorsKeptInPlaceNeverStallTheSenderAndOutliveTheLink) {
  if (!GetParam()) GTEST_SKIP() << "only the same-host path views tensors in place";
  Connect();
  Accept();
  const std::string path = SettledPath(*up_);
  if (absl::StrContains(path, "shared-memory region")) {
    GTEST_SKIP() << "this machine cannot make the regions (a small /dev/shm?): " << path;
  }
  ASSERT_THAT(path, HasSubstr("shared memory (16 slots of 4.0 MiB)"));
  up_->BeginStep(0);
  down_->BeginStep(0);
  std::mt19937 rng(47);
  std::vector<std::shared_ptr<const Tensor>> sent;
  std::vector<common::PiecewiseTensor> kept;
  for (int mb = 0; mb < 10; ++mb) {  // 10 x 9 MiB, all kept: more than the region
    sent.push_back(RandomTensor({9, 1 << 18}, rng));
    ASSERT_THAT(up_->Send(Tag(0, mb, TensorKind::kActivation), sent.back(), In(absl::Seconds(20))),
                IsOk()) << mb;
    auto got = down_->Receive(Tag(0, mb, TensorKind::kActivation), In(absl::Seconds(20)));
    ASSERT_THAT(got.status(), IsOk()) << mb;
    kept.push_back(*std::move(got));
  }
  EXPECT_EQ(kept[0].pieces().size(), 3u) << "the first tensor is viewed in its three slots";
  EXPECT_EQ(kept[9].pieces().size(), 1u) << "past half the slots, tensors are copied out";
  up_->Close();
  down_->Close();
  for (int mb = 0; mb < 10; ++mb) EXPECT_TRUE(SameBytes(kept[mb], *sent[mb])) << mb;
}

// Tensors under LinkShm::kMinTensorBytes keep to the stream even on the same-host path
// (one message there, two through shared memory); larger ones go through the region.
TEST_P(PeerLinkTest, SmallTensorsKeepToTheStream) {
  Connect();
  Accept();
  const std::string path = SettledPath(*up_);
  if (GetParam() && absl::StrContains(path, "shared-memory region")) {
    GTEST_SKIP() << "this machine cannot make the regions (a small /dev/shm?): " << path;
  }
  up_->BeginStep(0);
  down_->BeginStep(0);
  std::mt19937 rng(53);
  auto small = RandomTensor({16, 1024}, rng);  // 64 KiB
  auto large = RandomTensor({256, 1024}, rng);  // 1 MiB
  ASSERT_THAT(up_->Send(Tag(0, 0, TensorKind::kActivation), small, In(absl::Seconds(10))), IsOk());
  ASSERT_THAT(up_->Send(Tag(0, 1, TensorKind::kActivation), large, In(absl::Seconds(10))), IsOk());
  for (int mb = 0; mb < 2; ++mb) {
    auto got = down_->Receive(Tag(0, mb, TensorKind::kActivation), In(absl::Seconds(10)));
    ASSERT_THAT(got.status(), IsOk()) << mb;
    EXPECT_TRUE(SameBytes(*got, mb == 0 ? *small : *large)) << mb;
  }
  EXPECT_EQ(up_->bytes_sent(), small->num_bytes() + large->num_bytes());
  EXPECT_EQ(up_->bytes_sent_same_host(), GetParam() ? large->num_bytes() : 0u);
}

// One end off is enough: the other's offer is refused, said why, and tensors keep to
// the stream.
TEST_P(PeerLinkTest, AReceiverThatIsOffRefusesTheOffer) {
  if (!GetParam()) GTEST_SKIP() << "the sender offers only with the same-host path on";
  PeerLinkOptions down = Options(1, 0);
  down.same_host = false;
  ConnectTo(down);
  const std::string path = SettledPath(*up_);
  if (absl::StrContains(path, "shared-memory region")) {
    GTEST_SKIP() << "this machine cannot make the regions (a small /dev/shm?): " << path;
  }
  EXPECT_THAT(path, HasSubstr("tcp (the peer: the receiving stage runs --same-host-transport off)"));
  EXPECT_THAT(up_->receiving_path(), HasSubstr("tcp (no offer came)"));
  up_->BeginStep(0);
  down_->BeginStep(0);
  std::mt19937 rng(43);
  auto act = RandomTensor({3, 5}, rng);
  ASSERT_THAT(up_->Send(Tag(0, 0, TensorKind::kActivation), act, In(absl::Seconds(10))), IsOk());
  auto got = down_->Receive(Tag(0, 0, TensorKind::kActivation), In(absl::Seconds(10)));
  ASSERT_THAT(got.status(), IsOk());
  EXPECT_TRUE(SameBytes(*got, *act));
}

INSTANTIATE_TEST_SUITE_P(Paths, PeerLinkTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "SameHost" : "Stream";
                         });

}  // namespace
}  // namespace pipetrain::stage_server
