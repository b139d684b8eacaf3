// SnapshotStore: one job's blobs, the two newest steps per (owner, chunk, held), a job
// check on every call, byte accounting; SnapshotAssembler: a pushed blob counts only
// once every piece arrived in order. Also hammers the store from several threads.
#include "stage_server/snapshots/snapshot_store.h"

#include <thread>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

SnapshotMeta Meta(int owner, int chunk, int64_t step, bool held) {
  SnapshotMeta m;
  m.owner_stage = owner;
  m.chunk = chunk;
  m.step = step;
  m.held = held;
  m.begin_layer = owner * 2;
  m.end_layer = owner * 2 + 2;
  m.num_stages = 3;
  return m;
}

std::shared_ptr<const std::string> Blob(const std::string& s) {
  return std::make_shared<const std::string>(s);
}

std::vector<int64_t> Steps(const SnapshotStore& store, const std::string& job, int owner,
                           bool held) {
  std::vector<int64_t> steps;
  auto list = store.List(job);
  EXPECT_THAT(list.status(), IsOk());
  for (const SnapshotMeta& m : *list) {
    if (m.owner_stage == owner && m.held == held) steps.push_back(m.step);
  }
  return steps;
}

TEST(SnapshotStoreTest, KeepsTheTwoNewestStepsPerOwnerChunkAndHeld) {
  SnapshotStore store;
  store.Reset("job");
  for (int64_t step = 1; step <= 4; ++step) {
    ASSERT_THAT(store.Put("job", Meta(1, 0, step, false), Blob(std::string(10 * step, 'o'))), IsOk());
    if (step <= 2) {
      ASSERT_THAT(store.Put("job", Meta(0, 0, step, true), Blob(std::string(step, 'h'))), IsOk());
    }
  }
  EXPECT_THAT(Steps(store, "job", 1, false), ElementsAre(3, 4));
  EXPECT_THAT(Steps(store, "job", 0, true), ElementsAre(1, 2)) << "held copies age on their own";
  EXPECT_EQ(store.bytes(), 30u + 40u + 1u + 2u);
  EXPECT_EQ(store.NewestOwnStep(), 4);
  EXPECT_THAT(store.Get("job", 1, 0, 2).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("steps 3, 4")));
  auto blob = store.Get("job", 0, 0, 2);
  ASSERT_THAT(blob.status(), IsOk());
  EXPECT_EQ(**blob, "hh");

  // The list carries each blob's size and layout.
  auto list = store.List("job");
  ASSERT_THAT(list.status(), IsOk());
  ASSERT_EQ(list->size(), 4u);
  SnapshotMeta want = Meta(0, 0, 1, true);
  want.bytes = 1;
  EXPECT_EQ((*list)[0], want);
}

TEST(SnapshotStoreTest, ReplacesTheSameStepAndRefusesOneOlderThanBothKept) {
  SnapshotStore store;
  store.Reset("job");
  ASSERT_THAT(store.Put("job", Meta(0, 1, 5, false), Blob("aaaa")), IsOk());
  ASSERT_THAT(store.Put("job", Meta(0, 1, 5, false), Blob("bb")), IsOk());
  EXPECT_EQ(store.bytes(), 2u) << "the replaced blob no longer counts";
  ASSERT_THAT(store.Put("job", Meta(0, 1, 7, false), Blob("c")), IsOk());
  // An older step still fits while fewer than two are kept... but not once two are.
  EXPECT_THAT(store.Put("job", Meta(0, 1, 3, false), Blob("old")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("job 'job' stage 0 step 3 chunk 1: older than the 2 steps kept (5 and 7)")));
  EXPECT_THAT(Steps(store, "job", 0, false), ElementsAre(5, 7));
  // Between the two is newer than the oldest: it replaces it.
  ASSERT_THAT(store.Put("job", Meta(0, 1, 6, false), Blob("dd")), IsOk());
  EXPECT_THAT(Steps(store, "job", 0, false), ElementsAre(6, 7));
  EXPECT_EQ(store.bytes(), 3u);
}

