#include "stage_server/calibration/calibration.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status_macros.h"

namespace pipetrain::stage_server {
namespace {

// A (rows, T, C) activation in `dtype` (f32 or bf16) of N(0, scale^2) values: never zeros.
absl::StatusOr<common::Tensor> RandomActivation(common::DType dtype, int rows, int T, int C,
                                                double scale, std::mt19937_64& rng) {
  ASSIGN_OR_RETURN(common::Tensor t, common::Tensor::Create(dtype, {rows, T, C}));
  std::normal_distribution<float> normal(0.0f, static_cast<float>(scale));
  if (dtype == common::DType::kBF16) {
    for (uint16_t& x : t.data<uint16_t>()) x = common::FloatToBf16Bits(normal(rng));
  } else {
    for (float& x : t.data<float>()) x = normal(rng);
  }
  return t;
}

struct RoundSeconds {
  double forward = 0, backward_input = 0, backward_weight = 0, optimizer = 0;
};

absl::StatusOr<RoundSeconds> Round(ChunkCompute& chunk, const model::TransformerConfig& config,
                                   const model::Precision& precision, int rows,
                                   std::mt19937_64& rng) {
  const common::DType dtype = precision.activations;
  ASSIGN_OR_RETURN(common::Tensor x,
                   RandomActivation(dtype, rows, config.seq_len, config.d_model, 1.0, rng));
  ASSIGN_OR_RETURN(common::Tensor dy,
                   RandomActivation(dtype, rows, config.seq_len, config.d_model, 1e-3, rng));
  RoundSeconds s;
  RETURN_IF_ERROR(chunk.ZeroGrads());
  auto start = CalibrationClock::now();
  RETURN_IF_ERROR(chunk.Forward(0, common::PiecewiseTensor::View(x), nullptr).status());
  s.forward = SecondsSince(start);
  const common::PiecewiseTensor grad = common::PiecewiseTensor::View(dy);
  start = CalibrationClock::now();
  RETURN_IF_ERROR(chunk.BackwardInput(0, &grad, 1.0f).status());
  s.backward_input = SecondsSince(start);
  start = CalibrationClock::now();
  RETURN_IF_ERROR(chunk.BackwardWeight(0));
  s.backward_weight = SecondsSince(start);
  // A learning rate of 0 leaves the weights as they were; AdamW's work is the same.
  compute::OptimizerSettings adam;
  adam.lr = 0.0f;
  start = CalibrationClock::now();
  RETURN_IF_ERROR(chunk.OptimizerStep(adam, std::nullopt));
  s.optimizer = SecondsSince(start);
  return s;
}

}  // namespace

absl::StatusOr<CalibrationResult> CalibrateBlock(ChunkCompute& chunk,
                                                 const model::TransformerConfig& config,
                                                 const model::Precision& precision, int rows,
                                                 int repetitions) {
  if (repetitions < 1 || rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration: repetitions (", repetitions, ") and rows (", rows, ") must be >= 1"));
  }
  if (chunk.has_embedding() || chunk.has_head()) {
    return absl::InvalidArgumentError(
        "calibration: the chunk must hold one transformer block, not the embedding or head");
  }
  std::mt19937_64 rng(20261204);
  RETURN_IF_ERROR(Round(chunk, config, precision, rows, rng).status());  // warm-up
  std::vector<double> f, bi, bw, opt;
  for (int r = 0; r < repetitions; ++r) {
    ASSIGN_OR_RETURN(const RoundSeconds s, Round(chunk, config, precision, rows, rng));
    f.push_back(s.forward);
    bi.push_back(s.backward_input);
    bw.push_back(s.backward_weight);
    opt.push_back(s.optimizer);
  }
  const model::LayerCost cost = model::CostOfLayer(config, kCalibrationLayer, precision.products);
  const double tokens = static_cast<double>(rows) * config.seq_len;
  CalibrationResult out;
  out.forward_s_per_flop = MedianOf(f) / (cost.forward_flops * tokens);
  out.backward_input_s_per_flop = MedianOf(bi) / (cost.backward_input_flops * tokens);
  out.backward_weight_s_per_flop = MedianOf(bw) / (cost.backward_weight_flops * tokens);
  out.optimizer_s_per_param = MedianOf(opt) / static_cast<double>(std::max<int64_t>(1, cost.params));
  out.repetitions = repetitions;
  return out;
}

absl::StatusOr<double> TimeAllReduce(collective::GradientReducer& reducer, uint64_t bytes,
                                     int repetitions, absl::Duration deadline) {
  if (bytes == 0 || bytes % sizeof(float) != 0 || repetitions < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibrate: an all-reduce of ", bytes, " bytes (a positive multiple of 4) ",
        repetitions, " times (at least once) cannot be timed"));
  }
  std::vector<float> data(bytes / sizeof(float));
  std::vector<double> seconds;
  for (int r = 0; r <= repetitions; ++r) {
    // The sums grow with every call; refill so that they stay finite and never zero.
    for (size_t i = 0; i < data.size(); ++i) data[i] = 1.0f + static_cast<float>(i % 7);
    const CalibrationClock::time_point start = CalibrationClock::now();
    RETURN_IF_ERROR(reducer.AllReduceSum(data, deadline));
    if (r > 0) seconds.push_back(SecondsSince(start));  // the first warms the connections
  }
  return MedianOf(std::move(seconds));
}

double SecondsSince(CalibrationClock::time_point start) {
  return std::chrono::duration<double>(CalibrationClock::now() - start).count();
}

double MedianOf(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace pipetrain::stage_server
