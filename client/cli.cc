#include "client/cli.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/eval_verb.h"
#include "client/export_hf_verb.h"
#include "client/generate_verb.h"
#include "client/init_verb.h"
#include "client/plan_verb.h"
#include "client/remote_verbs.h"
#include "client/tokenize_verb.h"
#include "client/train_local_verb.h"
#include "common/flags.h"
#include "common/version.h"

namespace pipetrain::client {
namespace {

int RunVersion(const std::vector<std::string>& args, std::ostream& out,
               std::ostream& err) {
  bool help = false;
  common::FlagSet flags("pipetrain version", "", "Prints the version and build features.");
  flags.AddBool("help", &help, "print this help and exit");
  auto positionals = flags.Parse(args);
  if (!positionals.ok() || !positionals->empty()) {
    err << "pipetrain version: takes no arguments\nRun 'pipetrain version --help' for usage.\n";
    return kExitUsage;
  }
  if (help) {
    out << flags.Help();
    return kExitOk;
  }
  out << "pipetrain " << common::VersionString() << "\n";
  return kExitOk;
}

std::string TopHelp() {
  std::string s =
      "Usage: pipetrain VERB [flags]\n\n"
      "Trains Transformer language models with pipeline parallelism on a cluster of\n"
      "stage servers run by a pipetrain-coordinator.\n\nVerbs:\n";
  for (const Verb& v : Verbs()) s += absl::StrFormat("  %-12s %s\n", v.name, v.summary);
  s += "\nFlags:\n  --help        print this help and exit\n"
       "  --version     print the version and exit\n\n"
       "Run 'pipetrain VERB --help' for a verb's flags.\n"
       "Exit codes: 0 success, 1 the job (or an in-process run) failed or was cancelled,\n"
       "2 usage error or invalid spec or input, 3 cannot reach the coordinator.\n";
  return s;
}

}  // namespace

const std::vector<Verb>& Verbs() {
  static const std::vector<Verb> verbs = {
      {"submit", "submit a job spec and follow it to the end (--no-wait to detach)", RunSubmit},
      {"follow", "follow a job already submitted to its end, as submit does", RunFollow},
      {"status", "a job's state, steps, loss and bubble (--json with the step history)",
       RunStatus},
      {"logs", "a job's log lines (-f to follow until it ends)", RunLogs},
      {"list", "the coordinator's jobs, most recent first", RunList},
      {"cancel", "cancel a queued or running job", RunCancel},
      {"resume", "run a failed or cancelled job's remaining steps from its latest checkpoint",
       RunResume},
      {"timeline",
       "a job's measured timeline as a Chrome trace (Perfetto), or where each stage's time went",
       RunTimeline},
      {"cluster", "the stage servers: devices, memory, state, heartbeats", RunCluster},
      {"plan", "plan a job offline: partition, schedule picture, predicted bubble", RunPlan},
      {"init", "write a freshly initialised model checkpoint (in-process)", RunInit},
      {"eval", "loss (and gradients) of a checkpoint on a text (in-process)", RunEval},
      {"tokenize", "encode text files into an llm.c token file (gpt2 or llama3 BPE, or bytes)",
       RunTokenize},
      {"train-local", "train the whole model in this process: the single-device baseline",
       RunTrainLocal},
      {"export-hf", "write a checkpoint as a Hugging Face GPT-2 or Llama folder (from_pretrained)",
       RunExportHf},
      {"generate", "continue a prompt with a checkpoint, token by token (in-process)",
       RunGenerate},
      {"version", "print the version and build features", RunVersion},
  };
  return verbs;
}

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.empty()) {
    err << TopHelp();
    return kExitUsage;
  }
  const std::string& first = args[0];
  if (first == "--help" || first == "-h" || first == "help") {
    out << TopHelp();
    return kExitOk;
  }
  if (first == "--version") {
    out << "pipetrain " << common::VersionString() << "\n";
    return kExitOk;
  }
  for (const Verb& v : Verbs()) {
    if (v.name == first) {
      return v.run(std::vector<std::string>(args.begin() + 1, args.end()), out, err);
    }
  }
  err << "pipetrain: unknown verb '" << first << "'\nRun 'pipetrain --help' for the verbs.\n";
  return kExitUsage;
}

}  // namespace pipetrain::client
