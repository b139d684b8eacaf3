#include "client/tokenize_verb.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "client/local_model.h"
#include "client/output.h"
#include "client/progress.h"
#include "common/data/token_file_writer.h"
#include "common/data/tokenizer.h"
#include "common/flags.h"
#include "nlohmann/json.hpp"

namespace pipetrain::client {
namespace {

using Clock = std::chrono::steady_clock;

// A file is encoded in segments of about this size (cut at safe splits), each on all the
// threads, so that its tokens reach the output and the progress bar as it goes.
constexpr size_t kSegmentBytes = size_t{4} << 20;
// Inputs smaller than this in all finish too soon for a progress bar to help.
constexpr int64_t kProgressFromBytes = int64_t{32} << 20;
constexpr double kRedrawSeconds = 0.2;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The bar on stderr, redrawn in place, only on a terminal.
class ByteProgress {
 public:
  ByteProgress(int64_t total_bytes, bool enabled)
      : total_(total_bytes), enabled_(enabled), start_(Clock::now()) {}

  void Update(int64_t done_bytes) {
    if (!enabled_) return;
    const double elapsed = SecondsSince(start_);
    if (done_bytes < total_ && elapsed - last_draw_ < kRedrawSeconds) return;
    last_draw_ = elapsed;
    const double rate = elapsed > 0 ? done_bytes / elapsed : 0;
    std::string line = absl::StrFormat(
        "tokenize %s %3d%%  %.1f of %.1f MB  %.1f MB/s", ProgressBar(done_bytes, total_),
        total_ > 0 ? static_cast<int>(100 * done_bytes / total_) : 100, done_bytes / 1e6,
        total_ / 1e6, rate / 1e6);
    if (rate > 0 && done_bytes < total_) {
      absl::StrAppend(&line, "  ETA ", HumanDuration((total_ - done_bytes) / rate));
    }
    std::cerr << "\r\033[K" << line << std::flush;
    drawn_ = true;
  }

  // Clears the bar so that what follows starts on a clean line.
  void Finish() {
    if (drawn_) std::cerr << "\r\033[K" << std::flush;
    drawn_ = false;
  }

