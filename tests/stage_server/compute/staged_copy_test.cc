// Tests of the staged copy logic (staged_copy.h) against a fake engine whose copies
// complete late and in stream order, at random points: the destination must equal the
// source for random data and piece layouts, no slot may be touched by the host or given
// a new copy while its copy is in flight, and no more copies than slots may be in flight.
#include "stage_server/compute/staged_copy.h"

#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::compute {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

constexpr std::byte kPoison{0xA5};

// Slots in host memory, "device" memory in host memory too. Copies queue up like on one
// CUDA stream and complete in order: a few at a time at random engine calls, or all up
// to a slot's last copy when that slot is waited for. What the staging logic must not
// do is recorded in violations.
class FakeEngine final : public StagingEngine {
 public:
  // max_progress: how many of the oldest copies may complete on their own at each
  // engine call (0: only when a slot is waited for, as on a slow device).
  FakeEngine(size_t num_slots, size_t slot_bytes, uint32_t seed, int max_progress = 2)
      : slot_bytes_(slot_bytes), slots_(num_slots), rng_(seed), max_progress_(max_progress) {
    for (auto& s : slots_) s.assign(slot_bytes, kPoison);
  }

  size_t num_slots() const override { return slots_.size(); }
  size_t slot_bytes() const override { return slot_bytes_; }
  std::byte* slot(size_t s) override {
    Progress();
    if (Busy(s)) Violation(absl::StrCat("slot ", s, " touched by the host while in flight"));
    return slots_[s].data();
  }
  absl::Status CopySlotToDevice(size_t s, void* device_dst, size_t bytes) override {
    return Issue({s, static_cast<std::byte*>(device_dst), nullptr, bytes, slots_[s]});
  }
  absl::Status CopyDeviceToSlot(size_t s, const void* device_src, size_t bytes) override {
    absl::Status st = Issue({s, nullptr, static_cast<const std::byte*>(device_src), bytes, {}});
    // Whatever was in the slot is gone; a read before completion sees poison.
    std::fill(slots_[s].begin(), slots_[s].end(), kPoison);
    return st;
  }
  absl::Status WaitSlot(size_t s) override {
    ++waits_;
    while (Busy(s)) CompleteOldest();
    return absl::OkStatus();
  }

  // Completes everything (what a stream synchronize does).
  void Drain() {
    while (!queue_.empty()) CompleteOldest();
  }
  size_t in_flight() const { return queue_.size(); }
  size_t max_in_flight() const { return max_in_flight_; }
  size_t copies() const { return copies_; }
  const std::vector<std::string>& violations() const { return violations_; }
  // Makes the copy with this (0-based) issue number fail.
  void FailCopy(size_t n) { fail_at_ = n; }

 private:
  struct Op {
    size_t slot;
    std::byte* to_device;          // host -> device when set
    const std::byte* from_device;  // device -> host when set
    size_t bytes;
    std::vector<std::byte> snapshot;  // the slot as issued (host -> device)
  };

  bool Busy(size_t s) const {
    for (const Op& op : queue_) {
      if (op.slot == s) return true;
    }
    return false;
  }
  void Violation(std::string what) { violations_.push_back(std::move(what)); }

  absl::Status Issue(Op op) {
    Progress();
    if (op.slot >= slots_.size()) {
      Violation(absl::StrCat("copy on slot ", op.slot, " of ", slots_.size()));
      return absl::OkStatus();
    }
    if (op.bytes == 0 || op.bytes > slot_bytes_) {
      Violation(absl::StrCat("copy of ", op.bytes, " bytes through a slot of ", slot_bytes_));
    }
    if (Busy(op.slot)) Violation(absl::StrCat("copy issued on busy slot ", op.slot));
    if (copies_++ == fail_at_) return absl::InternalError("fake copy failed");
    queue_.push_back(std::move(op));
    max_in_flight_ = std::max(max_in_flight_, queue_.size());
    if (queue_.size() > slots_.size()) {
      Violation(absl::StrCat(queue_.size(), " copies in flight with ", slots_.size(),
                             " slots"));
    }
    return absl::OkStatus();
  }

  void CompleteOldest() {
    Op op = std::move(queue_.front());
    queue_.pop_front();
    std::vector<std::byte>& slot = slots_[op.slot];
    if (op.to_device != nullptr) {
      // The DMA reads the slot now: it must still hold what it held at issue.
      if (std::memcmp(slot.data(), op.snapshot.data(), op.bytes) != 0) {
        Violation(absl::StrCat("slot ", op.slot, " rewritten before its copy completed"));
      }
      std::memcpy(op.to_device, slot.data(), op.bytes);
    } else {
      std::memcpy(slot.data(), op.from_device, op.bytes);
    }
  }

  // The device makes progress on its own: a few of the oldest copies complete.
  void Progress() {
    const int n = std::uniform_int_distribution<int>(0, max_progress_)(rng_);
    for (int i = 0; i < n && !queue_.empty(); ++i) CompleteOldest();
  }

