#include "stage_server/collective/gradient_reducer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/error_context.h"
#include "common/model/optimizer_split.h"
#include "common/status_macros.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "stage_server/collective/coordinator_store.h"

namespace pipetrain::stage_server::collective {

namespace {

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// R = 1: nothing to sum with.
class SoloReducer final : public GradientReducer {
 public:
  absl::Status AllReduceSum(std::span<float>, absl::Duration) override { return absl::OkStatus(); }
  absl::Status ReduceScatterSum(std::span<float>, absl::Duration) override {
    return absl::OkStatus();
  }
  absl::Status AllGather(std::span<float>, absl::Duration) override { return absl::OkStatus(); }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* library() const override { return "none"; }
};

class GlooReducer final : public GradientReducer {
 public:
  GlooReducer(ReducerOptions options, std::vector<std::string> hosts,
              std::shared_ptr<gloo::transport::Device> device,
              std::shared_ptr<gloo::rendezvous::Context> context)
      : options_(std::move(options)), hosts_(std::move(hosts)), device_(std::move(device)),
        context_(std::move(context)) {}

  ~GlooReducer() override {
    // Closing the pairs can throw inside gloo when a peer is already gone.
    try {
      context_.reset();
      device_.reset();
    } catch (...) {
    }
  }

  int rank() const override { return options_.replica; }
  int size() const override { return options_.replicas; }
  const char* library() const override { return "gloo"; }

  absl::Status AllReduceSum(std::span<float> data, absl::Duration deadline) override {
    return Run("all-reduce", data.size(), deadline, [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data.data(), data.size());
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(next_tag_++);
      opts.setTimeout(ToMillis(deadline));
      gloo::allreduce(opts);
    });
  }

  // Every replica sends each other its piece of `data` (gloo's alltoallv), then adds the
  // R pieces it received in replica order: the same sum whichever replica computes it.
  absl::Status ReduceScatterSum(std::span<float> data, absl::Duration deadline) override {
    const model::CopyRange own = model::RangeOfCopy(data.size(), size(), rank());
    return Run("reduce-scatter", data.size(), deadline, [&] {
      const std::vector<int64_t> sent = Counts(model::PieceSizes(data.size(), size()));
      const std::vector<int64_t> received(size(), static_cast<int64_t>(own.size()));
      received_.resize(own.size() * size());
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(data.data(), sent);
      opts.setOutput(received_.data(), received);
      opts.setTag(next_tag_++);
      opts.setTimeout(ToMillis(deadline));
      gloo::alltoallv(opts);
      float* out = data.data() + own.begin;
      std::copy_n(received_.data(), own.size(), out);
      for (int r = 1; r < size(); ++r) {
        const float* piece = received_.data() + r * own.size();
        for (uint64_t i = 0; i < own.size(); ++i) out[i] += piece[i];
      }
    });
  }

  // gloo's allgatherv in place: with no input, the output's own piece is what is sent.
  absl::Status AllGather(std::span<float> data, absl::Duration deadline) override {
    return Run("all-gather", data.size(), deadline, [&] {
      std::vector<size_t> counts;
      for (uint64_t n : model::PieceSizes(data.size(), size())) counts.push_back(n);
      gloo::AllgathervOptions opts(context_);
      opts.setOutput(data.data(), counts);
      opts.setTag(next_tag_++);
      opts.setTimeout(ToMillis(deadline));
      gloo::allgatherv(opts);
    });
  }

 private:
  static std::vector<int64_t> Counts(const std::vector<uint64_t>& sizes) {
    return std::vector<int64_t>(sizes.begin(), sizes.end());
  }

  // Runs one collective over `floats` floats, turning whatever gloo throws into a status
  // that breaks the reducer for good (its connections are in an unknown state).
  template <typename Collective>
  absl::Status Run(const char* what, size_t floats, absl::Duration deadline, Collective run) {
    if (deadline <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(Who(), ": ", what,
                                                     " deadline must be positive, got ",
                                                     absl::FormatDuration(deadline)));
    }
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Who(), ": the reducer failed earlier and cannot be used again: ",
                       broken_.message()));
    }
    if (floats == 0) return absl::OkStatus();
    absl::StatusCode code = absl::StatusCode::kUnavailable;
    std::string error;
    try {
      run();
      return absl::OkStatus();
    } catch (const gloo::IoException& e) {
      error = e.what();
      if (absl::StrContains(error, "Timed out")) code = absl::StatusCode::kDeadlineExceeded;
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown exception from gloo";
    }
    broken_ = absl::Status(
        code, absl::StrCat(Who(), ": ", what, " of ", floats, " floats (deadline ",
                           absl::FormatDuration(deadline), ") failed; ring neighbours ",
                           Peer(Left()), " and ", Peer(Right()), ": ", error));
    return broken_;
  }

  std::string Who() const { return ReducerWho(options_); }
  int Left() const { return (options_.replica + options_.replicas - 1) % options_.replicas; }
  int Right() const { return (options_.replica + 1) % options_.replicas; }
  std::string Peer(int r) const { return absl::StrCat("replica ", r, " (host ", hosts_[r], ")"); }

  const ReducerOptions options_;
  const std::vector<std::string> hosts_;  // each replica's listen_host
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t next_tag_ = 0;
  std::vector<float> received_;  // reduce-scatter: the R pieces this replica sums
  absl::Status broken_;
};

}  // namespace

