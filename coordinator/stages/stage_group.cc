#include "coordinator/stages/stage_group.h"

#include <algorithm>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/error_context.h"

namespace pipetrain::coordinator {

StageGroup::StageGroup(std::vector<RunnerStage> stages, StageConnector& connector)
    : stages_(std::move(stages)) {
  for (const RunnerStage& s : stages_) clients_.push_back(connector.Connect(s.address));
}

std::string StageGroup::StageName(int s) const {
  return absl::StrCat("stage ", s, " (", stages_[s].stage_id, " at ", stages_[s].address, ")");
}

std::vector<absl::Status> StageGroup::OnEveryStage(const std::function<absl::Status(int)>& call) {
  std::vector<absl::Status> status(size());
  std::vector<std::thread> threads;
  for (int s = 0; s < size(); ++s) threads.emplace_back([&, s] { status[s] = call(s); });
  for (std::thread& t : threads) t.join();
  return status;
}

std::vector<absl::Status> StageGroup::OnEveryStageCancellingOnError(
    absl::Duration deadline, const std::function<absl::Status(int, CallControl&)>& call) {
  std::vector<std::unique_ptr<CallControl>> calls;
  for (int s = 0; s < size(); ++s) calls.push_back(std::make_unique<CallControl>(absl::Now() + deadline));
  std::once_flag cancel_once;
  return OnEveryStage([&](int s) -> absl::Status {
    absl::Status status = call(s, *calls[s]);
    if (!status.ok()) {
      std::call_once(cancel_once, [&] {
        for (int o = 0; o < size(); ++o) {
          if (o != s) calls[o]->Cancel();
        }
      });
    }
    return status;
  });
}

absl::Status AttributeError(const std::vector<absl::Status>& st, int64_t step,
                            const char* what, const std::function<std::string(int)>& name,
                            const std::function<bool(int)>& answers, int* lost) {
  *lost = -1;
  const int n = static_cast<int>(st.size());
  int first = -1;
  for (int s = 0; s < n; ++s) {
    if (st[s].ok()) continue;
    if (first < 0 || (absl::IsCancelled(st[first]) && !absl::IsCancelled(st[s]))) first = s;
  }
  if (first < 0) return absl::OkStatus();
  const std::string when = step > 0 ? absl::StrCat(" at step ", step) : "";
  for (int s = 0; s < n; ++s) {
    if (answers(s)) continue;
    *lost = s;
    // Its own call was most likely cancelled by us; a neighbour's error says more.
    const absl::Status& own = st[s].ok() || absl::IsCancelled(st[s]) ? st[first] : st[s];
    return absl::UnavailableError(absl::StrCat(name(s), " stopped answering", when, " (",
                                               own.message(),
                                               "); the job's other stages are free again"));
  }
  return common::ErrorContext(absl::StrCat(what, " ", name(first), " failed", when))
      .Wrap(st[first]);
}

absl::Status StageGroup::FirstError(const std::vector<absl::Status>& st, int64_t step,
                                    const char* what) {
  int lost = -1;
  absl::Status status = AttributeError(
      st, step, what, [&](int s) { return StageName(s); },
      [&](int s) { return clients_[s]->Ping(absl::Seconds(3)).ok(); }, &lost);
  if (lost >= 0 && std::find(lost_.begin(), lost_.end(), stages_[lost].stage_id) == lost_.end()) {
    lost_.push_back(stages_[lost].stage_id);
  }
  return status;
}

absl::Status StageGroup::Run(int64_t step, const char* what,
                             const std::function<absl::Status(int)>& call) {
  return FirstError(OnEveryStage(call), step, what);
}

}  // namespace pipetrain::coordinator
