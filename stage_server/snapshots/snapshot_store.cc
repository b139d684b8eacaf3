#include "stage_server/snapshots/snapshot_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/error_context.h"

namespace pipetrain::stage_server {

namespace {

// "WHAT of job 'ID' stage S step N chunk C": the snapshot a message is about.
common::ErrorContext About(const char* what, const std::string& job_id, int owner_stage, int chunk,
                           int64_t step) {
  return common::ErrorContext(what).Job(job_id).Stage(owner_stage).Step(step).Chunk(chunk);
}

}  // namespace

void SnapshotStore::Reset(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  job_id_ = job_id;
  entries_.clear();
  bytes_ = 0;
}

std::string SnapshotStore::job_id() const {
  absl::MutexLock lock(&mu_);
  return job_id_;
}

absl::Status SnapshotStore::CheckJob(const std::string& job_id,
                                     const common::ErrorContext& about) const {
  if (!job_id_.empty() && job_id == job_id_) return absl::OkStatus();
  return about.Error(absl::StatusCode::kFailedPrecondition,
                     absl::StrCat("this stage holds snapshots of ",
                                  job_id_.empty() ? std::string("no job")
                                                  : absl::StrCat("job '", job_id_, "'")));
}

absl::Status SnapshotStore::Put(const std::string& job_id, SnapshotMeta meta,
                                std::shared_ptr<const std::string> blob) {
  absl::MutexLock lock(&mu_);
  const common::ErrorContext about =
      About("snapshot", job_id, meta.owner_stage, meta.chunk, meta.step);
  if (absl::Status s = CheckJob(job_id, about); !s.ok()) return s;
  meta.bytes = blob->size();
  std::map<int64_t, Entry>& steps = entries_[{meta.owner_stage, meta.chunk, meta.held}];
  if (static_cast<int>(steps.size()) >= kStepsKept && !steps.contains(meta.step) &&
      meta.step < steps.begin()->first) {
    return about.Error(absl::StatusCode::kFailedPrecondition,
                       absl::StrCat("older than the ", kStepsKept, " steps kept (",
                                    steps.begin()->first, " and ", steps.rbegin()->first, ")"));
  }
  if (auto it = steps.find(meta.step); it != steps.end()) {
    bytes_ -= it->second.meta.bytes;
    steps.erase(it);
  }
  bytes_ += meta.bytes;
  steps[meta.step] = Entry{meta, std::move(blob)};
  while (static_cast<int>(steps.size()) > kStepsKept) {
    bytes_ -= steps.begin()->second.meta.bytes;
    steps.erase(steps.begin());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SnapshotMeta>> SnapshotStore::List(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckJob(job_id, common::ErrorContext("list snapshots").Job(job_id)); !s.ok()) return s;
  std::vector<SnapshotMeta> out;
  for (const auto& [key, steps] : entries_) {
    for (const auto& [step, entry] : steps) out.push_back(entry.meta);
  }
  std::sort(out.begin(), out.end(), [](const SnapshotMeta& a, const SnapshotMeta& b) {
    return std::tie(a.owner_stage, a.chunk, a.step, a.held) <
           std::tie(b.owner_stage, b.chunk, b.step, b.held);
  });
  return out;
}

absl::StatusOr<std::shared_ptr<const std::string>> SnapshotStore::Get(
    const std::string& job_id, int owner_stage, int chunk, int64_t step,
    std::optional<bool> which) const {
  absl::MutexLock lock(&mu_);
  const common::ErrorContext about = About("fetch snapshot", job_id, owner_stage, chunk, step);
  if (absl::Status s = CheckJob(job_id, about); !s.ok()) {
    return s;
  }
  std::vector<std::string> there;
  for (bool held : {false, true}) {
    if (which && *which != held) continue;
    auto it = entries_.find({owner_stage, chunk, held});
    if (it == entries_.end()) continue;
    if (auto e = it->second.find(step); e != it->second.end()) return e->second.blob;
    for (const auto& [s, entry] : it->second) there.push_back(absl::StrCat(s));
  }
  return about.Error(absl::StatusCode::kNotFound,
                     absl::StrCat("not held here (",
                                  there.empty() ? std::string("no step of that chunk")
                                                : absl::StrCat("steps ", absl::StrJoin(there, ", ")),
                                  ")"));
}

uint64_t SnapshotStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

std::optional<int64_t> SnapshotStore::NewestOwnStep() const {
  absl::MutexLock lock(&mu_);
  std::optional<int64_t> newest;
  for (const auto& [key, steps] : entries_) {
    if (std::get<2>(key) || steps.empty()) continue;
    newest = std::max(newest.value_or(steps.rbegin()->first), steps.rbegin()->first);
  }
  return newest;
}

std::string SnapshotAssembler::Describe() const {
  return About("snapshot", job_id_, meta_.owner_stage, meta_.chunk, meta_.step).Text();
}

absl::Status SnapshotAssembler::Add(const std::string& job_id, const SnapshotMeta& meta,
                                    uint64_t offset, std::string_view data) {
  if (!started_) {
    job_id_ = job_id;
    meta_ = meta;
    started_ = true;
    if (meta.bytes > max_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(Describe(), ": field info.bytes ",
                                                       meta.bytes, " is more than the ",
                                                       max_bytes_, " a stage accepts"));
    }
    data_.reserve(meta.bytes);
  }
  if (job_id != job_id_ || !(meta == meta_) || offset != data_.size() ||
      data_.size() + data.size() > meta_.bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(), ": piece at offset ", offset, " (", data.size(),
        " bytes) does not continue it (expected offset ", data_.size(), " of ", meta_.bytes,
        " bytes, the same job_id and info on every piece)"));
  }
  data_.append(data);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const std::string>> SnapshotAssembler::Finish() {
  if (!started_) return absl::InvalidArgumentError("snapshot push: the stream had no piece");
  if (data_.size() != meta_.bytes) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(), ": the stream ended after ",
                                                   data_.size(), " of ", meta_.bytes, " bytes"));
  }
  return std::make_shared<const std::string>(std::move(data_));
}

}  // namespace pipetrain::stage_server
