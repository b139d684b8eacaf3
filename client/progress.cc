#include "client/progress.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/output.h"
#include "common/job_state.h"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;

constexpr int kBarWidth = 20;
constexpr int kPlainLines = 20;  // one plain line per 5% of the steps

}  // namespace

std::string ProgressBar(int64_t done, int64_t total) {
  const double fraction = total > 0 ? std::clamp(static_cast<double>(done) / total, 0.0, 1.0) : 0;
  const int filled = static_cast<int>(fraction * kBarWidth);
  std::string bar(kBarWidth, ' ');
  std::fill(bar.begin(), bar.begin() + filled, '=');
  if (filled < kBarWidth) bar[filled] = '>';
  return absl::StrCat("[", bar, "]");
}

void StepTotals::Add(const pb::StepRecord& step) {
  ++count;
  last_step = step.step();
  last_loss = step.loss();
  if (step.has_val_loss()) {
    has_val_loss = true;
    last_val_loss = step.val_loss();
    val_step = step.step();
  }
  time_s += step.step_time_s();
  tokens += step.tokens_per_s() * step.step_time_s();
  bubble_measured += step.bubble_measured();
  bubble_predicted += step.bubble_predicted();
  if (step.predicted_fitted()) {
    if (fitted_count++ == 0) first_fitted_step = step.step();
    fitted_bubble_measured += step.bubble_measured();
    fitted_bubble_predicted += step.bubble_predicted();
  } else {
    model_bubble_predicted = step.bubble_predicted();
  }
}

double StepTotals::MeanTokensPerS() const { return time_s > 0 ? tokens / time_s : 0; }

std::string ProgressLine(const pb::StepRecord& step, int64_t total_steps, double eta_s,
                         bool bar) {
  std::string out = absl::StrCat("step ", step.step(), "/", total_steps);
  if (bar) absl::StrAppend(&out, " ", ProgressBar(step.step(), total_steps));
  absl::StrAppend(&out, absl::StrFormat(" loss %.3f", step.loss()));
  if (step.has_val_loss()) absl::StrAppend(&out, absl::StrFormat(" (val %.3f)", step.val_loss()));
  absl::StrAppend(&out, "  ", WithThousands(std::llround(step.tokens_per_s())), " tok/s");
  absl::StrAppend(&out, absl::StrFormat("  bubble %.2f (%s %.2f)", step.bubble_measured(),
                                        step.predicted_fitted() ? "fitted" : "predicted",
                                        step.bubble_predicted()));
  if (eta_s >= 0) absl::StrAppend(&out, "  ETA ", HumanDuration(eta_s));
  return out;
}

std::string JobSummary(const pb::JobStatus& status, const StepTotals& totals) {
  const std::string state = pb::JobStatus::State_Name(status.state());
  const int64_t done = std::max<int64_t>(status.steps_done(), totals.last_step);
  double wall_s = totals.time_s;
  if (IsSet(status.started()) && IsSet(status.finished())) {
    wall_s = absl::ToDoubleSeconds(ToTime(status.finished()) - ToTime(status.started()));
  }
  std::string out = absl::StrCat(status.job_id(), " ", state, ": ", done, " of ",
                                 common::JobLastStep(status), " steps in ",
                                 HumanDuration(wall_s), "\n");
  if (status.state() != pb::JobStatus::SUCCEEDED) {
    absl::StrAppend(&out, "  reason           ",
                    status.reason().empty() ? "(none given)" : status.reason(), "\n");
  }
  if (totals.count > 0) {
    absl::StrAppend(&out, absl::StrFormat("  final loss       %.4f (step %d)\n", totals.last_loss,
                                          totals.last_step));
    if (totals.has_val_loss) {
      absl::StrAppend(&out, absl::StrFormat("  validation loss  %.4f (step %d)\n",
                                            totals.last_val_loss, totals.val_step));
    }
    absl::StrAppend(&out, "  throughput       ",
                    WithThousands(std::llround(totals.MeanTokensPerS())), " tok/s (mean)\n");
    if (totals.fitted_count > 0) {
      // Over the same steps: the difference is the runtime's own overhead.
      absl::StrAppend(
          &out, absl::StrFormat("  bubble           %.2f measured, %.2f predicted from the "
                                "measured costs (mean of steps %d-%d)\n",
                                totals.fitted_bubble_measured / totals.fitted_count,
                                totals.fitted_bubble_predicted / totals.fitted_count,
                                totals.first_fitted_step, totals.last_step));
      if (totals.fitted_count < totals.count) {
        absl::StrAppend(&out, absl::StrFormat("                   (the cost model's guess: %.2f)\n",
                                              totals.model_bubble_predicted));
      }
    } else {
      absl::StrAppend(&out,
                      absl::StrFormat("  bubble           %.2f measured, %.2f predicted (mean)\n",
                                      totals.bubble_measured / totals.count,
                                      totals.bubble_predicted / totals.count));
    }
  }
  if (!status.checkpoint_dir().empty()) {
    absl::StrAppend(&out, "  checkpoint       ", status.checkpoint_dir(), "\n");
  }
  return out;
}

ProgressPrinter::ProgressPrinter(int64_t total_steps, bool tty, std::ostream& out, int width)
    : total_(total_steps), tty_(tty), out_(out), width_(width) {}

void ProgressPrinter::Step(const pb::StepRecord& step) {
  totals_.Add(step);
  const double eta = totals_.MeanStepTime() * std::max<int64_t>(0, total_ - step.step());
  if (tty_) {
    bar_ = ProgressLine(step, total_, eta, /*bar=*/true);
    if (width_ > 1 && bar_.size() >= static_cast<size_t>(width_)) bar_.resize(width_ - 1);
    DrawBar();
    return;
  }
  const int64_t bucket = total_ > 0 ? step.step() * kPlainLines / total_ : step.step();
  if (bucket > last_bucket_ || step.step() >= total_) {
    last_bucket_ = bucket;
    out_ << ProgressLine(step, total_, eta, /*bar=*/false) << "\n";
    out_.flush();
  }
}

void ProgressPrinter::Log(const pb::LogLine& log) {
  if (tty_ && !bar_.empty()) out_ << "\r\033[K";  // the log line takes the bar's place
  out_ << log.text() << "\n";
  if (tty_ && !bar_.empty()) DrawBar();
  out_.flush();
}

void ProgressPrinter::DrawBar() {
  out_ << "\r" << bar_ << "\033[K";
  out_.flush();
}

void ProgressPrinter::Finish() {
  if (tty_ && !bar_.empty()) out_ << "\n";
  bar_.clear();
}

}  // namespace pipetrain::client
