// TensorBoard event files for a job's steps: TFRecord framing around Event messages
// with scalar Summaries, the format TensorBoard and W&B's sync_tensorboard read.
// The protobuf wire format is hand-encoded (five fields; no .proto, no generated code).
#ifndef PIPETRAIN_COORDINATOR_TENSORBOARD_WRITER_H_
#define PIPETRAIN_COORDINATOR_TENSORBOARD_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses.
uint32_t Crc32c(std::string_view data);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t MaskedCrc32c(std::string_view data);
// One TFRecord: uint64 length (little-endian), masked CRC of those 8 bytes, the data,
// masked CRC of the data.
std::string TfRecordFrame(std::string_view data);

struct TensorBoardScalar {
  std::string tag;
  float value = 0;
};

// Serialized Event messages: {wall_time=1, file_version=3 "brain.Event:2"}, the first
// record of every file; and {wall_time=1, step=2, summary=5 {value=1 {tag=1,
// simple_value=2}...}}.
std::string VersionEvent(double wall_time);
std::string ScalarsEvent(double wall_time, int64_t step,
                         const std::vector<TensorBoardScalar>& scalars);

// The scalars of one step record: train/loss, val/loss (only with has_val_loss),
// perf/tokens_per_s, pipeline/bubble_measured, pipeline/bubble_predicted, train/lr,
// train/grad_norm, and stage_S/peak_memory_bytes per stage record.
std::vector<TensorBoardScalar> StepScalars(const pipetrain::v1::StepRecord& record);

// The name TensorBoard gives its files: events.out.tfevents.<unix seconds>.<host>.
std::string EventFileName(absl::Time now, std::string_view host);

// Appends a job's steps to one event file; flushed after every step, so a crash loses
// at most the step being written. Not thread-safe (one job's steps come in order).
class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and a new file in it named by EventFileName (with
  // ".N" added when a file of that name exists: a run restarted within the same second
  // still gets its own file), and writes the version record.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Open(const std::string& dir,
                                                                 absl::Time now);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event of the step's scalars, written and flushed.
  absl::Status WriteStep(const pipetrain::v1::StepRecord& record, absl::Time now);
  absl::Status WriteScalars(int64_t step, const std::vector<TensorBoardScalar>& scalars,
                            absl::Time now);

  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status Append(std::string_view event, std::string_view what);

  const std::string path_;
  std::FILE* file_;
};

// A job's event files as its driver uses them: the file is opened at a run's first
// step (a run that never steps leaves none) and NewRun makes the next step open a new
// one (a restarted or resumed run; TensorBoard merges a folder's files). It never fails
// the job: the first error goes to `warn` and nothing more is written for the job (a
// half-written record would leave what follows it unreadable).
class TensorBoardJobLog {
 public:
  TensorBoardJobLog(std::string dir, std::function<void(const absl::Status&)> warn)
      : dir_(std::move(dir)), warn_(std::move(warn)) {}

  void Step(const pipetrain::v1::StepRecord& record, absl::Time now);
  void NewRun() { writer_.reset(); }
  // The file being written ("" before a run's first step or after a failure).
  std::string path() const { return writer_ ? writer_->path() : ""; }

 private:
  const std::string dir_;
  const std::function<void(const absl::Status&)> warn_;
  std::unique_ptr<TensorBoardWriter> writer_;
  bool failed_ = false;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_COORDINATOR_TENSORBOARD_WRITER_H_
