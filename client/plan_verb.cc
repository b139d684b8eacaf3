#include "client/plan_verb.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "client/costs_from.h"
#include "client/remote.h"
#include "client/schedule_file_read.h"
#include "common/flags.h"
#include "common/model/precision.h"
#include "common/status_macros.h"
#include "common/user_path.h"
#include "coordinator/spec/job_spec.h"
#include "coordinator/planner/auto_plan.h"
#include "coordinator/planner/plan_report.h"
#include "coordinator/planner/planner.h"
#include "common/schedule/stage_program.h"
#include "google/protobuf/util/json_util.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::client {

namespace pb = ::pipetrain::v1;

namespace {

// --schedule NAME or --schedule-file FILE (relative to here) in place of the spec's
// schedule, and the spec's own schedule file read (relative to the spec's folder).
// A schedule chosen here takes its own default chunks unless --chunks says
// (`chunks_given`).
absl::Status ApplyScheduleFlags(const std::string& name, const std::string& file,
                                bool chunks_given, const std::string& spec_path,
                                pb::JobSpec& spec) {
  pb::PipelineSpec* p = spec.mutable_pipeline();
  if (!name.empty() && !file.empty()) {
    return absl::InvalidArgumentError("give --schedule or --schedule-file, not both");
  }
  if (!name.empty() || !file.empty()) {
    p->clear_schedule();
    p->clear_schedule_file();
    p->clear_schedule_program();
    if (!chunks_given) p->clear_chunks();
  }
  if (!name.empty()) p->set_schedule(name);
  if (!file.empty()) {
    p->set_schedule_file(file);
    return ReadScheduleFile(spec, "");
  }
  return ReadScheduleFile(spec, spec_path);
}

// --auto: the search's result into `result`, and the plan of its choice.
absl::StatusOr<planner::Plan> AutoPlan(const planner::PlanOptions& base, int devices,
                                       planner::AutoResult* result) {
  ASSIGN_OR_RETURN(*result, planner::SearchPlans(base, {.max_devices = devices}));
  return *result->best().plan;
}

// The programs without the sends and receives lowering added: what a schedule file
// holds.
std::string ComputeOnlyText(const schedule::Schedule& lowered) {
  schedule::Schedule compute = lowered;
  for (schedule::StageProgram& program : compute) {
    std::erase_if(program.actions,
                  [](const schedule::Action& a) { return schedule::IsCommunication(a.kind); });
  }
  return schedule::ToText(compute);
}

// The job and its latest timelines from the coordinator; `measured` gets the fit (or why
// there is none). Returns the exit code of a failed call, else kExitOk.
int FetchMeasuredJob(const RemoteFlags& connection, const std::string& job_id, std::ostream& err,
                     absl::StatusOr<MeasuredJob>* measured) {
  Remote remote("plan", connection);
  pb::JobStatus job;
  if (grpc::Status st = remote.GetJob(job_id, &job); !st.ok()) return remote.Fail(st, err);
  pb::Timeline timeline;
  {
    grpc::ClientContext context;
    remote.PrepareUnary(context);
    pb::GetTimelineRequest request;
    request.set_job_id(job_id);
    request.set_last_steps(20);  // the coordinator keeps at most this many
    grpc::Status st = remote.stub().GetTimeline(&context, request, &timeline);
    // A job from before the coordinator's last start has no timeline: its stored rates.
    if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      timeline.Clear();
    } else if (!st.ok()) {
      return remote.Fail(st, err);
    }
  }
  *measured = MeasuredJobFrom(job, timeline);
  return kExitOk;
}

}  // namespace

