// pipetrain-bench NAME [--json]: runs one benchmark and prints its figures.
#include <unistd.h>

#include <iostream>

#include "absl/strings/str_format.h"
#include "bench/allreduce_bench.h"
#include "bench/benchmark.h"
#include "bench/compute_bench.h"
#include "bench/cuda_bench.h"
#include "bench/link_processes.h"
#include "common/flags.h"
#include "common/malloc_tuning.h"
#include "common/rpc_security.h"
#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  using namespace pipetrain;
  common::KeepFreedMemoryForReuse();
  // `allreduce`'s processes: hidden, not a benchmark of its own.
  if (argc > 1 && std::string(argv[1]) == "--allreduce-worker") {
    return bench::RunAllreduceWorker(argc, argv);
  }
  if (argc > 1 && std::string(argv[1]) == "--cuda-ipc-worker") {
    return bench::RunCudaIpcWorker(argc, argv);
  }
  // `link --same-host`'s receiving stage process: hidden too.
  if (argc > 1 && std::string(argv[1]) == "--link-worker") {
    return bench::RunLinkWorker(argc, argv);
  }
  bool help = false, version = false, json = false, list = false, same_host = false;
  int64_t reps = 0;
  std::string precision = "fp32", tokenizer = "gpt2", model = "gpt2", replicas;
  common::SecurityFlags security_flags;
  common::FlagSet flags("pipetrain-bench",
                        "NAME [--json] [--repetitions N] [--precision fp32|bf16] "
                        "[--tokenizer gpt2|llama3] [--model gpt2|llama] [--same-host] [--replicas 1,2,4] "
                        "| --list",
                        "Runs benchmark NAME and prints its figures. Each benchmark "
                        "measures its own\nbaseline in the same run; ratios are what to "
                        "compare across machines.");
  flags.AddBool("json", &json, "print the figures as one JSON object");
  flags.AddInt("repetitions", &reps, "timed repetitions (0: the benchmark's default)");
  flags.AddString("precision", &precision,
                  "fp32 or bf16: the products' operands where the benchmark trains (compute)");
  flags.AddString("tokenizer", &tokenizer,
                  "gpt2 or llama3: the BPE that tokenize measures, against npm's gpt-3-encoder "
                  "or llama3-tokenizer-js");
  flags.AddString("model", &model,
                  "gpt2 or llama: the model compute trains (llama: Llama-3.2-1B's proportions "
                  "at the GPT-2 model's size)");
  flags.AddBool("same-host", &same_host,
                "link: also two stage processes, on the stream and on the same-host path (shared "
                "memory), against one memcpy of the bytes");
  flags.AddString("replicas", &replicas,
                  "model-size: the largest model on R = each of these data-parallel copies of "
                  "one stage (comma-separated, from 1), the optimizer split among them, instead "
                  "of on K stages");
  common::AddSecurityFlags(flags, &security_flags, "");  // link: mutual TLS instead of plaintext
  flags.AddBool("list", &list, "list the benchmarks and exit");
  flags.AddBool("help", &help, "print this help and exit");
  flags.AddBool("version", &version, "print the version and exit");
  auto positionals = flags.Parse(common::Args(argc, argv));
  absl::Status st = positionals.status();
  if (st.ok() && positionals->size() != 1 && !list && !help && !version) {
    st = absl::InvalidArgumentError("give exactly one benchmark NAME (see --list)");
  }
  const absl::StatusOr<model::Precision> named = model::PrecisionNamed(precision);
  if (st.ok() && !named.ok()) {
    st = absl::InvalidArgumentError(absl::StrCat("--precision: ", named.status().message()));
  }
  if (const absl::Status m = bench::CheckComputeModel(model); st.ok() && !m.ok()) {
    st = absl::InvalidArgumentError(absl::StrCat("--model: ", m.message()));
  }
  if (help) {
    std::cout << flags.Help() << "\nBenchmarks:\n";
    for (const auto& b : bench::AllBenchmarks())
      std::cout << absl::StrFormat("  %-10s %s\n", b.name, b.description);
    return 0;
  }
  absl::StatusOr<common::RpcSecurity> security = common::RpcSecurity();
  if (st.ok() && !list && !version) {
    security = common::RpcSecurity::Load(security_flags);
    st = security.status();
  }
  if (auto code = common::HandleStandardFlags(flags, st, help, version)) return *code;
  if (list) {
    for (const auto& b : bench::AllBenchmarks())
      std::cout << absl::StrFormat("%-10s %s\n", b.name, b.description);
    return 0;
  }
  const std::string& name = (*positionals)[0];
  for (const auto& b : bench::AllBenchmarks()) {
    if (b.name != name) continue;
    // --json prints JSON only: whatever the run writes to stdout (a server's "listening
    // on" line) goes to stderr instead.
    const int json_fd = json ? dup(STDOUT_FILENO) : -1;
    if (json_fd >= 0) dup2(STDERR_FILENO, STDOUT_FILENO);
    auto result =
        b.run({static_cast<int>(reps), *security, *named, tokenizer, model, same_host, replicas});
    if (json_fd >= 0) {
      std::cout.flush();
      dup2(json_fd, STDOUT_FILENO);
      close(json_fd);
    }
    if (!result.ok()) {
      std::cerr << "pipetrain-bench " << name << ": " << result.status() << "\n";
      return 1;
    }
    if (json) {
      nlohmann::ordered_json j;
      j["benchmark"] = name;
      for (const auto& [k, v] : result->labels) j[k] = v;
      for (const auto& [k, v] : result->figures) j[k] = v;
      std::cout << j.dump() << "\n";
    } else {
      std::cout << "benchmark " << name << "\n";
      for (const auto& [k, v] : result->labels) std::cout << absl::StrFormat("  %-32s %s\n", k, v);
      for (const auto& [k, v] : result->figures) std::cout << absl::StrFormat("  %-32s %.4g\n", k, v);
    }
    return 0;
  }
  std::cerr << "pipetrain-bench: no benchmark named '" << name << "' (see --list)\n";
  return 2;
}
