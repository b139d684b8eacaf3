#include "bench/tokenize_bench.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/json_command.h"
#include "common/atomic_file.h"
#include "common/data/tokenizer.h"
#include "common/status_macros.h"

namespace pipetrain::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kFallbackBytes = size_t{4} << 20;
constexpr int kThreadCounts[] = {1, 2, 4};

// The whole KJV when Debian's `bible` is there, else lines of several scripts repeated
// to 4 MiB. `label` says which.
std::string BenchText(std::string* label) {
  if (access("/usr/bin/bible", X_OK) == 0) {
    int status = 0;
    auto text = CommandOutput("/usr/bin/bible -f 'gen1:1-rev22:21' 2>/dev/null", &status);
    if (text.ok() && status == 0 && text->size() > (size_t{1} << 20)) {
      *label = "King James Bible (bible -f 'gen1:1-rev22:21', Debian bible-kjv)";
      return *std::move(text);
    }
  }
  const std::string lines =
      "In the beginning God created the heaven and the earth. It's 3.14, isn't it?\n"
      "Le cœur a ses raisons que la raison ne connaît point; Straße, jalapeño.\n"
      "日本語のテキストです。中文文本：北京是中国的首都。한국어 텍스트입니다.\n"
      "Русский текст: Москва. Ελληνικά: Αθήνα. Emoji 👍🏽 🇫🇷 "
      "👩‍👩‍👧‍👦\n"
      "    for (int i = 0; i < n; ++i) {  // indented code\n\t\treturn x;\n\n";
  std::string text;
  while (text.size() < kFallbackBytes) text += lines;
  *label = "mixed scripts, prose and code, repeated to 4 MiB (no /usr/bin/bible)";
  return text;
}

uint32_t Fnv1a(const std::vector<int32_t>& ids) {
  uint32_t h = 2166136261u;
  for (int32_t id : ids) h = (h ^ static_cast<uint32_t>(id)) * 16777619u;
  return h;
}

// The JavaScript encoder a tokenizer is measured against, run by `script` under node.
struct JsEncoder {
  const char* tokenizer;
  const char* package;  // npm's package, installed by deploy/install-deps.sh
  const char* env_var;  // overrides where the package is
  const char* probe;    // a file of the package, to tell whether it is there
  const char* script;   // in bench/
  const char* how;      // how the script calls it, for the label
};

constexpr JsEncoder kJsEncoders[] = {
    {"gpt2", "gpt-3-encoder@1.1.4", "PIPETRAIN_GPT2_JS_PACKAGE", "Encoder.js",
     "gpt2_js_encode.js", "encode() per line"},
    {"llama3", "llama3-tokenizer-js@1.2.0", "PIPETRAIN_LLAMA3_JS_PACKAGE",
     "bundle/commonjs-llama3-tokenizer-with-baked-data.cjs", "llama3_js_encode.js",
     "encode() of the whole text"},
};

std::string JsPackage(const JsEncoder& js) {
  const char* env = std::getenv(js.env_var);
  const absl::string_view name = absl::string_view(js.package).substr(
      0, absl::string_view(js.package).rfind('@'));
  return env != nullptr && *env != '\0'
             ? env
             : absl::StrCat("/usr/local/share/pipetrain/node/node_modules/", name);
}

