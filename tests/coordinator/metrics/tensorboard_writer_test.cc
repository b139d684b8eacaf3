// The TensorBoard event writer against an independent reader (tests/testing/
// tfrecord_reader.h: its own CRC, its own wire-format decoding): CRC-32C's known
// vectors, a file read back record by record, a flipped byte caught, a second writer in
// the same folder getting its own file.
#include "coordinator/metrics/tensorboard_writer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"
#include "tests/testing/tfrecord_reader.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = pipetrain::v1;
using ::pipetrain::testing::BitwiseCrc32c;
using ::pipetrain::testing::ParseEventFile;
using ::pipetrain::testing::ReadEvent;
using ::pipetrain::testing::ReadEventFile;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().string());
  return out;
}

TEST(Crc32cTest, MatchesTheKnownVectors) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, and of 0xff.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  // The test reader's bit-by-bit CRC agrees on the same vectors (so it checks for real).
  EXPECT_EQ(BitwiseCrc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(BitwiseCrc32c(std::string(32, '\0')), 0x8A9136AAu);
  const std::string text = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(Crc32c(text), BitwiseCrc32c(text));
}

TEST(Crc32cTest, MasksAsTfRecordDoes) {
  const uint32_t crc = Crc32c("123456789");
  EXPECT_EQ(MaskedCrc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  EXPECT_NE(MaskedCrc32c("123456789"), crc);
}

pb::StepRecord Record(int64_t step, bool with_val) {
  pb::StepRecord r;
  r.set_step(step);
  r.set_loss(5.5 - 0.25 * static_cast<double>(step));
  if (with_val) {
    r.set_has_val_loss(true);
    r.set_val_loss(6.0 - 0.125 * static_cast<double>(step));
  }
  r.set_tokens_per_s(1234.5 * static_cast<double>(step));
  r.set_bubble_measured(0.3 + 0.01 * static_cast<double>(step));
  r.set_bubble_predicted(0.25);
  r.set_lr(0.001 * static_cast<double>(step));
  r.set_grad_norm(2.0 / static_cast<double>(step));
  for (int s = 0; s < 2; ++s) {
    pb::StageStepStats* st = r.add_stages();
    st->set_stage(s);
    st->set_peak_memory_bytes(1000000 + 4096 * static_cast<uint64_t>(s) + step);
  }
  return r;
}

TEST(TensorBoardWriterTest, AFileReadsBackAsTheVersionRecordThenEveryStepsScalars) {
  testing::TempDir dir;
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  auto writer = TensorBoardWriter::Open(dir.File("tb/job-000001"), t0);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_THAT((*writer)->path(),
              StartsWith(dir.File("tb/job-000001/events.out.tfevents.1700000000.")));
  std::vector<pb::StepRecord> records = {Record(1, false), Record(2, true), Record(3, false)};
  for (const pb::StepRecord& r : records) {
    ASSERT_TRUE((*writer)->WriteStep(r, t0 + absl::Seconds(r.step())).ok());
  }
  // Flushed after every step: the bytes are there while the writer is still open.
  absl::StatusOr<std::vector<ReadEvent>> events = ReadEventFile((*writer)->path());
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 4u);
  EXPECT_EQ((*events)[0].file_version, "brain.Event:2");
  EXPECT_FALSE((*events)[0].has_summary);
  EXPECT_DOUBLE_EQ((*events)[0].wall_time, 1700000000.0);
  for (size_t i = 0; i < records.size(); ++i) {
    const pb::StepRecord& r = records[i];
    const ReadEvent& e = (*events)[i + 1];
    SCOPED_TRACE(absl::StrCat("step ", r.step()));
    EXPECT_EQ(e.step, r.step());
    EXPECT_DOUBLE_EQ(e.wall_time, 1700000000.0 + static_cast<double>(r.step()));
    EXPECT_TRUE(e.file_version.empty());
    std::map<std::string, float> want = {
        {"train/loss", static_cast<float>(r.loss())},
        {"perf/tokens_per_s", static_cast<float>(r.tokens_per_s())},
        {"pipeline/bubble_measured", static_cast<float>(r.bubble_measured())},
        {"pipeline/bubble_predicted", static_cast<float>(r.bubble_predicted())},
        {"train/lr", static_cast<float>(r.lr())},
        {"train/grad_norm", static_cast<float>(r.grad_norm())},
        {"stage_0/peak_memory_bytes", static_cast<float>(r.stages(0).peak_memory_bytes())},
        {"stage_1/peak_memory_bytes", static_cast<float>(r.stages(1).peak_memory_bytes())}};
    if (r.has_val_loss()) want["val/loss"] = static_cast<float>(r.val_loss());
    EXPECT_EQ(e.scalars, want);
  }
}

