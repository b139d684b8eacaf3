#include "common/tensor_codec.h"

#include <cstring>
#include <random>

#include "common/buffer_pool.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

FrameTag Tag(uint32_t mb = 2) { return {"job-7", 3, mb, 0, TensorKind::kActivation}; }

Tensor RandomTensor(DType dtype, std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor t = *Tensor::Create(dtype, std::move(shape));
  for (std::byte& b : t.bytes()) b = static_cast<std::byte>(rng() & 0xff);
  return t;
}

// Feeds every frame of `enc`; expects the tensor to complete on the last frame only.
ReceivedTensor FeedAll(const TensorEncoder& enc, TensorReassembler& re) {
  std::optional<ReceivedTensor> out;
  for (size_t i = 0; i < enc.num_frames(); ++i) {
    FrameView f = enc.frame(i);
    auto r = re.Accept(f.header, f.payload);
    EXPECT_THAT(r, IsOk());
    if (!r.ok()) return {};
    EXPECT_EQ(r->has_value(), i + 1 == enc.num_frames()) << "frame " << i;
    if (r->has_value()) out = std::move(**r);
  }
  EXPECT_TRUE(out.has_value());
  return out ? std::move(*out) : ReceivedTensor{};
}

TEST(TensorCodecTest, RoundTripsRandomShapesAndFrameSizes) {
  std::mt19937 rng(42);
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kI32, DType::kU8, DType::kI64};
  BufferPool pool;
  TensorReassembler re({}, &pool);
  for (int trial = 0; trial < 200; ++trial) {
    const DType dtype = dtypes[rng() % std::size(dtypes)];
    std::vector<int64_t> shape;
    const int rank = 1 + rng() % 4;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + rng() % 13);
    Tensor src = RandomTensor(dtype, shape, rng);
    // 1 byte, sizes that do not divide the tensor, exactly its size, larger than it.
    const size_t choices[] = {1, 3, 7, 64, 1000, src.num_bytes(), src.num_bytes() + 5};
    const size_t frame_bytes = choices[rng() % std::size(choices)];
    FrameTag tag = Tag(trial);
    auto enc = TensorEncoder::Create(tag, src, frame_bytes);
    ASSERT_THAT(enc, IsOk());
    EXPECT_EQ(enc->num_frames(), (src.num_bytes() + frame_bytes - 1) / frame_bytes);
    ReceivedTensor got = FeedAll(*enc, re);
    EXPECT_EQ(got.tag, tag);
    EXPECT_EQ(got.tensor.dtype(), dtype);
    EXPECT_EQ(got.tensor.shape(), shape);
    ASSERT_EQ(got.tensor.num_bytes(), src.num_bytes());
    EXPECT_EQ(std::memcmp(got.tensor.bytes().data(), src.bytes().data(), src.num_bytes()), 0)
        << "trial " << trial << " frame_bytes " << frame_bytes;
    pool.Release(got.tensor.ReleaseBuffer());
    EXPECT_FALSE(re.in_progress());
  }
  EXPECT_GT(pool.hits(), 0u) << "reassembly should reuse pooled buffers";
  EXPECT_THAT(re.Finish(), IsOk());
}

// A holder that counts how many of its kind are alive.
struct CountedHolder {
  explicit CountedHolder(int* alive) : alive(alive) { ++*alive; }
  ~CountedHolder() { --*alive; }
  int* alive;
};

