#include "stage_server/link/local_channel.h"

#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain::stage_server {
namespace {

using Key = std::tuple<std::string, uint64_t, uint32_t, uint32_t, int>;
Key KeyOf(const common::FrameTag& t) {
  return {t.job_id, t.step, t.micro_batch, t.chunk, static_cast<int>(t.kind)};
}

struct Mailbox {
  absl::Mutex mu;
  std::map<Key, common::Tensor> tensors ABSL_GUARDED_BY(mu);
  uint64_t bytes ABSL_GUARDED_BY(mu) = 0;
};

class LocalEnd final : public TensorChannel {
 public:
  LocalEnd(std::shared_ptr<Mailbox> in, std::shared_ptr<Mailbox> out)
      : in_(std::move(in)), out_(std::move(out)) {}

  void BeginStep(uint64_t) override {}
  absl::Status Send(const common::FrameTag& tag, std::shared_ptr<const common::Tensor> tensor,
                    absl::Time) override {
    absl::MutexLock lock(&out_->mu);
    out_->bytes += tensor->num_bytes();
    sent_ += tensor->num_bytes();
    if (!out_->tensors.emplace(KeyOf(tag), tensor->Clone()).second) {
      return absl::InvalidArgumentError(absl::StrCat(common::DescribeTag(tag), " sent twice"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<common::PiecewiseTensor> Receive(const common::FrameTag& tag,
                                                  absl::Time deadline) override {
    const Key key = KeyOf(tag);
    absl::MutexLock lock(&in_->mu);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(in_->mu) {
      return in_->tensors.count(key) > 0;
    };
    if (!in_->mu.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("no ", common::DescribeTag(tag), " before the deadline"));
    }
    auto it = in_->tensors.find(key);
    common::Tensor t = std::move(it->second);
    in_->tensors.erase(it);
    received_ += t.num_bytes();
    return common::PiecewiseTensor::FromTensor(std::move(t));
  }
  absl::Status Flush(absl::Time) override { return absl::OkStatus(); }
  uint64_t bytes_sent() const override { return sent_; }
  uint64_t bytes_received() const override { return received_; }

 private:
  std::shared_ptr<Mailbox> in_, out_;
  uint64_t sent_ = 0, received_ = 0;  // used by the owning stage's thread only
};

}  // namespace

std::pair<std::unique_ptr<TensorChannel>, std::unique_ptr<TensorChannel>> MakeLocalChannelPair() {
  auto down = std::make_shared<Mailbox>(), up = std::make_shared<Mailbox>();
  return {std::make_unique<LocalEnd>(up, down), std::make_unique<LocalEnd>(down, up)};
}

}  // namespace pipetrain::stage_server
