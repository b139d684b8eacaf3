// What every benchmark returns: named figures in a fixed order, printed as a table or
// as one JSON object by pipetrain-bench. Benchmarks compare against a baseline
// measured in the same run, since this machine is shared and noisy.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc_security.h"
#include "common/model/precision.h"

namespace pipetrain::bench {

struct BenchOptions {
  int repetitions = 0;  // 0: the benchmark's own default
  common::RpcSecurity security;  // links over mutual TLS when it has certificates
  // --precision: training.precision's row where a benchmark trains (compute).
  model::Precision precision = model::PrecisionTable().front();
  // --tokenizer: the BPE the tokenize benchmark measures (gpt2 or llama3).
  std::string tokenizer = "gpt2";
  // --model: the model compute trains (gpt2 or llama).
  std::string model = "gpt2";
  // --same-host: link also measures the same-host path (shared memory) and a memcpy.
  bool same_host = false;
  // --replicas: model-size compares these data-parallel copy counts (K = 1, the optimizer
  // split among them) instead of stage counts; e.g. "1,2,4". Empty: the K series.
  std::string replicas;
};

struct BenchResult {
  std::vector<std::pair<std::string, double>> figures;  // name -> value, in order
  std::vector<std::pair<std::string, std::string>> labels;  // e.g. device: emulated
  void Add(std::string name, double value) { figures.emplace_back(std::move(name), value); }
  void Label(std::string name, std::string value) {
    labels.emplace_back(std::move(name), std::move(value));
  }
};

struct Benchmark {
  std::string name;
  std::string description;
  std::function<absl::StatusOr<BenchResult>(const BenchOptions&)> run;
};

// Every benchmark, by name (bench/registry.cc).
const std::vector<Benchmark>& AllBenchmarks();

// The median of `samples` (seconds); samples is reordered.
double Median(std::vector<double>& samples);

}  // namespace pipetrain::bench
