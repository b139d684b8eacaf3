// The collective between data-parallel replicas inside one test process: each of
// `parties` threads hands its buffer in under its rank, and the last to arrive combines
// them all, in rank order (so the sums are the same bits whoever arrives first), as
// an all-reduce, the reduce-scatter of copies that split the optimizer, or their
// all-gather (common/model/optimizer_split.h's pieces). Waits at most 30 s for the rest.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model/optimizer_split.h"
#include "stage_server/exec/chunk_compute.h"

namespace pipetrain::testing {

// The collective between `parties` replicas in one process, by rank: the last to
// arrive combines every party's buffer, in rank order, and all go on.
class InProcessCopies {
 public:
  explicit InProcessCopies(int parties) : parties_(parties), parts_(parties) {}

  // All-reduce: every element the sum of the ranks' in rank order, over the parties.
  stage_server::GradientAverage AllReduceFor(int rank) {
    return [this, rank](std::span<float> data) {
      return Meet(rank, data, [this](std::vector<std::span<float>>& all) {
        for (size_t i = 0; i < all[0].size(); ++i) {
          const float mean = SumAt(all, i) / static_cast<float>(parties_);
          for (std::span<float> p : all) p[i] = mean;
        }
      });
    };
  }
  // Reduce-scatter: rank r's piece gets the same mean, the rest stays.
  stage_server::GradientAverage SplitAverageFor(int rank) {
    return [this, rank](std::span<float> data) {
      return Meet(rank, data, [this](std::vector<std::span<float>>& all) {
        std::vector<float> mean(all[0].size());
        for (size_t i = 0; i < mean.size(); ++i) mean[i] = SumAt(all, i) / static_cast<float>(parties_);
        for (int r = 0; r < parties_; ++r) {
          const model::CopyRange own = model::RangeOfCopy(mean.size(), parties_, r);
          for (uint64_t i = own.begin; i < own.end; ++i) all[r][i] = mean[i];
        }
      });
    };
  }
  // All-gather: every rank's piece from its owner.
  stage_server::WeightGather GatherFor(int rank) {
    return [this, rank](std::span<float> data) {
      return Meet(rank, data, [this](std::vector<std::span<float>>& all) {
        for (int owner = 0; owner < parties_; ++owner) {
          const model::CopyRange own = model::RangeOfCopy(all[0].size(), parties_, owner);
          for (int r = 0; r < parties_; ++r) {
            for (uint64_t i = own.begin; i < own.end; ++i) all[r][i] = all[owner][i];
          }
        }
      });
    };
  }

 private:
  static float SumAt(const std::vector<std::span<float>>& all, size_t i) {
    float sum = all[0][i];
    for (size_t r = 1; r < all.size(); ++r) sum += all[r][i];
    return sum;
  }

  absl::Status Meet(int rank, std::span<float> data,
                    const std::function<void(std::vector<std::span<float>>&)>& combine) {
    absl::MutexLock lock(&mu_);
    const int round = round_;
    parts_[rank] = data;
    if (++arrived_ == parties_) {
      for (std::span<float> p : parts_) {
        if (p.size() != data.size()) return absl::InvalidArgumentError("lengths differ");
      }
      combine(parts_);
      arrived_ = 0;
      ++round_;
      return absl::OkStatus();
    }
    auto next = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return round_ != round; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&next), absl::Seconds(30))) {
      return absl::DeadlineExceededError("the other replicas never came");
    }
    return absl::OkStatus();
  }

  const int parties_;
  absl::Mutex mu_;
  std::vector<std::span<float>> parts_ ABSL_GUARDED_BY(mu_);
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int round_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pipetrain::testing