TEST(TensorCodecTest, AcceptPiecesKeepsPayloadsWhereTheyAre) {
  std::mt19937 rng(43);
  TensorReassembler re;
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<int64_t> shape = {1 + static_cast<int64_t>(rng() % 9),
                                  1 + static_cast<int64_t>(rng() % 17)};
    Tensor src = RandomTensor(DType::kF32, shape, rng);
    const size_t frame_bytes = 1 + rng() % (src.num_bytes() + 3);
    auto enc = TensorEncoder::Create(Tag(trial), src, frame_bytes);
    ASSERT_THAT(enc, IsOk());
    int alive = 0;
    std::optional<ReceivedPieces> out;
    std::vector<const std::byte*> starts;  // where each frame's payload lies
    for (size_t i = 0; i < enc->num_frames(); ++i) {
      FrameView f = enc->frame(i);
      // Each frame's payload split further into two pieces, as network slices are.
      const size_t cut = f.payload.size() / 2;
      const std::span<const std::byte> pieces[] = {f.payload.first(cut),
                                                   f.payload.subspan(cut)};
      starts.push_back(f.payload.data());
      auto r = re.AcceptPieces(f.header, pieces, std::make_shared<CountedHolder>(&alive));
      ASSERT_THAT(r, IsOk());
      ASSERT_EQ(r->has_value(), i + 1 == enc->num_frames()) << "frame " << i;
      if (r->has_value()) out = std::move(**r);
    }
    ASSERT_TRUE(out.has_value());
    EXPECT_EQ(out->tag, Tag(trial));
    EXPECT_EQ(out->tensor.dtype(), DType::kF32);
    EXPECT_EQ(out->tensor.shape(), shape);
    EXPECT_EQ(alive, static_cast<int>(enc->num_frames())) << "the tensor keeps every holder";
    // Zero copy: the pieces are the frames' own bytes, in order (empty halves dropped).
    ASSERT_GE(out->tensor.pieces().size(), enc->num_frames());
    EXPECT_EQ(out->tensor.pieces().front().data(), starts.front());
    std::vector<std::byte> gathered(out->tensor.num_bytes());
    out->tensor.CopyTo(gathered);
    EXPECT_EQ(std::memcmp(gathered.data(), src.bytes().data(), src.num_bytes()), 0)
        << "trial " << trial;
    out.reset();
    EXPECT_EQ(alive, 0) << "dropping the tensor releases the network buffers";
  }
}

