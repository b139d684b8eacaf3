// A small command-line parser shared by every binary: --name VALUE, --name=VALUE,
// boolean --name, one-letter aliases (-f), repeatable flags, positionals anywhere,
// "--" ends the flags.
// Written here rather than taken from absl::flags so that --help exits 0, verbs can
// have their own flag sets, and errors are statuses instead of process exits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::common {

class FlagSet {
 public:
  // usage: the synopsis after the program name, e.g. "submit JOB.json [flags]".
  FlagSet(std::string program, std::string usage, std::string description);

  void AddString(std::string name, std::string* target, std::string help,
                 std::string value_name = "VALUE");
  void AddInt(std::string name, int64_t* target, std::string help,
              std::string value_name = "N");
  void AddDouble(std::string name, double* target, std::string help,
                 std::string value_name = "X");
  void AddBool(std::string name, bool* target, std::string help);
  // May be given many times; each value is appended.
  void AddRepeated(std::string name, std::vector<std::string>* target, std::string help,
                   std::string value_name = "VALUE");

  // Gives an added flag a one-letter alias used with one dash: AddShort('f', "follow")
  // makes -f mean --follow (and -f=VALUE / -f VALUE for flags with values).
  void AddShort(char letter, const std::string& name);

  // Help shows "(required)" for this flag instead of its default. Parse does not check
  // it: the caller says what is missing, as only it knows what the flag is for.
  void MarkRequired(const std::string& name);

  // Parses args (without the program name); returns the positional arguments. An
  // unknown flag, a missing or malformed value is an error naming the flag.
  absl::StatusOr<std::vector<std::string>> Parse(const std::vector<std::string>& args);

  // Usage, description and every flag with its default.
  std::string Help() const;
  const std::string& program() const { return program_; }

 private:
  enum class Type { kString, kInt, kDouble, kBool, kRepeated };
  struct Flag {
    std::string name;
    Type type;
    void* target;
    std::string help;
    std::string value_name;
    std::string default_text;
    bool required = false;
    char short_name = 0;
  };
  const Flag* Find(const std::string& name) const;
  const Flag* FindShort(char letter) const;
  absl::Status Set(const Flag& flag, const std::string& value);

  std::string program_;
  std::string usage_;
  std::string description_;
  std::vector<Flag> flags_;
};

// Collects argv[first..argc) as strings.
std::vector<std::string> Args(int argc, char** argv, int first = 1);

// Handles the flags every binary has. Returns the exit code to leave with (0 after
// --help or --version, 2 after a parse error, printed to stderr with a hint), or
// nullopt when the program should go on.
std::optional<int> HandleStandardFlags(const FlagSet& flags,
                                       const absl::Status& parse_status, bool help,
                                       bool version);

}  // namespace pipetrain::common