absl::Status CheckReducerOptions(const ReducerOptions& o) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("gradient reducer for job ", o.job_id,
                                                   ", stage ", o.stage, ": ", what));
  };
  if (o.job_id.empty()) return bad("job_id is empty");
  if (o.replicas < 1) return bad(absl::StrCat("replicas is ", o.replicas, ", must be >= 1"));
  if (o.replica < 0 || o.replica >= o.replicas) {
    return bad(absl::StrCat("replica is ", o.replica, ", must be in [0, ", o.replicas, ")"));
  }
  if (o.stage < 0) return bad(absl::StrCat("stage is ", o.stage, ", must be >= 0"));
  if (o.replicas == 1) return absl::OkStatus();
  if (o.coordinator_address.empty()) return bad("coordinator_address is empty");
  if (o.listen_host.empty()) return bad("listen_host is empty");
  if (o.connect_deadline <= absl::ZeroDuration()) return bad("connect_deadline must be positive");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ExchangeWithReplicas(const ReducerOptions& options,
                                                              CoordinatorStore& store,
                                                              const std::string& key,
                                                              const std::string& value,
                                                              absl::Time deadline) {
  const std::string who = ReducerWho(options);
  RETURN_IF_ERROR(common::ErrorContext(who).Wrap(
      store.Set(absl::StrCat(key, options.replica), value)));
  std::vector<std::string> values(options.replicas);
  values[options.replica] = value;
  std::vector<int> missing;
  for (int r = 0; r < options.replicas; ++r) {
    if (r == options.replica) continue;
    // Once one is late, the deadline has passed: the rest are only looked up.
    absl::StatusOr<std::string> got = store.Get(absl::StrCat(key, r), deadline - absl::Now());
    if (got.ok()) {
      values[r] = *got;
    } else if (got.status().code() == absl::StatusCode::kDeadlineExceeded ||
               got.status().code() == absl::StatusCode::kNotFound) {
      missing.push_back(r);
    } else {
      return common::ErrorContext(who).Wrap(got.status(), absl::StrCat("waiting for replica ", r));
    }
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(
        who, ": replica", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
        " did not arrive within ", absl::FormatDuration(options.connect_deadline),
        " (rendezvous through coordinator ", options.coordinator_address, ")"));
  }
  return values;
}

std::string StageRendezvousPrefix(const ReducerOptions& o) {
  return absl::StrCat(o.rendezvous_prefix, "/stage-", o.stage, "/");
}

std::string ReducerWho(const ReducerOptions& o) {
  return absl::StrCat("job ", o.job_id, ", stage ", o.stage, ", replica ", o.replica, " of ",
                      o.replicas);
}

absl::StatusOr<std::unique_ptr<GradientReducer>> CreateGlooReducer(const ReducerOptions& options) {
  if (absl::Status s = CheckReducerOptions(options); !s.ok()) return s;
  if (options.replicas == 1) return std::make_unique<SoloReducer>();
  const absl::Time deadline = absl::Now() + options.connect_deadline;
  CoordinatorStore store(options.coordinator_address, options.security, options.job_id,
                         StageRendezvousPrefix(options), options.connect_deadline);
  // Everyone announces itself first, so that a replica that never comes is named (gloo
  // itself would only say that a key was missing).
  ASSIGN_OR_RETURN(std::vector<std::string> hosts,
                   ExchangeWithReplicas(options, store, "arrived/", options.listen_host, deadline));
  return ConnectGlooReducer(options, store, std::move(hosts), deadline);
}

absl::StatusOr<std::unique_ptr<GradientReducer>> ConnectGlooReducer(const ReducerOptions& options,
                                                                    CoordinatorStore& store,
                                                                    std::vector<std::string> hosts,
                                                                    absl::Time deadline) {
  std::string what;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.listen_host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.replica, options.replicas);
    context->setTimeout(ToMillis(deadline - absl::Now()));
    context->connectFullMesh(store, device);
    return std::make_unique<GlooReducer>(options, std::move(hosts), std::move(device),
                                         std::move(context));
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception from gloo";
  }
  return absl::UnavailableError(absl::StrCat(ReducerWho(options),
                                             ": connecting to replicas on hosts ",
                                             absl::StrJoin(hosts, ", "), " failed: ", what));
}

}  // namespace pipetrain::stage_server::collective