int RunPlan(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  int64_t stages = 0, micro_batches = 0, chunks = 0, replicas = 0;
  std::string schedule_name, schedule_file, recompute, partition = "cost", trace, costs_from;
  RemoteFlags connection;
  bool equal = false, json = false, help = false, print_schedule = false, automatic = false;
  int64_t devices = 0, stages_per_device = 1, device_slots = 1;
  double device_tflops = 100, link_gbps = 10, memory_cap_gib = 0, collective_gbps = 0;
  common::FlagSet flags(
      "pipetrain plan", "JOB.json [flags]",
      "Plans a job offline: partitions the model over the stages, generates the schedule,\n"
      "validates it and predicts the step time, bubble and memory with the simulator.\n"
      "Flags override the job spec's pipeline fields. With --costs-from JOB_ID the costs are\n"
      "the ones that job measured on its latest steps (kept by the coordinator at --address\n"
      "while it runs): what would this model take with another schedule, K or M on the same\n"
      "hardware? With --replicas R (or pipeline.replicas) it plans R data-parallel copies of\n"
      "the pipeline: each takes batch_size / R sequences, and each stage's gradient ring\n"
      "all-reduce between its R copies is part of the predicted step; unless the spec's\n"
      "pipeline.shard_optimizer is false the copies split AdamW's moments, and the memory\n"
      "counts 1/R of them (the plan prints the bytes a parameter takes both ways).\n\n"
      "Schedules (--schedule):\n" +
          planner::ScheduleHelp() + "\nRecompute modes (--recompute):\n" +
          planner::RecomputeHelp() + "\nPrecisions (the spec's training.precision):\n" +
          std::string(absl::StripTrailingAsciiWhitespace(model::PrecisionHelp())));
  flags.AddInt("stages", &stages, "K, number of stages (0 = from the spec)", "K");
  flags.AddInt("micro-batches", &micro_batches, "M, micro-batches per step (0 = from the spec)",
               "M");
  flags.AddInt("replicas", &replicas,
               "R, data-parallel copies of the pipeline (0 = from the spec, which defaults to 1)",
               "R");
  flags.AddString("schedule", &schedule_name, planner::ScheduleNameList(), "NAME");
  flags.AddString("schedule-file", &schedule_file,
                  "a schedule written by hand, in the text form --print-schedule prints "
                  "(docs/SCHEDULES.md), instead of --schedule",
                  "FILE");
  flags.AddBool("auto", &automatic,
                "search every K, R, M, schedule, chunks and recompute mode on --devices stage "
                "servers under --memory-cap-gib and plan the fastest predicted (with the "
                "analytic or --costs-from costs)");
  flags.AddInt("devices", &devices,
               "with --auto, the stage servers to plan for (0 = the spec's stages x replicas)",
               "N");
  flags.AddInt("stages-per-device", &stages_per_device,
               "stage servers that share one device, in their order (several stages on one "
               "GPU, or on the cores of one host): they take turns computing (1 = a device "
               "each)",
               "N");
  flags.AddInt("device-slots", &device_slots,
               "with --stages-per-device, how many of a device's stages compute at full "
               "speed at once (a GPU 1; a host its cores over a stage's threads)",
               "S");
  flags.AddBool("print-schedule", &print_schedule,
                "print the plan's schedule in the text form a schedule file takes, and exit");
  flags.AddInt("chunks", &chunks,
               "v, model chunks per stage for a chunked schedule (0 = from the spec)", "V");
  flags.AddString("recompute", &recompute, planner::RecomputeNameList(), "MODE");
  flags.AddBool(
      "equal-stage-cost", &equal,
      "forward 1 unit, backward 2 units on every stage, free transfer (the formulas' setting)");
  flags.AddString("partition", &partition, "split the layers by count, params or cost (FLOPs)",
                  "MODE");
  flags.AddDouble("device-flops", &device_tflops, "achieved TFLOP/s of one device (100 means 1e14 FLOP/s)", "TFLOPS");
  flags.AddDouble("link-gbps", &link_gbps, "stage-to-stage bandwidth in GB/s", "GBPS");
  flags.AddDouble("collective-gbps", &collective_gbps,
                  "bandwidth between the R copies of a stage for the gradient all-reduce, in "
                  "GB/s (0 = --link-gbps)",
                  "GBPS");
  flags.AddDouble("memory-cap-gib", &memory_cap_gib, "memory per stage in GiB (0 = unlimited)",
                  "GIB");
  flags.AddString("costs-from", &costs_from,
                  "use the costs measured by this job (same model, same hardware) instead of "
                  "--device-flops and --link-gbps",
                  "JOB_ID");
  AddRemoteFlags(flags, &connection);
  flags.AddBool("json", &json, "print the plan as one JSON object");
  flags.AddString("trace", &trace, "write the predicted timeline as Chrome trace JSON", "FILE");
  flags.AddBool("help", &help, "print this help and exit");
  auto positionals = flags.Parse(args);
  if (!positionals.ok()) {
    err << "pipetrain plan: " << positionals.status().message()
        << "\nRun 'pipetrain plan --help' for usage.\n";
    return kExitUsage;
  }
  if (help) {
    out << flags.Help();
    return kExitOk;
  }
  if (devices != 0 && !automatic) {
    err << "pipetrain plan: --devices is the stage servers --auto may use; add --auto, or "
           "give the shape with --stages and --replicas\n";
    return kExitUsage;
  }
  if (positionals->size() != 1) {
    err << "pipetrain plan: takes one job spec file (JOB.json)\n"
           "Run 'pipetrain plan --help' for usage.\n";
    return kExitUsage;
  }
  const std::string& path = (*positionals)[0];
  absl::StatusOr<std::string> text =
      common::ReadRegularFile(path, common::kMaxJsonFileBytes, "job spec");
  if (!text.ok()) {
    err << "pipetrain plan: " << text.status().message() << "\n";
    return kExitUsage;
  }
  pipetrain::v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions parse_options;
  if (auto st = google::protobuf::util::JsonStringToMessage(*text, &spec, parse_options);
      !st.ok()) {
    err << "pipetrain plan: " << path << ": invalid job spec: " << st.message() << "\n";
    return kExitUsage;
  }
  pipetrain::v1::PipelineSpec* p = spec.mutable_pipeline();
  if (stages != 0) p->set_stages(static_cast<int>(stages));
  if (micro_batches != 0) p->set_micro_batches(static_cast<int>(micro_batches));
  if (chunks != 0) p->set_chunks(static_cast<int>(chunks));
  if (replicas != 0) p->set_replicas(static_cast<int>(replicas));
  if (absl::Status s = ApplyScheduleFlags(schedule_name, schedule_file, chunks != 0, path, spec);
      !s.ok()) {
    err << "pipetrain plan: " << path << ": " << s.message() << "\n";
    return kExitUsage;
  }
  if (!recompute.empty()) p->set_recompute(recompute);
  // As at submit: a chunked schedule without chunks takes its default (2); a schedule
  // file, its header's.
  if (p->chunks() == 0 && p->schedule_program().empty()) {
    p->set_chunks(planner::DefaultChunks(p->schedule()));
  }

  // Snapshots are on unless the spec turns them off, as for a submitted job, so the
  // memory shown is what the job will take.
  *spec.mutable_checkpoint() = coordinator::WithDefaults(spec).checkpoint();
  auto options = planner::OptionsFromJobSpec(spec);
  auto mode = planner::ParsePartitionMode(partition);
  if (!options.ok() || !mode.ok()) {
    err << "pipetrain plan: " << path << ": "
        << (options.ok() ? mode.status() : options.status()).message() << "\n";
    return kExitUsage;
  }
  if (device_tflops <= 0 || link_gbps <= 0 || memory_cap_gib < 0 || collective_gbps < 0) {
    err << "pipetrain plan: --device-flops and --link-gbps must be > 0, --memory-cap-gib and "
           "--collective-gbps >= 0\n";
    return kExitUsage;
  }
  options->partition = *mode;
  options->equal_stage_cost = equal;
  options->device_flops = device_tflops * 1e12;
  options->link_bytes_per_s = link_gbps * 1e9;
  options->collective_bytes_per_s = collective_gbps * 1e9;
  options->memory_cap_bytes = memory_cap_gib * 1024 * 1024 * 1024;
  if (stages_per_device < 1 || device_slots < 1) {
    err << "pipetrain plan: --stages-per-device and --device-slots must be >= 1\n";
    return kExitUsage;
  }
  if (stages_per_device > 1) {
    const int servers = automatic && devices > 0 ? static_cast<int>(devices)
                                                 : options->stages * options->replicas;
    options->devices = planner::EvenlyShared(servers, static_cast<int>(stages_per_device),
                                             static_cast<int>(device_slots));
  }
  std::string measured_line;
  absl::StatusOr<planner::Plan> plan;
  if (costs_from.empty()) {
    if (!automatic) plan = planner::MakePlan(*options);
  } else {
    if (!CheckRemoteFlags(flags, &connection, err)) return kExitUsage;
    absl::StatusOr<MeasuredJob> measured;
    if (int code = FetchMeasuredJob(connection, costs_from, err, &measured); code != kExitOk) {
      return code;
    }
    if (!measured.ok()) {
      err << "pipetrain plan: " << measured.status().message() << "\n";
      return kExitUsage;
    }
    if (!(measured->plan.options.model == options->model)) {
      err << "pipetrain plan: warning: " << costs_from << " trained another model than "
          << path << "; its rates per FLOP, byte and parameter are used as they are\n";
    }
    measured_line = DescribeMeasured(costs_from, *measured);
    if (automatic) options->rates = measured->rates;
    if (!automatic) plan = PlanWithMeasuredCosts(*options, *measured);
  }
  planner::AutoResult search;
  if (automatic) {
    const int n = devices > 0 ? static_cast<int>(devices) : options->stages * options->replicas;
    plan = AutoPlan(*options, n, &search);
    if (plan.ok() && !json) out << measured_line << planner::RenderAutoReport(search) << "\n";
  }
  if (!plan.ok()) {
    err << "pipetrain plan: " << plan.status().message() << "\n";
    return kExitUsage;
  }
  if (print_schedule) {
    out << ComputeOnlyText(plan->programs);
    return kExitOk;
  }
  if (!trace.empty()) {
    std::ofstream t(trace);
    t << planner::ChromeTrace(plan->simulation, plan->options.stages);
    if (!t) {
      err << "pipetrain plan: cannot write " << trace << "\n";
      return kExitUsage;
    }
  }
  if (json) {
    const std::string j = planner::PlanJson(*plan);
    out << (automatic ? planner::AddAutoReportJson(j, search) : j) << "\n";
    return kExitOk;
  }
  out << measured_line << planner::RenderPlanText(*plan);
  return kExitOk;
}

}  // namespace pipetrain::client