  size_t slot_bytes_;
  std::vector<std::vector<std::byte>> slots_;
  std::deque<Op> queue_;
  std::mt19937 rng_;
  int max_progress_;
  size_t max_in_flight_ = 0;
  size_t copies_ = 0;
  size_t waits_ = 0;
  size_t fail_at_ = SIZE_MAX;
  std::vector<std::string> violations_;
};

std::vector<std::byte> RandomBytes(size_t n, std::mt19937& rng) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xff);
  return v;
}

// Cuts [0, total) into pieces: random lengths from 0 (empty) to 2.5 slots, with empty
// pieces at the front and back as well.
std::vector<std::span<const std::byte>> RandomPieces(const std::vector<std::byte>& data,
                                                     size_t slot_bytes, std::mt19937& rng) {
  std::vector<std::span<const std::byte>> pieces;
  pieces.emplace_back();  // an empty piece first
  std::uniform_int_distribution<size_t> len(0, slot_bytes * 5 / 2);
  for (size_t at = 0; at < data.size();) {
    const size_t n = std::min(len(rng), data.size() - at);
    pieces.emplace_back(data.data() + at, n);
    at += n;
  }
  pieces.emplace_back();
  return pieces;
}

struct Layout {
  size_t slots;
  size_t slot_bytes;
  size_t total;
};

// Totals of 1 byte, less than a slot, exactly k slots, k slots +- 1, many slots.
std::vector<Layout> Layouts() {
  std::vector<Layout> out;
  for (size_t slots : {1, 2, 3, 4}) {
    for (size_t slot_bytes : {1, 7, 64}) {
      for (size_t total : {size_t{1}, slot_bytes / 2 + 1, slot_bytes, slot_bytes + 1,
                           slots * slot_bytes, slots * slot_bytes + 1,
                           slots * slot_bytes - 1, 3 * slots * slot_bytes + 5}) {
        if (total > 0) out.push_back({slots, slot_bytes, total});
      }
    }
  }
  return out;
}

std::string Describe(const Layout& l, uint32_t seed) {
  return absl::StrCat(l.slots, " slots of ", l.slot_bytes, " bytes, ", l.total,
                      " bytes, seed ", seed);
}

void ExpectClean(const FakeEngine& engine, const std::string& what) {
  EXPECT_THAT(engine.violations(), ::testing::IsEmpty()) << what;
  EXPECT_LE(engine.max_in_flight(), engine.num_slots()) << what;
}

TEST(StagedCopyTest, ToDeviceMatchesSourceForRandomPieceLayouts) {
  std::mt19937 rng(1);
  for (const Layout& l : Layouts()) {
    for (uint32_t seed = 0; seed < 8; ++seed) {
      const std::string what = Describe(l, seed);
      FakeEngine engine(l.slots, l.slot_bytes, seed);
      const std::vector<std::byte> src = RandomBytes(l.total, rng);
      const auto pieces = RandomPieces(src, l.slot_bytes, rng);
      std::vector<std::byte> device(l.total + 3, kPoison);
      ASSERT_THAT(StagedCopyToDevice(engine, pieces, device.data() + 1), IsOk()) << what;
      engine.Drain();
      EXPECT_TRUE(std::equal(src.begin(), src.end(), device.begin() + 1)) << what;
      // Nothing outside [dst, dst + total) is written.
      EXPECT_EQ(device.front(), kPoison) << what;
      EXPECT_EQ(device[l.total + 1], kPoison) << what;
      EXPECT_EQ(engine.copies(), (l.total + l.slot_bytes - 1) / l.slot_bytes) << what;
      ExpectClean(engine, what);
    }
  }
}

TEST(StagedCopyTest, ToHostMatchesSource) {
  std::mt19937 rng(2);
  for (const Layout& l : Layouts()) {
    for (uint32_t seed = 0; seed < 8; ++seed) {
      const std::string what = Describe(l, seed);
      FakeEngine engine(l.slots, l.slot_bytes, seed);
      const std::vector<std::byte> device = RandomBytes(l.total, rng);
      std::vector<std::byte> host(l.total + 2, kPoison);
      ASSERT_THAT(StagedCopyToHost(engine, device.data(), l.total, host.data() + 1), IsOk())
          << what;
      EXPECT_EQ(engine.in_flight(), 0u) << what << ": returned with copies in flight";
      EXPECT_TRUE(std::equal(device.begin(), device.end(), host.begin() + 1)) << what;
      EXPECT_EQ(host.front(), kPoison) << what;
      EXPECT_EQ(host.back(), kPoison) << what;
      ExpectClean(engine, what);
    }
  }
}

