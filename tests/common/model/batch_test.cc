// Batches: the offsets of a text's rows are pinned to what they were before batches were
// drawn from any token stream (so loss curves and fixtures stay); a token stream of the
// same size gives its tokens at the same offsets; rows may span the files of a dataset.
#include "common/model/batch.h"

#include <numeric>
#include <string>
#include <vector>

#include "common/data/token_file.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"
#include "tests/testing/token_files.h"

namespace pipetrain::model {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int kT = 16;

TransformerConfig Config(int vocab) { return {vocab, kT, 32, 4, 2}; }

// The first token of every row.
std::vector<int64_t> RowStarts(const TokenBatch& b, int64_t minus = 0) {
  std::vector<int64_t> out;
  for (int r = 0; r < b.rows; ++r) out.push_back(b.inputs[r * kT] - minus);
  return out;
}

// Every row is stream[offset, offset + T + 1), inputs and targets shifted by one.
void ExpectRowsAt(const TokenBatch& b, const std::vector<int32_t>& stream,
                  const std::vector<int64_t>& offsets) {
  ASSERT_EQ(b.rows, static_cast<int>(offsets.size()));
  for (int r = 0; r < b.rows; ++r) {
    for (int t = 0; t < kT; ++t) {
      EXPECT_EQ(b.inputs[r * kT + t], stream[offsets[r] + t]) << "row " << r << " t " << t;
      EXPECT_EQ(b.targets[r * kT + t], stream[offsets[r] + t + 1]) << "row " << r << " t " << t;
    }
  }
}

struct Pinned {
  uint64_t seed;
  int step;
  std::vector<int64_t> offsets;
};

// Computed by SampleBatch(text, ...) as it was before streams (commit 60916d9), on the
// 256 bytes 0, 1, ..., 255, so that a row's first byte is its offset.
const std::vector<Pinned>& PinnedOffsets() {
  static const std::vector<Pinned> pinned = {
      {7, 3, {13, 144, 133, 52, 9, 207}},
      {7, 4, {100, 208, 21, 142, 40, 152}},
      {0, 0, {16, 225, 206, 236, 96, 180}},
      {12345, 100, {143, 179, 32, 54, 170, 33}},
  };
  return pinned;
}

std::string Bytes0To255() {
  std::string text(256, '\0');
  for (int i = 0; i < 256; ++i) text[i] = static_cast<char>(i);
  return text;
}

TEST(BatchTest, TextBatchesKeepTheirOffsets) {
  const std::string text = Bytes0To255();
  for (const Pinned& p : PinnedOffsets()) {
    auto b = SampleBatch(text, Config(256), 6, p.seed, p.step);
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ(RowStarts(*b), p.offsets) << "seed " << p.seed << " step " << p.step;
  }
  // A longer text (100000 bytes), offsets of seed 7 step 3 as they were.
  std::string big(100000, '\0');
  std::vector<int32_t> stream(big.size());
  for (size_t i = 0; i < big.size(); ++i) {
    big[i] = static_cast<char>((i * 2654435761u) >> 24);
    stream[i] = static_cast<unsigned char>(big[i]);
  }
  auto b = SampleBatch(big, Config(256), 4, 7, 3);
  ASSERT_THAT(b, IsOk());
  ExpectRowsAt(*b, stream, {96445, 92736, 73093, 13684});
}

// Any stream of the same size gives its own tokens at the text's offsets.
TEST(BatchTest, AStreamOfTheSameSizeGivesItsTokensAtTheSameOffsets) {
  std::vector<int32_t> stream(256);
  std::iota(stream.begin(), stream.end(), 500);  // ids 500..755
  auto copy = [&](int64_t start, int64_t n, int32_t* out) {
    std::copy(stream.begin() + start, stream.begin() + start + n, out);
  };
  for (const Pinned& p : PinnedOffsets()) {
    auto b = SampleBatch(256, copy, Config(1000), 6, p.seed, p.step);
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ(RowStarts(*b, 500), p.offsets) << "seed " << p.seed << " step " << p.step;
    ExpectRowsAt(*b, stream, p.offsets);
  }
  auto lead = LeadingBatch(256, copy, Config(1000), 3);
  ASSERT_THAT(lead, IsOk());
  ExpectRowsAt(*lead, stream, {0, 17, 34});
}

TEST(BatchTest, StreamErrors) {
  std::vector<int32_t> stream(40, 3);
  stream[21] = 700;
  auto copy = [&](int64_t start, int64_t n, int32_t* out) {
    std::copy(stream.begin() + start, stream.begin() + start + n, out);
  };
  EXPECT_THAT(SampleBatch(16, copy, Config(512), 1, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stream has 16 tokens; need at least 17")));
  EXPECT_THAT(LeadingBatch(40, copy, Config(512), 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stream token 21 = 700 is outside the vocabulary (512)")));
  EXPECT_THAT(LeadingBatch(40, copy, Config(512), 3),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("need at least 51")));
}

// Each replica's share is the next B / R rows of the global batch: concatenated in replica
// order the shares are the batch itself, row for row, inputs and targets, for every R.
TEST(BatchTest, ReplicaSharesAreDisjointInOrderAndCoverTheBatch) {
  const std::string text = Bytes0To255();
  auto batch = SampleBatch(text, Config(256), 12, 7, 3);
  ASSERT_THAT(batch, IsOk());
  for (int replicas : {1, 2, 3, 4, 6, 12}) {
    std::vector<int32_t> inputs, targets;
    for (int r = 0; r < replicas; ++r) {
      auto share = ReplicaRows(*batch, r, replicas);
      ASSERT_THAT(share, IsOk()) << r << " of " << replicas;
      ASSERT_EQ(share->rows, 12 / replicas);
      ASSERT_EQ(share->inputs.size(), static_cast<size_t>(share->rows) * kT);
      // Its rows are the batch's rows [r * B / R, (r + 1) * B / R), in order.
      for (int row = 0; row < share->rows; ++row) {
        EXPECT_EQ(share->inputs[row * kT], batch->inputs[(r * share->rows + row) * kT])
            << "replica " << r << " of " << replicas << " row " << row;
      }
      inputs.insert(inputs.end(), share->inputs.begin(), share->inputs.end());
      targets.insert(targets.end(), share->targets.begin(), share->targets.end());
    }
    EXPECT_THAT(inputs, ElementsAreArray(batch->inputs)) << replicas << " replicas";
    EXPECT_THAT(targets, ElementsAreArray(batch->targets)) << replicas << " replicas";
  }
  // A replica's rows follow from (seed, step): the same share of the same step's batch.
  auto again = SampleBatch(text, Config(256), 12, 7, 3);
  ASSERT_THAT(again, IsOk());
  EXPECT_THAT(ReplicaRows(*again, 1, 3)->inputs,
              ElementsAreArray(ReplicaRows(*batch, 1, 3)->inputs));
  auto other = SampleBatch(text, Config(256), 12, 7, 4);
  ASSERT_THAT(other, IsOk());
  EXPECT_NE(RowStarts(*ReplicaRows(*other, 1, 3)), RowStarts(*ReplicaRows(*batch, 1, 3)));
}

TEST(BatchTest, ABadReplicaSplitNamesTheCounts) {
  auto batch = SampleBatch(Bytes0To255(), Config(256), 12, 7, 3);
  ASSERT_THAT(batch, IsOk());
  EXPECT_THAT(ReplicaRows(*batch, 0, 5),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a batch of 12 rows does not split into 5 equal replica shares")));
  EXPECT_THAT(ReplicaRows(*batch, 0, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("replicas must be >= 1 (got 0)")));
  EXPECT_THAT(ReplicaRows(*batch, 4, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("replica 4 is outside [0, 4)")));
  TokenBatch torn = *batch;
  torn.targets.pop_back();
  EXPECT_THAT(ReplicaRows(torn, 0, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("12 rows hold")));
}

// The 256-token stream cut into files of 10, 0, 100 and 146 tokens: the same batches as
// the stream in one piece, and the row at 100 spans the boundary at 110.
TEST(BatchTest, RowsSpanTheFilesOfADataset) {
  std::vector<int32_t> stream(256);
  std::iota(stream.begin(), stream.end(), 500);
  testing::TempDir dir;
  std::vector<std::string> paths;
  size_t at = 0;
  for (size_t size : {10, 0, 100, 146}) {
    paths.push_back(dir.File("part_" + std::to_string(paths.size()) + ".bin"));
    testing::WriteFileOrDie(paths.back(),
                            testing::LlmcBytes({stream.begin() + at, stream.begin() + at + size}));
    at += size;
  }
  auto d = data::TokenDataset::Open(paths, data::TokenFormat::kLlmc);
  ASSERT_THAT(d, IsOk());
  ASSERT_EQ(d->size(), 256);
  auto copy = [&](int64_t start, int64_t n, int32_t* out) { d->CopyTokens(start, n, out); };
  const Pinned& p = PinnedOffsets()[1];
  ASSERT_EQ(p.offsets[0], 100);  // [100, 117) holds tokens of parts 2 and 3
  auto b = SampleBatch(d->size(), copy, Config(1000), 6, p.seed, p.step);
  ASSERT_THAT(b, IsOk());
  ExpectRowsAt(*b, stream, p.offsets);
}

}  // namespace
}  // namespace pipetrain::model