TEST(TensorCodecTest, AcceptPiecesChecksLikeAccept) {
  std::mt19937 rng(44);
  Tensor src = RandomTensor(DType::kF32, {4, 4}, rng);
  auto enc = TensorEncoder::Create(Tag(), src, 32);
  ASSERT_THAT(enc, IsOk());
  TensorReassembler re;
  int alive = 0;
  FrameView first = enc->frame(0), second = enc->frame(1);
  const std::span<const std::byte> p1[] = {first.payload}, p2[] = {second.payload};
  ASSERT_THAT(re.AcceptPieces(first.header, p1, std::make_shared<CountedHolder>(&alive)),
              IsOk());
  EXPECT_EQ(alive, 1);
  FrameHeader bad = second.header;
  bad.shape = {2, 8};
  EXPECT_THAT(re.AcceptPieces(bad, p2, std::make_shared<CountedHolder>(&alive)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape changed")));
  EXPECT_EQ(alive, 0) << "a rejected tensor lets its buffers go";
  EXPECT_FALSE(re.in_progress());
  // A stream must not mix the two modes within one tensor.
  ASSERT_THAT(re.Accept(first.header, first.payload), IsOk());
  EXPECT_THAT(re.AcceptPieces(second.header, p2, nullptr),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("mixed")));
}

TEST(TensorCodecTest, EncoderMakesViewsWithoutCopying) {
  std::mt19937 rng(1);
  Tensor src = RandomTensor(DType::kF32, {10, 10}, rng);
  auto enc = TensorEncoder::Create(Tag(), src, 64);
  ASSERT_THAT(enc, IsOk());
  ASSERT_EQ(enc->num_frames(), 7u);  // 400 bytes / 64
  for (size_t i = 0; i < enc->num_frames(); ++i) {
    FrameView f = enc->frame(i);
    EXPECT_EQ(f.payload.data(), src.bytes().data() + i * 64);
    EXPECT_EQ(f.header.offset, i * 64);
    EXPECT_EQ(f.header.total_bytes, 400u);
  }
  EXPECT_EQ(enc->frame(6).payload.size(), 16u);
}

TEST(TensorCodecTest, EmptyTensorTravelsAsOneEmptyFrame) {
  Tensor src = *Tensor::Create(DType::kF32, {0, 8});
  auto enc = TensorEncoder::Create(Tag(), src, 16);
  ASSERT_THAT(enc, IsOk());
  ASSERT_EQ(enc->num_frames(), 1u);
  TensorReassembler re;
  ReceivedTensor got = FeedAll(*enc, re);
  EXPECT_EQ(got.tensor.shape(), (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(got.tensor.num_bytes(), 0u);
}

TEST(TensorCodecTest, SeveralTensorsBackToBack) {
  std::mt19937 rng(5);
  TensorReassembler re;
  for (uint32_t mb = 0; mb < 4; ++mb) {
    Tensor src = RandomTensor(DType::kF32, {3, 5}, rng);
    auto enc = TensorEncoder::Create(Tag(mb), src, 7);
    ReceivedTensor got = FeedAll(*enc, re);
    EXPECT_EQ(got.tag.micro_batch, mb);
    EXPECT_EQ(std::memcmp(got.tensor.bytes().data(), src.bytes().data(), 60), 0);
  }
}

TEST(TensorCodecTest, EncoderRejectsMismatchedData) {
  std::vector<std::byte> data(10);
  EXPECT_THAT(TensorEncoder::Create(Tag(), DType::kF32, {3}, data),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 12 bytes")));
  EXPECT_THAT(TensorEncoder::Create(Tag(), DType::kUnspecified, {10}, data),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
  EXPECT_THAT(TensorEncoder::Create(Tag(), DType::kU8, {10}, data, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("frame_bytes")));
}

// A valid two-frame tensor to break in each test below: f32 (4, 4) = 64 bytes.
class RejectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    payload_.resize(64);
    for (size_t i = 0; i < payload_.size(); ++i) payload_[i] = static_cast<std::byte>(i);
    first_ = Valid(0);
    second_ = Valid(32);
  }
  static FrameHeader Valid(uint64_t offset) {
    FrameHeader h;
    h.tag = Tag();
    h.dtype = static_cast<int>(DType::kF32);
    h.shape = {4, 4};
    h.offset = offset;
    h.total_bytes = 64;
    return h;
  }
  std::span<const std::byte> Part(size_t begin, size_t n) {
    return std::span<const std::byte>(payload_).subspan(begin, n);
  }
  // The first half, accepted.
  void AcceptFirstHalf() {
    auto r = re_.Accept(first_, Part(0, 32));
    ASSERT_THAT(r, IsOk());
    ASSERT_FALSE(r->has_value());
  }
  // After any rejection the reassembler takes a fresh, valid tensor.
  void ExpectRecovers() {
    EXPECT_FALSE(re_.in_progress());
    auto r = re_.Accept(Valid(0), Part(0, 32));
    ASSERT_THAT(r, IsOk());
    auto r2 = re_.Accept(Valid(32), Part(32, 32));
    ASSERT_THAT(r2, IsOk());
    ASSERT_TRUE(r2->has_value());
    EXPECT_EQ(std::memcmp((*r2)->tensor.bytes().data(), payload_.data(), 64), 0);
  }

  std::vector<std::byte> payload_;
  FrameHeader first_, second_;
  TensorReassembler re_{ReassemblerOptions{/*max_tensor_bytes=*/1 << 20,
                                           /*max_frame_bytes=*/1 << 16}};
};

TEST_F(RejectionTest, UnknownDtype) {
  first_.dtype = 0;
  EXPECT_THAT(re_.Accept(first_, Part(0, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("dtype 0"), HasSubstr("micro-batch 2"))));
  first_.dtype = 42;
  EXPECT_THAT(re_.Accept(first_, Part(0, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype 42")));
  first_.dtype = static_cast<int>(DType::kF32);
  ExpectRecovers();
}

TEST_F(RejectionTest, DtypeChangingMidTensor) {
  AcceptFirstHalf();
  second_.dtype = static_cast<int>(DType::kI32);
  EXPECT_THAT(re_.Accept(second_, Part(32, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype changed")));
  ExpectRecovers();
}

TEST_F(RejectionTest, ShapeWhoseSizeDoesNotMatch) {
  first_.shape = {4, 5};
  EXPECT_THAT(re_.Accept(first_, Part(0, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("shape (4, 5)"), HasSubstr("total_bytes is 64"))));
  first_.shape = {-4, -4};
  EXPECT_THAT(re_.Accept(first_, Part(0, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  first_.shape = {4, 4};
  ExpectRecovers();
}

TEST_F(RejectionTest, ShapeChangingMidTensor) {
  AcceptFirstHalf();
  second_.shape = {2, 8};
  EXPECT_THAT(re_.Accept(second_, Part(32, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape changed")));
  ExpectRecovers();
}

TEST_F(RejectionTest, OverlappingOffset) {
  AcceptFirstHalf();
  second_.offset = 16;
  EXPECT_THAT(re_.Accept(second_, Part(16, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("offset 16 overlaps"), HasSubstr("expected offset 32"))));
  ExpectRecovers();
}

TEST_F(RejectionTest, OffsetLeavingAHole) {
  AcceptFirstHalf();
  second_.offset = 40;
  EXPECT_THAT(re_.Accept(second_, Part(40, 24)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("offset 40 leaves a hole")));
  ExpectRecovers();
}

TEST_F(RejectionTest, FirstFrameNotAtOffsetZero) {
  EXPECT_THAT(re_.Accept(second_, Part(32, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("offset 32 leaves a hole")));
  ExpectRecovers();
}

TEST_F(RejectionTest, TotalChangingMidTensor) {
  AcceptFirstHalf();
  second_.total_bytes = 128;
  second_.shape = {4, 8};
  EXPECT_THAT(re_.Accept(second_, Part(32, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("changed mid-tensor")));
  second_.shape = {4, 4};
  AcceptFirstHalf();
  EXPECT_THAT(re_.Accept(second_, Part(32, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("total_bytes changed mid-tensor from 64 to 128")));
  second_.total_bytes = 64;
  ExpectRecovers();
}

TEST_F(RejectionTest, MoreBytesThanAnnounced) {
  std::vector<std::byte> big(100);
  EXPECT_THAT(re_.Accept(first_, big),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more bytes than announced")));
  AcceptFirstHalf();
  EXPECT_THAT(re_.Accept(second_, std::span<const std::byte>(big).first(40)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more bytes than announced")));
  ExpectRecovers();
}

TEST_F(RejectionTest, ForeignTagMidTensor) {
  AcceptFirstHalf();
  second_.tag.job_id = "other-job";
  EXPECT_THAT(re_.Accept(second_, Part(32, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id changed")));
  second_.tag = Tag();
  AcceptFirstHalf();
  second_.tag.step = 4;
  EXPECT_THAT(re_.Accept(second_, Part(32, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("step changed")));
  second_.tag = Tag();
  AcceptFirstHalf();
  second_.tag.micro_batch = 9;
  EXPECT_THAT(re_.Accept(second_, Part(32, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("micro_batch changed")));
  second_.tag = Tag();
  AcceptFirstHalf();
  second_.tag.kind = TensorKind::kGradient;
  EXPECT_THAT(re_.Accept(second_, Part(32, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kind changed")));
  second_.tag = Tag();
  ExpectRecovers();
}

TEST_F(RejectionTest, UnknownKind) {
  first_.tag.kind = TensorKind::kUnspecified;
  EXPECT_THAT(re_.Accept(first_, Part(0, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kind")));
  first_.tag = Tag();
  ExpectRecovers();
}

TEST_F(RejectionTest, EmptyFrameOfANonEmptyTensor) {
  EXPECT_THAT(re_.Accept(first_, std::span<const std::byte>()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("carries no payload")));
  ExpectRecovers();
}

TEST_F(RejectionTest, StreamEndingMidTensor) {
  EXPECT_THAT(re_.Finish(), IsOk());
  AcceptFirstHalf();
  EXPECT_THAT(re_.Finish(), StatusIs(absl::StatusCode::kDataLoss,
                                     AllOf(HasSubstr("ended mid-tensor after 32 of 64 bytes"),
                                           HasSubstr("job-7"))));
  ExpectRecovers();
}

TEST_F(RejectionTest, HugeAnnouncementRejectedBeforeAllocation) {
  // 1 TB announced: refused against the limit, and nothing of that size allocated
  // (were it allocated, this test would die of memory exhaustion).
  first_.shape = {int64_t{1} << 38};
  first_.total_bytes = uint64_t{1} << 40;
  EXPECT_THAT(re_.Accept(first_, Part(0, 32)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("total_bytes 1099511627776"), HasSubstr("limit"))));
  first_.shape = {4, 4};
  first_.total_bytes = 64;
  ExpectRecovers();
}

TEST_F(RejectionTest, ShapeProductOverflow) {
  first_.shape = {int64_t{1} << 40, int64_t{1} << 40};
  first_.total_bytes = 64;
  EXPECT_THAT(re_.Accept(first_, Part(0, 32)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too many elements")));
  first_.shape = {4, 4};
  ExpectRecovers();
}

TEST_F(RejectionTest, OversizedFrame) {
  TensorReassembler small({/*max_tensor_bytes=*/1 << 20, /*max_frame_bytes=*/16});
  EXPECT_THAT(small.Accept(first_, Part(0, 32)),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("per frame")));
  EXPECT_FALSE(small.in_progress());
}

}  // namespace
}  // namespace pipetrain::common