TEST(StagedCopyTest, KeepsSeveralCopiesInFlight) {
  // On a device that completes nothing on its own, every slot is in use at once: the
  // pipeline fills the ring before it waits.
  FakeEngine engine(3, 16, 0, /*max_progress=*/0);
  std::mt19937 rng(3);
  const std::vector<std::byte> device = RandomBytes(16 * 10, rng);
  std::vector<std::byte> host(device.size());
  ASSERT_THAT(StagedCopyToHost(engine, device.data(), device.size(), host.data()), IsOk());
  EXPECT_EQ(host, device);
  EXPECT_EQ(engine.max_in_flight(), 3u);
  ExpectClean(engine, "3 slots, 10 chunks");
}

TEST(StagedCopyTest, BackToBackCopiesReuseSlotsOnlyOnceFree) {
  // The first copy returns with copies still in flight; the second must wait for them
  // before it refills their slots, and both land intact.
  std::mt19937 rng(4);
  FakeEngine engine(2, 8, 4, /*max_progress=*/0);
  const std::vector<std::byte> a = RandomBytes(8 * 5 + 3, rng), b = RandomBytes(8 * 4, rng);
  std::vector<std::byte> dev_a(a.size()), dev_b(b.size());
  const std::vector<std::span<const std::byte>> pa = {a}, pb = {b};
  ASSERT_THAT(StagedCopyToDevice(engine, pa, dev_a.data()), IsOk());
  ASSERT_THAT(StagedCopyToDevice(engine, pb, dev_b.data()), IsOk());
  std::vector<std::byte> back(a.size());
  ASSERT_THAT(StagedCopyToHost(engine, dev_a.data(), a.size(), back.data()), IsOk());
  engine.Drain();
  EXPECT_EQ(dev_a, a);
  EXPECT_EQ(dev_b, b);
  EXPECT_EQ(back, a);
  ExpectClean(engine, "back to back");
}

TEST(StagedCopyTest, NothingToCopyIssuesNothing) {
  FakeEngine engine(2, 8, 0);
  const std::vector<std::span<const std::byte>> empty_pieces = {{}, {}};
  EXPECT_THAT(StagedCopyToDevice(engine, empty_pieces, nullptr), IsOk());
  EXPECT_THAT(StagedCopyToDevice(engine, {}, nullptr), IsOk());
  EXPECT_THAT(StagedCopyToHost(engine, nullptr, 0, nullptr), IsOk());
  EXPECT_EQ(engine.copies(), 0u);
}

TEST(StagedCopyTest, AnEngineWithoutSlotsIsAnError) {
  FakeEngine engine(0, 8, 0);
  std::byte b{1};
  const std::vector<std::span<const std::byte>> pieces = {{&b, 1}};
  EXPECT_THAT(StagedCopyToDevice(engine, pieces, &b),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 slots")));
  EXPECT_THAT(StagedCopyToHost(engine, &b, 1, &b),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 slots")));
}

TEST(StagedCopyTest, AFailedCopyIsReturnedWithNothingLeftInFlight) {
  std::mt19937 rng(5);
  for (size_t fail_at : {0, 1, 2, 5}) {
    const std::vector<std::byte> src = RandomBytes(8 * 6, rng);
    std::vector<std::byte> dst(src.size());
    const std::vector<std::span<const std::byte>> pieces = {src};
    FakeEngine to_device(2, 8, 7);
    to_device.FailCopy(fail_at);
    EXPECT_THAT(StagedCopyToDevice(to_device, pieces, dst.data()),
                StatusIs(absl::StatusCode::kInternal, HasSubstr("fake copy failed")));
    EXPECT_EQ(to_device.in_flight(), 0u) << "fail at " << fail_at;
    FakeEngine to_host(2, 8, 7);
    to_host.FailCopy(fail_at);
    EXPECT_THAT(StagedCopyToHost(to_host, src.data(), src.size(), dst.data()),
                StatusIs(absl::StatusCode::kInternal, HasSubstr("fake copy failed")));
    EXPECT_EQ(to_host.in_flight(), 0u) << "fail at " << fail_at;
  }
}

// The fake must catch a pipeline that forgets to wait: otherwise the tests above prove
// nothing. This one gathers into a slot and issues without waiting for the slot.
TEST(StagedCopyTest, TheFakeCatchesASlotReusedBeforeItsCopyCompleted) {
  FakeEngine engine(2, 4, 0, /*max_progress=*/0);
  std::mt19937 rng(6);
  const std::vector<std::byte> src = RandomBytes(4 * 8, rng);
  std::vector<std::byte> dst(src.size());
  for (size_t c = 0; c < 8; ++c) {
    std::memcpy(engine.slot(c % 2), src.data() + 4 * c, 4);
    ASSERT_THAT(engine.CopySlotToDevice(c % 2, dst.data() + 4 * c, 4), IsOk());
  }
  engine.Drain();
  // Touching, rewriting and reissuing busy slots, and more copies in flight than slots.
  EXPECT_THAT(engine.violations(), ::testing::Not(::testing::IsEmpty()));
  EXPECT_GT(engine.max_in_flight(), engine.num_slots());
  EXPECT_NE(dst, src);
}

}  // namespace
}  // namespace pipetrain::compute
