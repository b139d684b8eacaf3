// How `pipetrain submit` shows a job it follows: a progress bar redrawn in place on a
// terminal, one plain line every ~5% of the steps (and the last) otherwise, log lines
// above the bar, and the summary when the job ends. StepRecord.step counts from 1.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::client {

// Running figures over the steps seen so far.
struct StepTotals {
  int64_t count = 0;
  int64_t last_step = 0;
  double last_loss = 0;
  bool has_val_loss = false;
  double last_val_loss = 0;
  int64_t val_step = 0;
  double time_s = 0;    // sum of step times
  double tokens = 0;    // sum of tokens_per_s * step_time_s
  double bubble_measured = 0;   // sums, for the means
  double bubble_predicted = 0;
  // The steps predicted from measured costs (StepRecord.predicted_fitted), on their own:
  // measured and fitted bubble summed over the same steps, and the first of them.
  int64_t fitted_count = 0;
  int64_t first_fitted_step = 0;
  double fitted_bubble_measured = 0;
  double fitted_bubble_predicted = 0;
  double model_bubble_predicted = 0;  // the cost model's, from the steps before the fit

  void Add(const pipetrain::v1::StepRecord& step);
  double MeanStepTime() const { return count == 0 ? 0 : time_s / count; }
  double MeanTokensPerS() const;
};

// "[=========>          ]": `done` of `total` in 20 characters (the tokenize verb's bar too).
std::string ProgressBar(int64_t done, int64_t total);

// "step 120/300 [=====>     ] loss 2.314  4,210 tok/s  bubble 0.21 (predicted 0.19)  ETA 1m20s";
// "(fitted 0.19)" when the prediction came from the job's measured costs.
// without the bar when `bar` is false. eta_s < 0 leaves the ETA out.
std::string ProgressLine(const pipetrain::v1::StepRecord& step, int64_t total_steps,
                         double eta_s, bool bar);

// The end of a job: its state, then final and validation loss, mean throughput, mean
// measured and predicted bubble, and the checkpoint; the reason when it did not succeed.
std::string JobSummary(const pipetrain::v1::JobStatus& status, const StepTotals& totals);

class ProgressPrinter {
 public:
  // On a terminal `width` (its columns, 0 = unknown) bounds the bar's line: a line that
  // wraps could no longer be redrawn in place.
  ProgressPrinter(int64_t total_steps, bool tty, std::ostream& out, int width = 0);

  void SetTotal(int64_t total_steps) { total_ = total_steps; }
  void Step(const pipetrain::v1::StepRecord& step);
  void Log(const pipetrain::v1::LogLine& log);
  // Ends the bar's line so that what follows starts on a fresh one.
  void Finish();

  const StepTotals& totals() const { return totals_; }

 private:
  void DrawBar();

  int64_t total_;
  bool tty_;
  std::ostream& out_;
  int width_;
  StepTotals totals_;
  std::string bar_;       // the bar as last drawn, empty before the first step
  int64_t last_bucket_ = -1;  // which 5% of the steps the last plain line was in
};

}  // namespace pipetrain::client
