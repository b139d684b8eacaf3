// The same-host transport's pieces: a shared-memory region made by one end
// and opened by the other, refusing what it was not told (a wrong nonce, a wrong size,
// a name not of its form, a region open to others, one already unlinked), the sender's
// slot accounting (credits, deadlines, a link that goes while slots are out), a tensor
// through the slots, and the handshake (offer, echo, unlink; its refusals).
// The second end runs in a child process where it matters: the region is shared memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/link/shm/shm_handshake.h"
#include "stage_server/link/shm/shm_holds.h"
#include "stage_server/link/shm/shm_region.h"
#include "stage_server/link/shm/shm_slots.h"
#include "stage_server/link/shm/shm_transport.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

bool NameExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(ShmRegionTest, TheOtherProcessSeesTheBytesAndTheNameGoes) {
  auto region = ShmRegion::Create(1 << 20);
  ASSERT_THAT(region, IsOk());
  EXPECT_THAT(region->name(), HasSubstr(kShmNamePrefix));
  struct stat st {};
  const int fd = shm_open(region->name().c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fstat(fd, &st), 0);
  close(fd);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "only this user";
  std::span<std::byte> mine = region->payload();
  ASSERT_EQ(mine.size(), 1u << 20);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<std::byte>(i * 7 + 3);

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The neighbour: open, check every byte, write its answer at the end, unlink.
    auto theirs = ShmRegion::Open(region->name(), 1 << 20, region->nonce());
    if (!theirs.ok()) _exit(10);
    std::span<std::byte> p = theirs->payload();
    for (size_t i = 0; i + 1 < p.size(); ++i) {
      if (p[i] != static_cast<std::byte>(i * 7 + 3)) _exit(11);
    }
    p[p.size() - 1] = std::byte{0x5a};
    if (!theirs->Unlink().ok()) _exit(12);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10 open, 11 bytes, 12 unlink";
  EXPECT_EQ(mine[mine.size() - 1], std::byte{0x5a}) << "the child's write is seen here";
  EXPECT_FALSE(NameExists(region->name())) << "unlinked by the neighbour";
  EXPECT_THAT(region->Unlink(), IsOk()) << "a second unlink finds it gone and is fine";
  EXPECT_THAT(ShmRegion::Open(region->name(), 1 << 20, region->nonce()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(region->name())))
      << "no third process can open it any more";
}

TEST(ShmRegionTest, AWrongNonceOrSizeIsRefused) {
  auto region = ShmRegion::Create(4096);
  ASSERT_THAT(region, IsOk());
  ShmNonce wrong = region->nonce();
  wrong[15] ^= 1;
  EXPECT_THAT(ShmRegion::Open(region->name(), 4096, wrong),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("nonce")));
  EXPECT_THAT(ShmRegion::Open(region->name(), 8192, region->nonce()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("announced")));
  EXPECT_THAT(ShmRegion::Open(region->name(), 4096, region->nonce()), IsOk());
}

TEST(ShmRegionTest, OnlyItsOwnNamesAndModesAreOpened) {
  for (const std::string bad : {"/etc/passwd", "/pipetrain-../../x", "pipetrain-0123",
                                "/pipetrain-0123456789ABCDEF0123456789abcdef", ""}) {
    EXPECT_THAT(ShmRegion::Open(bad, 4096, ShmNonce{}),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
  // A region of the right form but open to others: refused before it is mapped.
  const std::string name = std::string(kShmNamePrefix) + "00112233445566778899aabbccddeeff";
  shm_unlink(name.c_str());
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0666), 0);
  ASSERT_EQ(ftruncate(fd, kShmHeaderBytes + 4096), 0);
  close(fd);
  EXPECT_THAT(ShmRegion::Open(name, 4096, ShmNonce{}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("mode 666")));
  shm_unlink(name.c_str());
}