 private:
  int64_t total_;
  bool enabled_;
  Clock::time_point start_;
  double last_draw_ = -1;
  bool drawn_ = false;
};

}  // namespace

int RunTokenize(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string tokenizer_name, tokenizer_dir, out_path;
  int64_t threads = 1;
  bool bos = false, eot = false, json = false, help = false;
  common::FlagSet flags(
      "pipetrain tokenize",
      "--tokenizer bytes|gpt2|llama3 [--tokenizer-dir DIR] [--threads N] [--bos] [--eot] "
      "[--json] --out FILE.bin TEXT...",
      "Encodes the TEXT files, in order, into one llm.c token file: a header of 256\n"
      "little-endian int32 (magic, version, the token count, zeros), then the tokens:\n"
      "magic 20240520, version 1 and little-endian uint16 tokens for bytes and gpt2;\n"
      "magic 20240801, version 7 and uint32 tokens for llama3 (llm.c's Llama 3 files).\n"
      "The file is replaced atomically; on an error it is left as it was.\n"
      "gpt2 is OpenAI's GPT-2 byte-level BPE (vocabulary 50257, ids equal to OpenAI's\n"
      "encoder's); its encoder.json and vocab.bpe are read from --tokenizer-dir, else\n"
      "$PIPETRAIN_TOKENIZER_DIR, else /usr/local/share/pipetrain/gpt2. llama3 is Llama 3's\n"
      "byte-level BPE (128,000 ranks and 256 special tokens: vocabulary 128256, ids equal\n"
      "to npm's llama3-tokenizer-js's); its encoder.json and vocab.bpe are read from\n"
      "--tokenizer-dir, else $PIPETRAIN_LLAMA3_TOKENIZER_DIR, else\n"
      "/usr/local/share/pipetrain/llama3. deploy/install-deps.sh puts both there (nothing\n"
      "is downloaded). Special tokens' text in TEXT (\"<|endoftext|>\", \"<|eot_id|>\") is\n"
      "encoded as ordinary text; only --bos and --eot add special tokens. bytes makes each\n"
      "byte a token (vocabulary 256). The text is cut where no token can change and the\n"
      "parts are encoded on --threads threads: the tokens are the same for any N. One\n"
      "file's text and tokens are in memory at a time. Prints the token count, the bytes\n"
      "read and the throughput; a progress bar on stderr when it is a terminal and the\n"
      "input is large.\n"
      "Exit codes: 0 written, 1 encoding or writing --out failed, 2 usage error, an\n"
      "unreadable TEXT or an unreadable or invalid vocabulary.");
  flags.AddString("tokenizer", &tokenizer_name, "bytes, gpt2 or llama3", "NAME");
  flags.AddString("tokenizer-dir", &tokenizer_dir,
                  "folder with the tokenizer's encoder.json and vocab.bpe (default: gpt2's "
                  "$PIPETRAIN_TOKENIZER_DIR, else /usr/local/share/pipetrain/gpt2; llama3's "
                  "$PIPETRAIN_LLAMA3_TOKENIZER_DIR, else /usr/local/share/pipetrain/llama3)",
                  "DIR");
  flags.AddInt("threads", &threads, "encoding threads (the output does not depend on it)", "N");
  flags.AddBool("bos", &bos,
                "put the begin-of-text token before each file (llama3's <|begin_of_text|>, "
                "128000; llama3 only)");
  flags.AddBool("eot", &eot,
                "put the end-of-text token between consecutive files (gpt2's <|endoftext|>, "
                "50256; llama3's <|end_of_text|>, 128001)");
  flags.AddBool("json", &json,
                "print one JSON object: out, tokenizer, files, bytes, tokens, bos_tokens, "
                "eot_tokens, threads, seconds, mb_per_s, tokens_per_s");
  flags.AddString("out", &out_path, "the token file to write (replaced atomically)", "FILE.bin");
  flags.AddBool("help", &help, "print this help and exit");
  flags.MarkRequired("tokenizer");
  flags.MarkRequired("out");
  std::vector<std::string> inputs;
  if (auto exit = ParseVerbFlags(flags, args, help, out, err, &inputs)) return *exit;
  auto usage = [&](absl::string_view message) { return UsageError(flags, message, err); };
  if (tokenizer_name.empty()) {
    return usage(absl::StrCat("--tokenizer NAME is required (", data::TokenizerNames(), ")"));
  }
  if (!data::IsTokenizerName(tokenizer_name)) {
    return usage(absl::StrCat("--tokenizer: unknown tokenizer '", tokenizer_name, "' (known: ",
                              data::TokenizerNames(), ")"));
  }
  if (out_path.empty()) return usage("--out FILE.bin is required (where to write the tokens)");
  if (threads < 1) return usage(absl::StrCat("--threads must be >= 1 (got ", threads, ")"));
  if (inputs.empty()) return usage("give at least one TEXT file to encode");

  // Every input must be a readable file before anything is encoded or written.
  int64_t total_bytes = 0;
  for (const std::string& path : inputs) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || access(path.c_str(), R_OK) != 0) {
      err << "pipetrain tokenize: cannot read " << path << ": " << std::strerror(errno) << "\n";
      return kExitUsage;
    }
    if (!S_ISREG(st.st_mode)) {
      err << "pipetrain tokenize: cannot read " << path << ": not a regular file\n";
      return kExitUsage;
    }
    total_bytes += st.st_size;
  }

  auto tokenizer = data::MakeTokenizer(tokenizer_name, tokenizer_dir);
  if (!tokenizer.ok()) {
    err << "pipetrain tokenize: --tokenizer " << tokenizer_name << ": "
        << tokenizer.status().message() << "\n";
    return kExitUsage;
  }
  const data::Tokenizer& tok = **tokenizer;
  if (eot && !tok.eot_id().has_value()) {
    return usage(absl::StrCat("--eot: the ", tok.name(),
                              " tokenizer has no end-of-text token (gpt2 and llama3 have one)"));
  }
  if (bos && !tok.bos_id().has_value()) {
    return usage(absl::StrCat("--bos: the ", tok.name(),
                              " tokenizer has no begin-of-text token (llama3 has one)"));
  }

  const Clock::time_point start = Clock::now();
  auto writer = data::TokenFileWriter::Open(out_path, tok.vocab_size(),
                                            data::LlmcLayoutFor(tok.vocab_size()));
  if (!writer.ok()) {
    err << "pipetrain tokenize: --out: " << writer.status().message() << "\n";
    return kExitJobFailed;
  }
  ByteProgress progress(total_bytes, &err == &std::cerr && isatty(STDERR_FILENO) &&
                                         total_bytes >= kProgressFromBytes);
  int64_t bytes_read = 0, bos_tokens = 0, eot_tokens = 0;
  // One special token, counted; false (said on err) when it cannot be written.
  auto special = [&](int32_t id, int64_t* count) {
    if (absl::Status s = writer->Append({&id, 1}); !s.ok()) {
      progress.Finish();
      err << "pipetrain tokenize: " << s.message() << "\n";
      return false;
    }
    ++*count;
    return true;
  };
  for (size_t f = 0; f < inputs.size(); ++f) {
    auto text = ReadFile(inputs[f]);
    if (!text.ok()) {
      progress.Finish();
      err << "pipetrain tokenize: " << text.status().message() << "\n";
      return kExitUsage;
    }
    if (eot && f > 0 && !special(*tok.eot_id(), &eot_tokens)) return kExitJobFailed;
    if (bos && !special(*tok.bos_id(), &bos_tokens)) return kExitJobFailed;
    for (size_t begin = 0; begin < text->size();) {
      const size_t end = begin + kSegmentBytes >= text->size()
                             ? text->size()
                             : tok.NextSafeSplit(*text, begin + kSegmentBytes);
      const absl::string_view segment = absl::string_view(*text).substr(begin, end - begin);
      auto ids = data::EncodeParallel(tok, segment, static_cast<int>(threads));
      absl::Status s = ids.ok() ? writer->Append(*ids) : ids.status();
      if (!s.ok()) {
        progress.Finish();
        err << "pipetrain tokenize: " << inputs[f] << ": " << s.message() << "\n";
        return kExitJobFailed;
      }
      bytes_read += static_cast<int64_t>(segment.size());
      progress.Update(bytes_read);
      begin = end;
    }
  }
  if (absl::Status s = writer->Commit(); !s.ok()) {
    progress.Finish();
    err << "pipetrain tokenize: --out: cannot write " << out_path << ": " << s.message() << "\n";
    return kExitJobFailed;
  }
  progress.Finish();
  const double seconds = std::max(SecondsSince(start), 1e-9);
  const int64_t tokens = writer->tokens();
  const double mb_per_s = bytes_read / 1e6 / seconds, tokens_per_s = tokens / seconds;
  if (json) {
    const nlohmann::ordered_json j = {
        {"out", out_path},        {"tokenizer", std::string(tok.name())},
        {"files", inputs.size()}, {"bytes", bytes_read},
        {"tokens", tokens},       {"bos_tokens", bos_tokens},
        {"eot_tokens", eot_tokens},
        {"threads", threads},     {"seconds", seconds},
        {"mb_per_s", mb_per_s},   {"tokens_per_s", tokens_per_s}};
    out << j.dump() << "\n";
  } else {
    out << absl::StrFormat(
        "wrote %s tokens to %s (%s, %d file%s, %s bytes read%s%s)\n", WithThousands(tokens),
        out_path, tok.name(), inputs.size(), inputs.size() == 1 ? "" : "s",
        WithThousands(bytes_read),
        bos_tokens > 0 ? absl::StrCat(", ", bos_tokens, " begin-of-text token",
                                      bos_tokens == 1 ? "" : "s")
                       : "",
        eot_tokens > 0 ? absl::StrCat(", ", eot_tokens, " end-of-text token",
                                      eot_tokens == 1 ? "" : "s")
                       : "");
    out << absl::StrFormat("%.1f MB/s, %s tokens/s on %d thread%s (%.2f s)\n", mb_per_s,
                           WithThousands(static_cast<int64_t>(tokens_per_s)), threads,
                           threads == 1 ? "" : "s", seconds);
  }
  return kExitOk;
}

}  // namespace pipetrain::client
