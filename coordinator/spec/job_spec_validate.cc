// WithDefaults and ValidateJobSpec (declared in job_spec.h): the one place where a spec's
// defaults are filled in, and every check that needs neither the cluster nor the data.
// The model and pipeline shape are the planner's to judge; this adds the rest.
#include <cmath>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data/token_file.h"
#include "common/model/precision.h"
#include "common/status_macros.h"
#include "coordinator/spec/job_spec.h"
#include "coordinator/spec/lr_schedule.h"
#include "coordinator/planner/planner.h"
#include "coordinator/planner/schedule_file.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;

// The job spec's defaults, what a user gets; a stage's own, for a ConfigureRequest field
// left 0, are compute::kStageOptimizerDefaults (stage_server/compute/optimizer_settings.h).
constexpr float kDefaultBeta1 = 0.9f;
constexpr float kDefaultBeta2 = 0.95f;
constexpr float kDefaultWeightDecay = 0.1f;
constexpr float kDefaultValidationFraction = 0.05f;

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

absl::Status CheckUnitInterval(absl::string_view field, float v, absl::string_view hint) {
  if (v >= 0 && v < 1) return absl::OkStatus();  // false for NaN as well
  return Invalid(field, absl::StrCat("must be in [0, 1) (got ", v, "); ", hint));
}

absl::Status CheckNonNegative(absl::string_view field, double v, absl::string_view hint) {
  if (v >= 0 && std::isfinite(v)) return absl::OkStatus();
  return Invalid(field, absl::StrCat("must be >= 0 (got ", v, "); ", hint));
}

// training.min_lr: in [0, lr], and only with a schedule that decays to it.
absl::Status ValidateMinLr(const pb::TrainingSpec& t, LrDecay decay) {
  RETURN_IF_ERROR(CheckNonNegative("training.min_lr", t.min_lr(),
                                   "it is where a decaying training.lr_schedule ends"));
  if (t.min_lr() > t.lr()) {
    return Invalid("training.min_lr", absl::StrCat("must be <= training.lr (got ", t.min_lr(),
                                                   " > ", t.lr(), "): a decay ends there"));
  }
  if (decay == LrDecay::kConstant && t.min_lr() != 0) {
    return Invalid("training.min_lr",
                   "is where a decaying schedule ends, but training.lr_schedule is 'constant' "
                   "(the default), which stays at training.lr: set training.lr_schedule to "
                   "'cosine' or 'linear', or leave training.min_lr out");
  }
  return absl::OkStatus();
}

