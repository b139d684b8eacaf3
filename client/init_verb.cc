#include "client/init_verb.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "client/local_model.h"
#include "common/flags.h"
#include "common/model/checkpoint.h"
#include "common/model/model_family.h"
#include "common/status_macros.h"
#include "stage_server/compute/chunk_checkpoint.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/model_chunk.h"

namespace pipetrain::client {

int RunInit(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string model_arg, out_path;
  int64_t seed = 0;
  bool help = false;
  common::FlagSet flags(
      "pipetrain init", "--model JSON --out FILE [--seed S]",
      "Writes a freshly initialised whole-model checkpoint: safetensors with the Hugging\n"
      "Face GPT-2 names, the model config in its metadata. The weights depend only on the\n"
      "config and the seed, and equal those a pipeline job with that seed starts from.\n"
      "Exit codes: 0 written, 1 the file could not be written, 2 usage error or invalid\n"
      "model.");
  AddModelFlag(flags, &model_arg);
  flags.AddInt("seed", &seed, "initialisation seed (>= 0)", "S");
  flags.AddString("out", &out_path, "the checkpoint file to write (replaced atomically)", "FILE");
  flags.AddBool("help", &help, "print this help and exit");
  flags.MarkRequired("out");
  if (auto exit = ParseVerbFlags(flags, args, help, out, err)) return *exit;
  auto usage = [&](absl::string_view message) { return UsageError(flags, message, err); };
  if (out_path.empty()) return usage("--out FILE is required (where to write the checkpoint)");
  if (seed < 0) return usage(absl::StrCat("--seed must be >= 0 (got ", seed, ")"));
  auto config = ParseModelArg(model_arg);
  if (!config.ok()) {
    err << "pipetrain init: " << config.status().message() << "\n";
    return kExitUsage;
  }
  auto checkpoint = [&]() -> absl::StatusOr<model::Checkpoint> {
    ASSIGN_OR_RETURN(auto backend, compute::CpuBackend::Create(1));
    ASSIGN_OR_RETURN(auto chunk, compute::ModelChunk::Create(
                                     *config, 0, config->num_pipeline_layers(), backend.get()));
    RETURN_IF_ERROR(chunk->Initialize(static_cast<uint64_t>(seed)));
    return compute::CheckpointOfChunk(*chunk, /*with_optimizer=*/false);
  }();
  if (!checkpoint.ok()) {
    err << "pipetrain init: " << checkpoint.status().message() << "\n";
    return kExitJobFailed;
  }
  if (absl::Status s = model::SaveCheckpoint(out_path, *checkpoint); !s.ok()) {
    err << "pipetrain init: cannot write " << out_path << ": " << s.message() << "\n";
    return kExitJobFailed;
  }
  int64_t params = 0;
  for (const auto& [name, t] : checkpoint->params) params += t.num_elements();
  out << absl::StrFormat(
      "wrote %s: %d parameters in %d tensors, seed %d (%s)\n", out_path, params,
      checkpoint->params.size(), seed, model::DescribeModel(*config));
  return kExitOk;
}

}  // namespace pipetrain::client
