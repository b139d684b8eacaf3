#include "client/train_local_verb.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "client/local_model.h"
#include "common/flags.h"
#include "common/model/checkpoint.h"
#include "common/model/model_family.h"
#include "common/model/precision.h"
#include "nlohmann/json.hpp"
#include "stage_server/compute/chunk_checkpoint.h"
#include "stage_server/compute/trainer.h"

namespace pipetrain::client {

int RunTrainLocal(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string model_arg, text_path, save_path, precision = "fp32";
  int64_t steps = 0, batch = 0, seed = 0, threads = 1;
  const compute::OptimizerSettings defaults;
  double lr = defaults.lr;
  bool json = false, help = false;
  common::FlagSet flags(
      "pipetrain train-local", "--model JSON --text FILE --steps N --batch B [flags]",
      "Trains the whole model in this process on the cpu backend (the reference every\n"
      "pipeline run is compared with) and prints each step's loss, step time and tokens/s.\n"
      "Each step trains on B rows of seq_len + 1 bytes drawn from the text at offsets that\n"
      "depend only on the seed and the step; weights are initialised from the seed as by\n"
      "pipetrain init. AdamW (betas 0.9, 0.999, eps 1e-8, no weight decay, no clipping).\n"
      "Exit codes: 0 trained, 1 training or writing --save failed, 2 usage error, invalid\n"
      "model or an unreadable or too short text.");
  AddModelFlag(flags, &model_arg);
  flags.AddString("text", &text_path, "the training text; its bytes are the tokens", "FILE");
  flags.AddInt("steps", &steps, "optimizer steps to run (>= 1)", "N");
  flags.AddInt("batch", &batch, "B, rows of seq_len + 1 bytes per step (>= 1)", "B");
  flags.AddInt("seed", &seed, "seed of the initial weights and of the batches (>= 0)", "S");
  flags.AddDouble("lr", &lr, "AdamW learning rate (> 0)", "X");
  flags.AddInt("threads", &threads, "compute threads (>= 1)", "N");
  flags.AddString("precision", &precision,
                  "fp32, or bf16: products of bf16 operands summed in fp32, bf16 activations",
                  "P");
  flags.AddString("save", &save_path,
                  "write the trained weights here as a checkpoint (no optimizer state)", "FILE");
  flags.AddBool("json", &json,
                "print one JSON object a line per step: "
                "{\"step\",\"loss\",\"step_time_s\",\"tokens_per_s\"}, and nothing else");
  flags.AddBool("help", &help, "print this help and exit");
  flags.MarkRequired("text");
  flags.MarkRequired("steps");
  flags.MarkRequired("batch");
  if (auto exit = ParseVerbFlags(flags, args, help, out, err)) return *exit;
  auto usage = [&](absl::string_view message) { return UsageError(flags, message, err); };
  if (text_path.empty()) return usage("--text FILE is required");
  if (steps < 1) {
    return usage(absl::StrCat("--steps N is required and must be >= 1 (got ", steps, ")"));
  }
  if (batch < 1) {
    return usage(absl::StrCat("--batch B is required and must be >= 1 (got ", batch, ")"));
  }
  if (seed < 0) return usage(absl::StrCat("--seed must be >= 0 (got ", seed, ")"));
  if (!(lr > 0) || !std::isfinite(lr)) {
    return usage(absl::StrCat("--lr must be a finite number > 0 (got ", lr, ")"));
  }
  if (threads < 1) return usage(absl::StrCat("--threads must be >= 1 (got ", threads, ")"));
  const absl::StatusOr<model::Precision> named = model::PrecisionNamed(precision);
  if (!named.ok()) return usage(absl::StrCat("--precision: ", named.status().message()));
  for (const auto& [flag, value, most] : {std::tuple{"--steps", steps, int64_t{1} << 30},
                                          {"--batch", batch, int64_t{1} << 20},
                                          {"--threads", threads, int64_t{1024}}}) {
    if (value > most) return usage(absl::StrCat(flag, " ", value, " is more than ", most));
  }
  if (!save_path.empty()) {
    // Found out now rather than after the training.
    const std::filesystem::path folder =
        std::filesystem::absolute(std::filesystem::path(save_path)).parent_path();
    std::error_code ec;
    if (!std::filesystem::is_directory(folder, ec)) {
      return usage(
          absl::StrCat("--save ", save_path, ": the folder ", folder.string(), " does not exist"));
    }
  }
  auto config = ParseModelArg(model_arg);
  if (!config.ok()) {
    err << "pipetrain train-local: " << config.status().message() << "\n";
    return kExitUsage;
  }
  auto text = ReadFile(text_path);
  if (!text.ok()) {
    err << "pipetrain train-local: --text: " << text.status().message() << "\n";
    return kExitUsage;
  }
  const int64_t row_bytes = int64_t{config->seq_len} + 1;
  if (static_cast<int64_t>(text->size()) < row_bytes) {
    err << absl::StrFormat(
        "pipetrain train-local: --text: %s has %d bytes; a row of seq_len %d + 1 bytes needs "
        "at least %d (give a longer text or a smaller model.seq_len)\n",
        text_path, text->size(), config->seq_len, row_bytes);
    return kExitUsage;
  }
  if (config->vocab_size < 256) {
    for (size_t i = 0; i < text->size(); ++i) {
      const int byte = static_cast<unsigned char>((*text)[i]);
      if (byte >= config->vocab_size) {
        err << absl::StrFormat(
            "pipetrain train-local: --text: %s: byte %d (offset %d) is outside the vocabulary "
            "(model.vocab_size %d)\n",
            text_path, byte, i, config->vocab_size);
        return kExitUsage;
      }
    }
  }

  compute::TrainOptions options;
  options.model = *config;
  options.steps = static_cast<int>(steps);
  options.batch = static_cast<int>(batch);
  options.seed = static_cast<uint64_t>(seed);
  options.optimizer.lr = static_cast<float>(lr);
  options.threads = static_cast<int>(threads);
  options.precision = *named;
  auto trainer = compute::Trainer::Create(options, *std::move(text));
  if (!trainer.ok()) {
    err << "pipetrain train-local: " << trainer.status().message() << "\n";
    return kExitJobFailed;
  }
  if (!json) {
    out << absl::StrFormat(
        "training %d steps of %d rows x %d tokens (%s, %d parameters), lr %g, seed %d, "
        "%d thread%s\n",
        steps, batch, config->seq_len, model::DescribeModel(*config),
        (*trainer)->model().NumParams(), lr, seed, threads, threads == 1 ? "" : "s");
    out.flush();
  }
  double total_seconds = 0, first_loss = 0, last_loss = 0;
  for (int64_t i = 0; i < steps; ++i) {
    auto stats = (*trainer)->Step();
    if (!stats.ok()) {
      err << "pipetrain train-local: step " << i + 1 << ": " << stats.status().message() << "\n";
      return kExitJobFailed;
    }
    if (i == 0) first_loss = stats->loss;
    last_loss = stats->loss;
    total_seconds += stats->seconds;
    if (json) {
      const nlohmann::ordered_json j = {{"step", stats->step},
                                        {"loss", stats->loss},
                                        {"step_time_s", stats->seconds},
                                        {"tokens_per_s", stats->tokens_per_second}};
      out << j.dump() << "\n";
    } else {
      out << absl::StrFormat("step %*d/%d  loss %.4f  %8.1f ms  %10.0f tokens/s\n",
                             absl::StrCat(steps).size(), stats->step, steps, stats->loss,
                             stats->seconds * 1e3, stats->tokens_per_second);
    }
    out.flush();
    if (!std::isfinite(stats->loss)) {
      err << "pipetrain train-local: step " << stats->step << ": the loss is " << stats->loss
          << "; stopping (try a smaller --lr)\n";
      return kExitJobFailed;
    }
  }
  if (!json) {
    out << absl::StrFormat(
        "done: %d steps in %.3f s, loss %.4f -> %.4f, %.0f tokens/s overall\n", steps,
        total_seconds, first_loss, last_loss,
        static_cast<double>(steps) * batch * config->seq_len / std::max(total_seconds, 1e-9));
  }
  if (!save_path.empty()) {
    auto trained = compute::CheckpointOfChunk((*trainer)->model(), /*with_optimizer=*/false);
    // The file records the precision it was trained in (its weights are fp32 in each).
    const absl::StatusOr<model::Precision> trained_in = model::PrecisionNamed(precision);
    if (trained.ok() && trained_in.ok()) trained->precision = std::string(trained_in->name);
    absl::Status s = trained.ok() ? model::SaveCheckpoint(save_path, *trained) : trained.status();
    if (!s.ok()) {
      err << "pipetrain train-local: --save: cannot write " << save_path << ": " << s.message()
          << "\n";
      return kExitJobFailed;
    }
    if (!json) out << "saved the trained weights to " << save_path << "\n";
  }
  return kExitOk;
}

}  // namespace pipetrain::client
