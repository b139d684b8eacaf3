#include "client/export_hf_verb.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "common/flags.h"
#include "common/model/checkpoint_folder.h"
#include "common/model/hf_folder.h"
#include "common/model/model_family.h"

namespace pipetrain::client {
namespace {

// What was written, on success.
std::string Summary(const std::string& out_dir, const model::Checkpoint& checkpoint,
                    absl::string_view dtype) {
  const model::TransformerConfig& config = checkpoint.config;
  int64_t params = 0;
  for (const auto& [name, t] : checkpoint.params) params += t.num_elements();
  return absl::StrFormat(
      "wrote %s: %s and %s in %s, %d parameters in %d tensors (%s, %s embeddings)%s\n",
      out_dir, model::kHfConfigFileName, model::kHfWeightsFileName, dtype, params,
      checkpoint.params.size(), model::DescribeModel(config),
      config.tie_embeddings ? "tied" : "untied",
      checkpoint.optimizer ? "; the optimizer state is left out" : "");
}

}  // namespace

int RunExportHf(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string out_dir, dtype_name = "fp32";
  bool help = false;
  common::FlagSet flags(
      "pipetrain export-hf", "CHECKPOINT --out DIR [--dtype fp32|bf16]",
      "Writes a whole-model checkpoint as a Hugging Face folder of its family, for\n"
      "GPT2LMHeadModel.from_pretrained(DIR) (model.architecture gpt2) or\n"
      "LlamaForCausalLM.from_pretrained(DIR) (llama): DIR/model.safetensors (F32, or BF16\n"
      "with --dtype bf16; Hugging Face's tensor names, lm_head.weight only when the\n"
      "embeddings are untied, no optimizer state) and DIR/config.json (model_type gpt2 or\n"
      "llama, the model's sizes, gpt2: activation gelu_new and dropout 0 as pipetrain\n"
      "trains; llama: silu, num_key_value_heads, rope_theta, rope_scaling, rms_norm_eps and\n"
      "max_position_embeddings = the job's seq_len; torch_dtype float32 or bfloat16), each\n"
      "replaced atomically. CHECKPOINT is a job's checkpoint folder (with\n"
      "model.safetensors.index.json), one whole-model safetensors file (pipetrain init,\n"
      "train-local --save) or a Hugging Face folder. Checkpoints hold fp32 weights\n"
      "whatever training.precision was; bf16 rounds each to the nearest bf16 (ties to even).\n"
      "Exit codes: 0 written, 1 DIR could not be written, 2 usage error or an unreadable,\n"
      "invalid or partial checkpoint.");
  flags.AddString("out", &out_dir, "the folder to write (created if needed)", "DIR");
  flags.AddString("dtype", &dtype_name,
                  "the weights' dtype: fp32 (as the checkpoint holds them) or bf16 (rounded to "
                  "nearest even, half the bytes)",
                  "fp32|bf16");
  flags.AddBool("help", &help, "print this help and exit");
  flags.MarkRequired("out");
  std::vector<std::string> positionals;
  if (auto exit = ParseVerbFlags(flags, args, help, out, err, &positionals)) return *exit;
  auto usage = [&](absl::string_view message) { return UsageError(flags, message, err); };
  if (positionals.size() != 1) {
    return usage(positionals.empty()
                     ? "CHECKPOINT is required (a checkpoint folder or safetensors file)"
                     : "takes one CHECKPOINT");
  }
  if (out_dir.empty()) return usage("--out DIR is required (the folder to write)");
  const absl::StatusOr<model::HfWeightsDType> dtype = model::HfWeightsDTypeNamed(dtype_name);
  if (!dtype.ok()) return usage(absl::StrCat("--dtype: ", dtype.status().message()));
  const std::string& path = positionals[0];

  auto checkpoint = model::LoadWholeModel(path, "CHECKPOINT", "a Hugging Face folder");
  if (!checkpoint.ok()) {
    err << "pipetrain export-hf: " << checkpoint.status().message() << "\n";
    return kExitUsage;
  }
  if (absl::Status s = model::ExportHfFolder(*checkpoint, out_dir, *dtype); !s.ok()) {
    err << "pipetrain export-hf: cannot write " << out_dir << ": " << s.message() << "\n";
    return kExitJobFailed;
  }
  out << Summary(out_dir, *checkpoint, dtype->name);
  return kExitOk;
}

}  // namespace pipetrain::client