TEST(ShmRegionTest, ACreatorWhoseNeighbourNeverCameLeavesNoName) {
  std::string name;
  {
    auto region = ShmRegion::Create(4096);
    ASSERT_THAT(region, IsOk());
    name = region->name();
    ShmRegion moved = *std::move(region);
    EXPECT_TRUE(NameExists(name));
    EXPECT_TRUE(moved.creator());
  }
  EXPECT_FALSE(NameExists(name));
  EXPECT_THAT(ShmRegion::Create(0), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ShmRegionTest, NoncesRoundTripAsHexAndBadHexIsRefused) {
  auto a = ShmRegion::Create(64);
  auto b = ShmRegion::Create(64);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_NE(a->name(), b->name());
  EXPECT_NE(ShmNonceHex(a->nonce()), ShmNonceHex(b->nonce())) << "fresh random nonces";
  auto back = ShmNonceFromHex(ShmNonceHex(a->nonce()));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(*back, a->nonce());
  EXPECT_THAT(ShmNonceFromHex("xyz"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ShmNonceFromHex(std::string(32, 'G')), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ShmSlotsTest, SlotsGoOutAndComeBackWithCredits) {
  ShmSlots slots(4, 1000, "job-1 stage 0 -> 1");
  EXPECT_EQ(slots.SlotsFor(0), 1);
  EXPECT_EQ(slots.SlotsFor(1000), 1);
  EXPECT_EQ(slots.SlotsFor(1001), 2);
  auto a = slots.Acquire(3, absl::InfiniteFuture());
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(*a, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(slots.free_slots(), 1);
  ASSERT_THAT(slots.Release(1), IsOk());
  auto b = slots.Acquire(2, absl::InfiniteFuture());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(*b, (std::vector<int>{1, 3}));
  EXPECT_THAT(slots.Release(1), IsOk());
  EXPECT_THAT(slots.Release(1), StatusIs(absl::StatusCode::kFailedPrecondition,
                                         HasSubstr("slot 1, which is not in flight")))
      << "a second credit for one slot";
  EXPECT_THAT(slots.Release(9), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(slots.Acquire(5, absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ShmSlotsTest, AFullRingWaitsForACreditAndNoLongerThanItsDeadline) {
  ShmSlots slots(2, 64, "job-1 stage 1 -> 2");
  ASSERT_THAT(slots.Acquire(2, absl::InfiniteFuture()), IsOk());
  EXPECT_THAT(slots.Acquire(1, absl::Now() + absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("job-1 stage 1 -> 2")));
  std::thread credit([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_THAT(slots.Release(0), IsOk());
  });
  auto got = slots.Acquire(1, absl::Now() + absl::Seconds(30));
  credit.join();
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(*got, std::vector<int>{0});
}

TEST(ShmSlotsTest, ALinkThatGoesFreesEverySlotAndWakesTheWaiters) {
  ShmSlots slots(2, 64, "job-1 stage 2 -> 3");
  ASSERT_THAT(slots.Acquire(2, absl::InfiniteFuture()), IsOk());
  absl::StatusOr<std::vector<int>> waited = absl::UnknownError("not run");
  std::thread waiter([&] { waited = slots.Acquire(1, absl::Now() + absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(20));
  slots.Close("stage 3 lost");
  waiter.join();
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kAborted, HasSubstr("stage 3 lost")));
  EXPECT_EQ(slots.free_slots(), 2) << "nothing leaked";
}

// Both ends of one direction in this process (two mappings of one region): a tensor
// larger than every slot together goes over in parts, each part's slots credited back
// as the receiver takes them, and arrives equal through the usual reassembler.
struct Pair {
  ShmSender sender;
  ShmReceiver receiver;
};

Pair MakePair(ShmLayout layout) {
  auto region = ShmRegion::Create(layout.payload_bytes());
  EXPECT_THAT(region, IsOk());
  auto opened = ShmRegion::Open(region->name(), layout.payload_bytes(), region->nonce());
  EXPECT_THAT(opened, IsOk());
  EXPECT_THAT(opened->Unlink(), IsOk());
  return {ShmSender(*std::move(region), layout, "job-1 stage 0 -> 1"),
          ShmReceiver(*std::move(opened), layout, "job-1 stage 0 -> 1")};
}

TEST(ShmTransportTest, ATensorLargerThanTheRingArrivesEqual) {
  Pair pair = MakePair({.slots = 4, .slot_bytes = 1000});
  auto tensor = common::Tensor::Create(common::DType::kF32, {3, 1001});  // 12012 bytes
  ASSERT_THAT(tensor, IsOk());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (float& x : tensor->data<float>()) x = normal(rng);
  const common::FrameTag tag{"job-1", 3, 2, 0, common::TensorKind::kActivation};
  common::TensorReassembler reassembler;
  std::optional<common::ReceivedTensor> got;
  int parts = 0;
  ASSERT_THAT(pair.sender.Send(tag, *tensor, absl::Now() + absl::Seconds(10),
                               [&](const common::FrameHeader& h, std::span<const int> slots,
                                   uint64_t bytes) {
                                 ++parts;
                                 auto pieces = pair.receiver.Pieces(slots, bytes);
                                 if (!pieces.ok()) return pieces.status();
                                 auto r = reassembler.Accept(h, *pieces);
                                 if (!r.ok()) return r.status();
                                 if (r->has_value()) got = std::move(**r);
                                 for (int s : slots) {
                                   if (absl::Status c = pair.sender.Credit(s); !c.ok()) return c;
                                 }
                                 return absl::OkStatus();
                               }),
              IsOk());
  EXPECT_EQ(parts, 7) << "12012 bytes in parts of at most half the 4 slots (2 x 1000)";
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->tag, tag);
  EXPECT_EQ(got->tensor.shape(), tensor->shape());
  ASSERT_EQ(got->tensor.num_bytes(), tensor->num_bytes());
  EXPECT_EQ(std::memcmp(got->tensor.bytes().data(), tensor->bytes().data(), tensor->num_bytes()), 0);
  EXPECT_EQ(pair.sender.free_slots(), 4) << "every slot credited back";
}

TEST(ShmTransportTest, WithoutCreditsTheSenderStopsAtItsDeadline) {
  Pair pair = MakePair({.slots = 2, .slot_bytes = 64});
  // 256 bytes: 4 parts of one slot (half the ring); two fit before the credits run out.
  auto tensor = common::Tensor::Create(common::DType::kF32, {64});
  ASSERT_THAT(tensor, IsOk());
  int parts = 0;
  EXPECT_THAT(pair.sender.Send({"job-1", 0, 0, 0, common::TensorKind::kGradient}, *tensor,
                               absl::Now() + absl::Milliseconds(50),
                               [&](const common::FrameHeader&, std::span<const int>, uint64_t) {
                                 ++parts;
                                 return absl::OkStatus();
                               }),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("job-1 stage 0 -> 1")));
  EXPECT_EQ(parts, 2);
  pair.sender.Close("stage 1 lost");
  EXPECT_EQ(pair.sender.free_slots(), 2);
}

// A receiving stage that views tensors in place keeps their slots until the last view
// goes, then credits exactly those; never more than the limit at once (the rest is
// copied out); and after the link went (Detach) a late drop credits nothing but still
// frees the mapping, which lived as long as a view of it.
TEST(ShmHoldsTest, SlotsGoBackWhenTheLastViewGoesAndNeverPastTheLimit) {
  Pair pair = MakePair({.slots = 8, .slot_bytes = 64});
  auto receiver = std::make_shared<const ShmReceiver>(std::move(pair.receiver));
  std::vector<int> credited;
  auto holds = std::make_shared<ShmHolds>(
      [&](std::span<const int> s) { credited.insert(credited.end(), s.begin(), s.end()); });
  std::shared_ptr<const void> a = holds->TryHold(receiver, {0, 1, 2}, 4);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(holds->TryHold(receiver, {3, 4}, 4), nullptr) << "5 held would pass the limit of 4";
  EXPECT_EQ(holds->held(), 3);
  std::shared_ptr<const void> c = holds->TryHold(receiver, {5}, 4);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(holds->held(), 4);
  std::shared_ptr<const void> a_view = a;
  a.reset();
  EXPECT_TRUE(credited.empty()) << "a view is still alive";
  a_view.reset();
  EXPECT_EQ(credited, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(holds->held(), 1);

  std::weak_ptr<const ShmReceiver> mapping = receiver;
  receiver.reset();
  EXPECT_FALSE(mapping.expired()) << "a held tensor keeps the region mapped";
  holds->Detach();
  c.reset();
  EXPECT_EQ(credited, (std::vector<int>{0, 1, 2})) << "no credit after the link went";
  EXPECT_EQ(holds->held(), 0);
  EXPECT_TRUE(mapping.expired());
}

TEST(ShmTransportTest, AReceiverRefusesSlotsItWasNotGiven) {
  Pair pair = MakePair({.slots = 4, .slot_bytes = 100});
  const std::vector<int> out_of_range = {4}, twice = {1, 1}, too_few = {0}, none = {};
  EXPECT_THAT(pair.receiver.Pieces(out_of_range, 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slot 4")));
  EXPECT_THAT(pair.receiver.Pieces(twice, 150),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("named twice")));
  EXPECT_THAT(pair.receiver.Pieces(too_few, 150),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not 2")));
  EXPECT_THAT(pair.receiver.Pieces(none, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  auto ok = pair.receiver.Pieces(std::vector<int>{3, 0}, 150);
  ASSERT_THAT(ok, IsOk());
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].size(), 100u);
  EXPECT_EQ((*ok)[1].size(), 50u);
  EXPECT_EQ((*ok)[0].data(), pair.receiver.region().payload().data() + 300);
}

TEST(ShmHandshakeTest, OfferEchoAndConfirmAcrossProcessesLeaveNoName) {
  auto offered = MakeOffer(LayoutFor(100000));
  ASSERT_THAT(offered, IsOk());
  const ShmOffer offer = offered->offer;
  int echo_pipe[2];
  ASSERT_EQ(pipe(echo_pipe), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The neighbour: accept the offer, send back the echo, wait for the bytes.
    close(echo_pipe[0]);
    std::string echo;
    auto receiver = AcceptOffer(offer, ShmLimits{}, "job-1 stage 0 -> 1", &echo);
    if (!receiver.ok() || echo.size() != 32) _exit(10);
    if (write(echo_pipe[1], echo.data(), echo.size()) != 32) _exit(11);
    close(echo_pipe[1]);
    const std::byte* p = receiver->region().payload().data();
    for (int i = 0; i < 2000 && p[0] != std::byte{7}; ++i) usleep(1000);
    _exit(p[0] == std::byte{7} ? 0 : 12);
  }
  close(echo_pipe[1]);
  char echo[32];
  ASSERT_EQ(read(echo_pipe[0], echo, sizeof(echo)), 32);
  close(echo_pipe[0]);
  auto sender = ConfirmEcho(*std::move(offered), std::string(echo, 32), "job-1 stage 0 -> 1");
  ASSERT_THAT(sender, IsOk());
  EXPECT_FALSE(NameExists(offer.name)) << "unlinked once both ends held it";
  (*sender)->region().payload()[0] = std::byte{7};
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10 accept, 11 echo, 12 the byte never came";
}

TEST(ShmHandshakeTest, AWrongEchoKeepsToTcpAndUnlinks) {
  auto offered = MakeOffer(LayoutFor(4096));
  ASSERT_THAT(offered, IsOk());
  const std::string name = offered->offer.name;
  EXPECT_THAT(ConfirmEcho(*std::move(offered), std::string(32, '0'), "job-1 stage 1 -> 2"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       AllOf(HasSubstr("job-1 stage 1 -> 2"), HasSubstr("another nonce"))));
  EXPECT_FALSE(NameExists(name));
}

TEST(ShmHandshakeTest, OffersOutsideTheLimitsOrFromElsewhereAreRefused) {
  auto offered = MakeOffer({.slots = 4, .slot_bytes = 4096});
  ASSERT_THAT(offered, IsOk());
  std::string echo;
  ShmOffer too_many = offered->offer;
  too_many.layout.slots = 1000;
  EXPECT_THAT(AcceptOffer(too_many, ShmLimits{}, "L", &echo),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1000 slots")));
  ShmOffer too_big = offered->offer;
  too_big.layout.slot_bytes = uint64_t{1} << 30;
  EXPECT_THAT(AcceptOffer(too_big, ShmLimits{}, "L", &echo),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ShmOffer bad_nonce = offered->offer;
  bad_nonce.nonce_hex = "zz";
  EXPECT_THAT(AcceptOffer(bad_nonce, ShmLimits{}, "L", &echo),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("hex")));
  ShmOffer wrong_size = offered->offer;
  wrong_size.layout.slots = 3;
  EXPECT_THAT(AcceptOffer(wrong_size, ShmLimits{}, "L", &echo),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // Another host's region: its name is not here.
  ShmOffer elsewhere = offered->offer;
  elsewhere.name = std::string(kShmNamePrefix) + std::string(32, 'a');
  EXPECT_THAT(AcceptOffer(elsewhere, ShmLimits{}, "L", &echo),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(AcceptOffer(offered->offer, ShmLimits{}, "L", &echo), IsOk());
  EXPECT_EQ(echo, offered->offer.nonce_hex);
}

TEST(ShmHandshakeTest, TheLayoutHoldsFourOfTheLargestTensorsWithinTheLimits) {
  const ShmLayout small = LayoutFor(1000);
  EXPECT_EQ(small.slot_bytes, 4096u);
  EXPECT_EQ(small.slots, 8);
  const ShmLayout mid = LayoutFor(uint64_t{16} << 20);  // a 16 MiB activation
  EXPECT_EQ(mid.slot_bytes, uint64_t{4} << 20);
  EXPECT_EQ(mid.slots, 16);
  // Half the slots may be held in place, the other half takes a whole tensor.
  EXPECT_EQ(mid.max_held_slots(), 8);
  EXPECT_EQ(mid.max_part_bytes(), uint64_t{32} << 20);
  const ShmLayout odd{5, 4096};
  EXPECT_EQ(odd.max_held_slots(), 2);
  EXPECT_EQ(odd.max_part_bytes(), 3u * 4096);
  const ShmLayout huge = LayoutFor(uint64_t{8} << 30, ShmLimits{});
  EXPECT_LE(huge.payload_bytes(), ShmLimits{}.max_region_bytes);
  EXPECT_LE(huge.slots, ShmLimits{}.max_slots);
  EXPECT_GE(huge.slots, 1);
}

}  // namespace
}  // namespace pipetrain::stage_server