// One cold encode (a freshly loaded tokenizer, as node loads its package afresh) of
// `text` on `threads` threads; seconds of the encoding alone.
absl::StatusOr<double> TimeOurs(const std::string& name, const std::string& text, int threads,
                                std::vector<int32_t>* ids) {
  ASSIGN_OR_RETURN(auto tokenizer, data::MakeTokenizer(name, ""));
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(*ids, data::EncodeParallel(*tokenizer, text, threads));
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

absl::StatusOr<BenchResult> RunTokenizeBench(const BenchOptions& options) {
  const int reps = options.repetitions > 0 ? options.repetitions : 3;
  const JsEncoder* encoder = nullptr;
  for (const JsEncoder& e : kJsEncoders) {
    if (e.tokenizer == options.tokenizer) encoder = &e;
  }
  if (encoder == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer '", options.tokenizer, "': the tokenize benchmark measures gpt2 or llama3"));
  }
  BenchResult result;
  result.Label("tokenizer", options.tokenizer);
  std::string text_label;
  const std::string text = BenchText(&text_label);
  result.Label("text", text_label);
  result.Label("cores", absl::StrCat(std::thread::hardware_concurrency(),
                                     " (4 threads on fewer cores measure the overhead, "
                                     "not a speed-up)"));
  result.Add("bytes", static_cast<double>(text.size()));

  // node reads the text from a file; ours encodes the same bytes from memory.
  char path[] = "/tmp/pipetrain-tokenize-bench-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return absl::InternalError("cannot create a temp file in /tmp");
  close(fd);
  absl::Cleanup remove_file = [&] { unlink(path); };
  RETURN_IF_ERROR(common::WriteFileAtomically(path, text));

  const std::string package = JsPackage(*encoder);
  const bool have_js = access(absl::StrCat(package, "/", encoder->probe).c_str(), R_OK) == 0;
  const std::string js_command =
      absl::StrFormat("node '%s/%s' '%s' bench '%s' 2>&1", PIPETRAIN_BENCH_DIR, encoder->script,
                      package, path);
  std::string js_label = have_js ? ""
                                 : absl::StrCat("skipped: no ", encoder->package, " in ", package,
                                                " (run deploy/install-deps.sh)");
  std::vector<double> js_times;
  std::vector<std::vector<double>> our_times(std::size(kThreadCounts));
  std::vector<int32_t> ids;
  double js_tokens = -1, js_fnv = -1;
  bool same_ids_across_threads = true, js_failed = false;
  uint32_t first_fnv = 0;
  // Interleaved, so that a busy moment of this shared machine hits every variant alike.
  for (int r = 0; r < reps; ++r) {
    if (have_js && !js_failed) {
      auto js = RunJsonCommand(js_command);
      if (!js.ok()) {
        js_failed = true;
        js_label = absl::StrCat("failed: ", js.status().message());
      } else {
        js_times.push_back(js->at("seconds").get<double>());
        js_tokens = js->at("tokens").get<double>();
        js_fnv = js->at("fnv1a").get<double>();
        js_label = absl::StrCat("npm ", encoder->package, " under node ",
                                js->at("node").get<std::string>(), ", ", encoder->how,
                                " (bench/", encoder->script, ")");
      }
    }
    for (size_t t = 0; t < std::size(kThreadCounts); ++t) {
      ASSIGN_OR_RETURN(const double s, TimeOurs(options.tokenizer, text, kThreadCounts[t], &ids));
      our_times[t].push_back(s);
      const uint32_t fnv = Fnv1a(ids);
      if (r == 0 && t == 0) first_fnv = fnv;
      same_ids_across_threads = same_ids_across_threads && fnv == first_fnv;
    }
  }
  result.Label("js", js_label);
  result.Add("tokens", static_cast<double>(ids.size()));
  result.Add("ids_same_on_every_thread_count", same_ids_across_threads ? 1 : 0);
  const double mb = text.size() / 1e6;
  double js_mb_per_s = 0;
  if (!js_times.empty()) {
    js_mb_per_s = mb / Median(js_times);
    result.Add("js_mb_per_s", js_mb_per_s);
    result.Add("js_tokens_per_s", js_tokens / Median(js_times));
    result.Add("ids_equal_js", js_tokens == static_cast<double>(ids.size()) &&
                                       js_fnv == static_cast<double>(first_fnv)
                                   ? 1
                                   : 0);
  }
  for (size_t t = 0; t < std::size(kThreadCounts); ++t) {
    const double s = Median(our_times[t]);
    const std::string name = absl::StrCat("threads", kThreadCounts[t], "_");
    result.Add(name + "mb_per_s", mb / s);
    result.Add(name + "tokens_per_s", ids.size() / s);
    if (js_mb_per_s > 0) result.Add(name + "over_js", mb / s / js_mb_per_s);
  }
  return result;
}

}  // namespace pipetrain::bench
