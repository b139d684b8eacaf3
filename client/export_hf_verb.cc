#include "client/export_hf_verb.h"

#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "common/flags.h"
#include "common/model/checkpoint_folder.h"
#include "common/model/hf_folder.h"

namespace pipetrain::client {

int RunExportHf(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string out_dir;
  bool help = false;
  common::FlagSet flags("pipetrain export-hf", "CHECKPOINT --out DIR",
                        "Writes a whole-model checkpoint as a Hugging Face GPT-2 folder, for\n"
                        "GPT2LMHeadModel.from_pretrained(DIR): DIR/model.safetensors (F32, "
                        "transformer.*\n"
                        "names, lm_head.weight only when the embeddings are untied, no optimizer "
                        "state) and\n"
                        "DIR/config.json (model_type gpt2, the model's sizes, activation "
                        "gelu_new, dropout 0\n"
                        "as pipetrain trains), each replaced atomically. CHECKPOINT is a job's "
                        "checkpoint\n"
                        "folder (with model.safetensors.index.json), one whole-model safetensors "
                        "file\n"
                        "(pipetrain init, train-local --save) or a Hugging Face GPT-2 folder.\n"
                        "Exit codes: 0 written, 1 DIR could not be written, 2 usage error or an "
                        "unreadable,\n"
                        "invalid or partial checkpoint.");
  flags.AddString("out", &out_dir, "the folder to write (created if needed)", "DIR");
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
  const std::string& path = positionals[0];

  auto checkpoint = model::LoadWholeModel(path, "CHECKPOINT", "a Hugging Face folder");
  if (!checkpoint.ok()) {
    err << "pipetrain export-hf: " << checkpoint.status().message() << "\n";
    return kExitUsage;
  }
  const model::GptConfig& config = checkpoint->config;
  if (absl::Status s = model::ExportHfFolder(*checkpoint, out_dir); !s.ok()) {
    err << "pipetrain export-hf: cannot write " << out_dir << ": " << s.message() << "\n";
    return kExitJobFailed;
  }
  int64_t params = 0;
  for (const auto& [name, t] : checkpoint->params) params += t.num_elements();
  out << absl::StrFormat(
      "wrote %s: %s and %s, %d parameters in %d tensors (vocab_size %d, "
      "n_positions %d, n_embd "
      "%d, n_head %d, n_layer %d, %s embeddings)%s\n",
      out_dir, model::kHfConfigFileName, model::kHfWeightsFileName, params,
      checkpoint->params.size(), config.vocab_size, config.seq_len, config.d_model, config.n_heads,
      config.n_layers, config.tie_embeddings ? "tied" : "untied",
      checkpoint->optimizer ? "; the optimizer state is left out" : "");
  return kExitOk;
}

}  // namespace pipetrain::client
