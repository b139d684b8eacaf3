// The flag handling every verb shares (declared in client/cli.h), apart from the verb
// table so that the remote verbs link without the in-process ones and their compute.
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "common/flags.h"

namespace pipetrain::client {

std::optional<int> ParseVerbFlags(common::FlagSet& flags, const std::vector<std::string>& args,
                                  const bool& help, std::ostream& out, std::ostream& err,
                                  std::vector<std::string>* positionals) {
  auto parsed = flags.Parse(args);
  if (!parsed.ok()) return UsageError(flags, parsed.status().message(), err);
  if (help) {
    out << flags.Help();
    return kExitOk;
  }
  if (positionals != nullptr) {
    *positionals = *std::move(parsed);
  } else if (!parsed->empty()) {
    return UsageError(flags, absl::StrCat("takes no positional arguments (got '",
                                          parsed->front(), "')"),
                      err);
  }
  return std::nullopt;
}

int UsageError(const common::FlagSet& flags, absl::string_view message, std::ostream& err) {
  err << flags.program() << ": " << message << "\nRun '" << flags.program()
      << " --help' for usage.\n";
  return kExitUsage;
}

}  // namespace pipetrain::client