TEST(TensorBoardWriterTest, TheReaderCatchesAFlippedByteAnywhere) {
  testing::TempDir dir;
  auto writer = TensorBoardWriter::Open(dir.path(), absl::Now());
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->WriteStep(Record(1, true), absl::Now()).ok());
  const std::string bytes = Slurp((*writer)->path());
  ASSERT_TRUE(ParseEventFile(bytes).ok());
  // Every byte matters: in a length, a CRC or the data, one flipped bit fails the read.
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    EXPECT_FALSE(ParseEventFile(bad).ok()) << "byte " << i << " of " << bytes.size();
  }
  EXPECT_THAT(std::string(ParseEventFile(bytes.substr(0, bytes.size() - 1)).status().message()),
              HasSubstr("record 1"));
}

TEST(TensorBoardWriterTest, ASecondRunInTheSameFolderGetsItsOwnFile) {
  testing::TempDir dir;
  const absl::Time t = absl::FromUnixSeconds(1700000000);
  auto first = TensorBoardWriter::Open(dir.path(), t);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->WriteStep(Record(1, false), t).ok());
  // Restarted within the same second: a new file, and the first is left as it was.
  auto second = TensorBoardWriter::Open(dir.path(), t);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*second)->WriteStep(Record(2, false), t).ok());
  EXPECT_NE((*first)->path(), (*second)->path());
  EXPECT_THAT((*second)->path(), HasSubstr("tfevents"));  // what TensorBoard globs for
  EXPECT_EQ(FilesIn(dir.path()).size(), 2u);
  auto a = ReadEventFile((*first)->path());
  auto b = ReadEventFile((*second)->path());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), 2u);
  ASSERT_EQ(b->size(), 2u);
  EXPECT_EQ((*a)[1].step, 1);
  EXPECT_EQ((*b)[0].file_version, "brain.Event:2");
  EXPECT_EQ((*b)[1].step, 2);
}

TEST(TensorBoardWriterTest, AFolderThatCannotBeMadeIsAnErrorNamingIt) {
  testing::TempDir dir;
  std::ofstream(dir.File("plain-file")) << "x";
  auto writer = TensorBoardWriter::Open(dir.File("plain-file/job-000001"), absl::Now());
  ASSERT_FALSE(writer.ok());
  EXPECT_THAT(std::string(writer.status().message()), HasSubstr("plain-file/job-000001"));
}

TEST(TensorBoardJobLogTest, OpensAFileAtARunsFirstStepAndANewOneForTheNextRun) {
  testing::TempDir dir;
  int warnings = 0;
  TensorBoardJobLog log(dir.File("job-000001"), [&](const absl::Status&) { ++warnings; });
  EXPECT_FALSE(std::filesystem::exists(dir.File("job-000001"))) << "no step, no file";
  const absl::Time t = absl::FromUnixSeconds(1700000000);
  log.Step(Record(1, false), t);
  log.Step(Record(2, true), t);
  const std::string first = log.path();
  log.NewRun();
  log.Step(Record(2, true), t);  // a restarted run repeats its step 2
  EXPECT_NE(log.path(), first);
  EXPECT_EQ(warnings, 0);
  auto a = ReadEventFile(first);
  auto b = ReadEventFile(log.path());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->size(), 3u);
  ASSERT_EQ(b->size(), 2u);
  EXPECT_EQ((*b)[1].step, 2);
}

TEST(TensorBoardJobLogTest, AFailureWarnsOnceNamingTheFolderAndWritesNothingMore) {
  testing::TempDir dir;
  std::ofstream(dir.File("plain-file")) << "x";
  std::vector<std::string> warnings;
  TensorBoardJobLog log(dir.File("plain-file/job-000001"),
                        [&](const absl::Status& s) { warnings.emplace_back(s.message()); });
  for (int step = 1; step <= 3; ++step) log.Step(Record(step, false), absl::Now());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("plain-file/job-000001"));
  EXPECT_EQ(log.path(), "");
}

}  // namespace
}  // namespace pipetrain::coordinator
