#include "stage_server/snapshots/snapshot_pusher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/channel_args.h"
#include "common/error_context.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "grpcpp/create_channel.h"
#include "pipetrain/v1/stage.grpc.pb.h"

namespace pipetrain::stage_server {

namespace pb = ::pipetrain::v1;

namespace {

// "snapshot of job 'ID' stage S step N": the copy a log line is about.
common::ErrorContext About(const SnapshotPusherOptions& o, int64_t step) {
  return common::ErrorContext("snapshot").Job(o.job_id).Stage(o.stage).Step(step);
}

}  // namespace

SnapshotPusher::SnapshotPusher(SnapshotPusherOptions options,
                               std::shared_ptr<grpc::ChannelCredentials> credentials)
    : options_(std::move(options)) {
  // The peer links' channel settings: the same peer, bulk transfers, pings while idle.
  channel_ = grpc::CreateCustomChannel(options_.peer_address, std::move(credentials),
                                       common::ChannelArgumentsFor(common::ChannelUse::kPeerLink));
  thread_ = std::thread([this] { Loop(); });
}

SnapshotPusher::~SnapshotPusher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (in_flight_ != nullptr) in_flight_->TryCancel();
  }
  thread_.join();
}

void SnapshotPusher::Enqueue(SnapshotPush push) {
  absl::MutexLock lock(&mu_);
  if (next_) {
    common::LogInfo("stage", absl::StrCat(About(options_, next_->step).Text(),
                                          " not copied to stage ", options_.peer_stage,
                                          ": step ", push.step, "'s replaces it"));
  }
  next_ = std::move(push);
}

int64_t SnapshotPusher::pushes_done() const {
  absl::MutexLock lock(&mu_);
  return pushes_done_;
}

std::optional<int64_t> SnapshotPusher::newest_pushed_step() const {
  absl::MutexLock lock(&mu_);
  return newest_pushed_;
}

void SnapshotPusher::Loop() {
  while (true) {
    SnapshotPush push;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](SnapshotPusher* p) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return p->stopping_ || p->next_.has_value();
          },
          this));
      if (stopping_) return;
      push = std::move(*next_);
      next_.reset();
    }
    bool ok = true;
    for (const auto& [meta, blob] : push.blobs) {
      absl::Status s = Push(meta, *blob);
      if (!s.ok()) {
        ok = false;
        common::LogWarning("stage", absl::StrCat(About(options_, push.step).Chunk(meta.chunk).Text(),
                                                 " not copied to its peer stage ",
                                                 options_.peer_stage, " at ",
                                                 options_.peer_address, ": ", s.message()));
        break;
      }
    }
    absl::MutexLock lock(&mu_);
    ++pushes_done_;
    if (ok) newest_pushed_ = push.step;
  }
}

absl::Status SnapshotPusher::Push(const SnapshotMeta& meta, const std::string& blob) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("the stage is reconfigured or stopping");
    in_flight_ = &ctx;
  }
  pb::HoldSnapshotResponse response;
  auto stub = pb::Stage::NewStub(channel_);
  auto writer = stub->HoldSnapshot(&ctx, &response);
  pb::SnapshotPiece piece;
  piece.set_job_id(options_.job_id);
  piece.set_peer_secret(options_.peer_secret);
  pb::SnapshotInfo* info = piece.mutable_info();
  info->set_owner_stage(meta.owner_stage);
  info->set_chunk(meta.chunk);
  info->set_step(meta.step);
  info->set_bytes(blob.size());
  info->set_held(true);
  info->set_begin_layer(meta.begin_layer);
  info->set_end_layer(meta.end_layer);
  info->set_num_stages(meta.num_stages);
  // Under --fail-at ...:snapshot a blob goes in two pieces at least, so that the kill
  // after the first leaves its peer holding part of it.
  const size_t piece_bytes =
      options_.after_first_piece
          ? std::max<size_t>(1, std::min(options_.piece_bytes, (blob.size() + 1) / 2))
          : options_.piece_bytes;
  for (size_t at = 0; at == 0 || at < blob.size(); at += piece_bytes) {
    piece.set_offset(at);
    piece.set_data(blob.data() + at, std::min(piece_bytes, blob.size() - at));
    if (!writer->Write(piece)) break;  // Finish says why
    if (at == 0 && options_.after_first_piece) options_.after_first_piece(meta.step);
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = nullptr;
  }
  if (!status.ok()) return common::FromGrpcStatus(status);
  return absl::OkStatus();
}

}  // namespace pipetrain::stage_server