TEST(SnapshotStoreTest, AnswersOnlyForItsJobAndResetDropsEverything) {
  SnapshotStore store;
  EXPECT_THAT(store.List("a").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("holds snapshots of no job")));
  EXPECT_THAT(store.Put("a", Meta(0, 0, 1, false), Blob("x")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("job 'a'")));
  store.Reset("a");
  ASSERT_THAT(store.Put("a", Meta(0, 0, 1, false), Blob("x")), IsOk());
  EXPECT_THAT(store.Get("b", 0, 0, 1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("fetch snapshot of job 'b' stage 0 step 1 chunk 0: this stage "
                                 "holds snapshots of job 'a'")));
  EXPECT_THAT(store.Put("b", Meta(0, 0, 2, false), Blob("y")),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  store.Reset("a");  // the same job again: its old snapshots go too
  EXPECT_EQ(store.bytes(), 0u);
  EXPECT_EQ(store.NewestOwnStep(), std::nullopt);
  auto list = store.List("a");
  ASSERT_THAT(list.status(), IsOk());
  EXPECT_TRUE(list->empty());
}

TEST(SnapshotStoreTest, ConcurrentPutsAndListsStayConsistent) {
  SnapshotStore store;
  store.Reset("job");
  std::vector<std::thread> threads;
  for (int owner = 0; owner < 4; ++owner) {
    threads.emplace_back([&, owner] {
      for (int64_t step = 1; step <= 200; ++step) {
        EXPECT_THAT(store.Put("job", Meta(owner, 0, step, owner % 2 == 1), Blob(std::string(step, 'x'))),
                    IsOk());
        EXPECT_THAT(store.List("job").status(), IsOk());
      }
    });
  }
  for (auto& t : threads) t.join();
  auto list = store.List("job");
  ASSERT_THAT(list.status(), IsOk());
  ASSERT_EQ(list->size(), 8u);
  uint64_t sum = 0;
  for (const SnapshotMeta& m : *list) {
    EXPECT_GE(m.step, 199);
    sum += m.bytes;
  }
  EXPECT_EQ(store.bytes(), sum);
  EXPECT_EQ(store.NewestOwnStep(), 200);
}

TEST(SnapshotAssemblerTest, ABlobIsCompleteOnlyWithEveryPieceInOrder) {
  SnapshotMeta meta = Meta(2, 0, 9, true);
  meta.bytes = 6;
  SnapshotAssembler whole(100);
  ASSERT_THAT(whole.Add("job", meta, 0, "abc"), IsOk());
  ASSERT_THAT(whole.Add("job", meta, 3, "def"), IsOk());
  auto blob = whole.Finish();
  ASSERT_THAT(blob.status(), IsOk());
  EXPECT_EQ(**blob, "abcdef");

  SnapshotAssembler half(100);
  ASSERT_THAT(half.Add("job", meta, 0, "abc"), IsOk());
  EXPECT_THAT(half.Finish().status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job 'job' stage 2 step 9 chunk 0: the stream ended after 3 of 6 bytes")));

  SnapshotAssembler gap(100);
  ASSERT_THAT(gap.Add("job", meta, 0, "ab"), IsOk());
  EXPECT_THAT(gap.Add("job", meta, 3, "def"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expected offset 2 of 6")));
  SnapshotAssembler other(100);
  ASSERT_THAT(other.Add("job", meta, 0, "ab"), IsOk());
  SnapshotMeta changed = meta;
  changed.step = 10;
  EXPECT_THAT(other.Add("job", changed, 2, "cd"), StatusIs(absl::StatusCode::kInvalidArgument));
  SnapshotAssembler overlong(100);
  EXPECT_THAT(overlong.Add("job", meta, 0, "abcdefg"), StatusIs(absl::StatusCode::kInvalidArgument));
  SnapshotAssembler small(5);
  EXPECT_THAT(small.Add("job", meta, 0, "a"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("info.bytes 6")));
  SnapshotAssembler empty(100);
  EXPECT_THAT(empty.Finish().status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pipetrain::stage_server