// training.lr_schedule and min_lr. A decay needs steps after the warm-up; a job from a
// checkpoint (`fresh` false) counts the checkpoint's steps too, which are not known here.
absl::Status ValidateLrSchedule(const pb::TrainingSpec& t, bool fresh) {
  absl::StatusOr<LrDecay> decay = LrDecayNamed(t.lr_schedule());
  if (!decay.ok()) return Invalid("training.lr_schedule", decay.status().message());
  RETURN_IF_ERROR(ValidateMinLr(t, *decay));
  if (*decay != LrDecay::kConstant && fresh && t.warmup_steps() >= t.steps()) {
    return Invalid("training.warmup_steps",
                   absl::StrCat("must be < training.steps (", t.steps(), ") with training."
                                "lr_schedule '", LrDecayName(*decay), "' (got ",
                                t.warmup_steps(), "): the decay runs from step warmup_steps "
                                "to the last step"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTraining(const pb::TrainingSpec& t, bool fresh) {
  if (t.steps() <= 0) {
    return Invalid("training.steps", absl::StrCat("must be > 0 (got ", t.steps(),
                                                  "); it is the number of optimizer steps"));
  }
  if (!(t.lr() > 0) || !std::isfinite(t.lr())) {
    return Invalid("training.lr", absl::StrCat("must be > 0 and finite (got ", t.lr(),
                                               "); a typical value is 3e-4"));
  }
  if (t.has_beta1()) {
    RETURN_IF_ERROR(CheckUnitInterval("training.beta1", t.beta1(), "the usual value is 0.9"));
  }
  if (t.has_beta2()) {
    RETURN_IF_ERROR(CheckUnitInterval("training.beta2", t.beta2(), "the usual value is 0.95"));
  }
  if (t.has_weight_decay()) {
    RETURN_IF_ERROR(
        CheckNonNegative("training.weight_decay", t.weight_decay(), "0 turns decay off"));
  }
  RETURN_IF_ERROR(
      CheckNonNegative("training.grad_clip_norm", t.grad_clip_norm(), "0 turns clipping off"));
  if (t.warmup_steps() < 0) {
    return Invalid("training.warmup_steps",
                   absl::StrCat("must be >= 0 (got ", t.warmup_steps(), "); 0 means no warm-up"));
  }
  if (absl::StatusOr<model::Precision> p = model::PrecisionNamed(t.precision()); !p.ok()) {
    return Invalid("training.precision", p.status().message());
  }
  return ValidateLrSchedule(t, fresh);
}

absl::Status ValidateTokenPaths(absl::string_view field,
                                const google::protobuf::RepeatedPtrField<std::string>& paths) {
  for (int i = 0; i < paths.size(); ++i) {
    if (paths[i].empty()) {
      return Invalid(absl::StrCat(field, "[", i, "]"),
                     "empty; give the path (or glob) of a token file");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateData(const pb::DataSpec& d) {
  const bool text = !d.corpus().empty(), tokens = d.tokens_size() > 0;
  if (!text && !tokens) {
    return Invalid("data.corpus",
                   "missing; give the path of a text file the coordinator can read, or instead "
                   "data.tokens: token files (llm.c or nanoGPT)");
  }
  if (text && tokens) {
    return Invalid("data.corpus and data.tokens",
                   "both given; a job trains on one of them: a text (data.corpus, its bytes are "
                   "the tokens) or token files (data.tokens)");
  }
  if (text && d.validation_tokens_size() > 0) {
    return Invalid("data.validation_tokens",
                   "goes with data.tokens; a data.corpus job validates on the corpus' held-out "
                   "tail (data.validation_fraction)");
  }
  if (text && !d.format().empty()) {
    return Invalid("data.format",
                   "is the format of data.tokens; a data.corpus text is read as bytes");
  }
  if (tokens) {
    RETURN_IF_ERROR(ValidateTokenPaths("data.tokens", d.tokens()));
    RETURN_IF_ERROR(ValidateTokenPaths("data.validation_tokens", d.validation_tokens()));
    RETURN_IF_ERROR(data::ParseTokenFormat(d.format()).status());
  }
  if (d.validation_tokens_size() > 0 && d.validation_fraction() != 0) {
    return Invalid("data.validation_fraction and data.validation_tokens",
                   "both given; with data.validation_tokens the whole of data.tokens trains, "
                   "so leave data.validation_fraction out");
  }
  if (d.has_validation_fraction()) {
    RETURN_IF_ERROR(CheckUnitInterval("data.validation_fraction", d.validation_fraction(),
                                      "it is the held-out share of the corpus, e.g. 0.05"));
  }
  if (d.validate_every_steps() < 0) {
    return Invalid("data.validate_every_steps",
                   absl::StrCat("must be >= 0 (got ", d.validate_every_steps(),
                                "); 0 means never"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsAutoSchedule(const pb::JobSpec& spec) { return spec.pipeline().schedule() == kAutoSchedule; }

bool SplitsOptimizer(const pb::JobSpec& spec) {
  const pb::PipelineSpec& p = spec.pipeline();
  planner::PlanOptions o;  // the planner's rule, on the two fields it reads
  o.replicas = p.replicas();
  o.shard_optimizer = !p.has_shard_optimizer() || p.shard_optimizer();
  return o.splits();
}

pb::JobSpec WithPlaceholderShape(pb::JobSpec spec) {
  pb::PipelineSpec* p = spec.mutable_pipeline();
  p->set_stages(1);
  p->set_replicas(1);
  p->set_micro_batches(1);
  p->set_chunks(1);
  p->set_schedule(planner::ScheduleName(planner::ScheduleKind::kGpipe));
  p->set_recompute(planner::RecomputeName(pb::RECOMPUTE_NEVER));
  return spec;
}

pb::JobSpec WithDefaults(pb::JobSpec spec) {
  pb::PipelineSpec* p = spec.mutable_pipeline();
  // "auto": the shape is the coordinator's to choose (coordinator/auto/auto_schedule.h).
  const bool chosen_later = IsAutoSchedule(spec);
  const bool file = !p->schedule_file().empty() || !p->schedule_program().empty();
  if (p->schedule().empty() && !file) {
    p->set_schedule(planner::ScheduleName(planner::kDefaultSchedule));
  }
  if (p->chunks() == 0 && file) {
    // The file's header says; a file that cannot be read is refused by validation.
    absl::StatusOr<schedule::StageProgram> header =
        planner::ScheduleFileHeader(p->schedule_program());
    if (header.ok()) p->set_chunks(header->num_chunks);
  }
  if (!chosen_later) {
    if (p->chunks() == 0 && !file) p->set_chunks(planner::DefaultChunks(p->schedule()));
    if (p->recompute().empty()) p->set_recompute(planner::RecomputeName(pb::RECOMPUTE_NEVER));
    if (p->micro_batches() == 0) p->set_micro_batches(p->stages());
    if (p->replicas() == 0) p->set_replicas(1);
  }
  pb::TrainingSpec* t = spec.mutable_training();
  if (!t->has_beta1()) t->set_beta1(kDefaultBeta1);
  if (!t->has_beta2()) t->set_beta2(kDefaultBeta2);
  if (!t->has_weight_decay()) t->set_weight_decay(kDefaultWeightDecay);
  pb::CheckpointSpec* c = spec.mutable_checkpoint();
  if (!c->has_snapshot_every_steps()) c->set_snapshot_every_steps(1);
  pb::FaultToleranceSpec* f = spec.mutable_fault_tolerance();
  if (!f->has_max_restarts()) f->set_max_restarts(3);
  if (!f->has_wait_for_stages_s()) f->set_wait_for_stages_s(60);
  pb::DataSpec* d = spec.mutable_data();
  // Separate validation files leave the whole training stream to training.
  if (!d->has_validation_fraction() && d->validation_tokens_size() == 0) {
    d->set_validation_fraction(kDefaultValidationFraction);
  }
  if (d->tokens_size() > 0 && d->format().empty()) {
    d->set_format(std::string(data::TokenFormatName(data::TokenFormat::kLlmc)));
  }
  // The first data file (its pattern, for a glob: WithDefaults reads no folder).
  const std::string& first =
      d->corpus().empty() && d->tokens_size() > 0 ? d->tokens(0) : d->corpus();
  if (spec.name().empty() && !first.empty()) {
    spec.set_name(std::filesystem::path(first).filename().string());
  }
  return spec;
}

namespace {

// "auto" leaves the shape to the planner: any part of it given as well is refused.
absl::Status CheckAutoShapeUnset(const pb::PipelineSpec& p) {
  const std::pair<const char*, bool> given[] = {
      {"pipeline.stages", p.stages() != 0},
      {"pipeline.replicas", p.replicas() != 0},
      {"pipeline.micro_batches", p.micro_batches() != 0},
      {"pipeline.chunks", p.chunks() != 0},
      {"pipeline.recompute", !p.recompute().empty()},
      {"pipeline.schedule_file", !p.schedule_file().empty() || !p.schedule_program().empty()}};
  for (const auto& [field, set] : given) {
    if (set) {
      return Invalid(field, absl::StrCat("is chosen by pipeline.schedule \"", kAutoSchedule,
                                         "\" (stages, replicas, micro-batches, schedule, "
                                         "chunks and recompute); remove ", field,
                                         ", or name a schedule to set it yourself"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const pb::JobSpec& spec) { return ValidatedPlanOptions(spec).status(); }

absl::StatusOr<planner::PlanOptions> ValidatedPlanOptions(const pb::JobSpec& spec) {
  if (IsAutoSchedule(spec)) {
    RETURN_IF_ERROR(CheckAutoShapeUnset(spec.pipeline()));
    return ValidatedPlanOptions(WithPlaceholderShape(spec));
  }
  if (!spec.has_model()) {
    return Invalid("model", "missing; give vocab_size, seq_len, d_model, n_heads and n_layers "
                            "(see examples/tiny-gpt.json)");
  }
  // Model shape, schedule and recompute names, (K, M, v), pipeline.replicas' range and
  // the batch's split into R x M.
  ASSIGN_OR_RETURN(const planner::PlanOptions options, planner::OptionsFromJobSpec(spec));
  const int layers = options.model.num_pipeline_layers();
  const int parts = options.stages * options.chunks;
  if (parts > layers) {
    return Invalid(options.chunks > 1 ? "pipeline.stages x pipeline.chunks" : "pipeline.stages",
                   absl::StrCat(parts, " is more than the model's ", layers,
                                " pipeline layers (embedding, ", options.model.n_layers,
                                " blocks, head); every stage needs at least one layer, so lower "
                                "it or raise model.n_layers"));
  }
  RETURN_IF_ERROR(ValidateTraining(spec.training(), spec.init_from().empty()));
  RETURN_IF_ERROR(ValidateData(spec.data()));
  if (spec.checkpoint().every_steps() < 0) {
    return Invalid("checkpoint.every_steps",
                   absl::StrCat("must be >= 0 (got ", spec.checkpoint().every_steps(),
                                "); 0 writes one checkpoint at the end"));
  }
  if (spec.checkpoint().snapshot_every_steps() < 0) {
    return Invalid("checkpoint.snapshot_every_steps",
                   absl::StrCat("must be >= 0 (got ", spec.checkpoint().snapshot_every_steps(),
                                "); 0 turns in-memory snapshots off"));
  }
  const pb::FaultToleranceSpec& f = spec.fault_tolerance();
  if (f.max_restarts() < 0 || f.max_restarts() > 1000) {
    return Invalid("fault_tolerance.max_restarts",
                   absl::StrCat("must be in [0, 1000] (got ", f.max_restarts(),
                                "); 0 fails the job on its first lost stage"));
  }
  if (f.wait_for_stages_s() < 0 || f.wait_for_stages_s() > 86400) {
    return Invalid("fault_tolerance.wait_for_stages_s",
                   absl::StrCat("must be in [0, 86400] seconds (got ", f.wait_for_stages_s(),
                                ")"));
  }
  return options;
}

}  // namespace pipetrain::coordinator
