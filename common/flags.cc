#include "common/flags.h"

#include <iostream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/version.h"

namespace pipetrain::common {

FlagSet::FlagSet(std::string program, std::string usage, std::string description)
    : program_(std::move(program)),
      usage_(std::move(usage)),
      description_(std::move(description)) {}

void FlagSet::AddString(std::string name, std::string* target, std::string help,
                        std::string value_name) {
  std::string def = target->empty() ? "" : absl::StrCat("\"", *target, "\"");
  flags_.push_back({std::move(name), Type::kString, target, std::move(help),
                    std::move(value_name), std::move(def)});
}

void FlagSet::AddInt(std::string name, int64_t* target, std::string help,
                     std::string value_name) {
  flags_.push_back({std::move(name), Type::kInt, target, std::move(help),
                    std::move(value_name), absl::StrCat(*target)});
}

void FlagSet::AddDouble(std::string name, double* target, std::string help,
                        std::string value_name) {
  flags_.push_back({std::move(name), Type::kDouble, target, std::move(help),
                    std::move(value_name), absl::StrCat(*target)});
}

void FlagSet::AddBool(std::string name, bool* target, std::string help) {
  flags_.push_back({std::move(name), Type::kBool, target, std::move(help), "",
                    *target ? "true" : ""});
}

void FlagSet::AddRepeated(std::string name, std::vector<std::string>* target,
                          std::string help, std::string value_name) {
  flags_.push_back({std::move(name), Type::kRepeated, target, std::move(help),
                    std::move(value_name), ""});
}

void FlagSet::MarkRequired(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) f.required = true;
  }
}

void FlagSet::AddShort(char letter, const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) f.short_name = letter;
  }
}

const FlagSet::Flag* FlagSet::FindShort(char letter) const {
  for (const Flag& f : flags_) {
    if (f.short_name == letter) return &f;
  }
  return nullptr;
}

const FlagSet::Flag* FlagSet::Find(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

absl::Status FlagSet::Set(const Flag& flag, const std::string& value) {
  switch (flag.type) {
    case Type::kString:
      *static_cast<std::string*>(flag.target) = value;
      return absl::OkStatus();
    case Type::kRepeated:
      static_cast<std::vector<std::string>*>(flag.target)->push_back(value);
      return absl::OkStatus();
    case Type::kInt:
      if (!absl::SimpleAtoi(value, static_cast<int64_t*>(flag.target))) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag.name, " takes a whole number, not '", value, "'"));
      }
      return absl::OkStatus();
    case Type::kDouble:
      if (!absl::SimpleAtod(value, static_cast<double*>(flag.target))) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag.name, " takes a number, not '", value, "'"));
      }
      return absl::OkStatus();
    case Type::kBool:
      if (!absl::SimpleAtob(value, static_cast<bool*>(flag.target))) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag.name, " takes true or false, not '", value, "'"));
      }
      return absl::OkStatus();
  }
  return absl::InternalError("unknown flag type");
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(
    const std::vector<std::string>& args) {
  std::vector<std::string> positionals;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positionals.insert(positionals.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-' || arg == "-") {
      positionals.push_back(arg);
      continue;
    }
    const bool one_dash = arg[1] != '-';
    std::string body = arg.substr(one_dash ? 1 : 2);
    std::optional<std::string> value;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      value = body.substr(eq + 1);
      body = body.substr(0, eq);
    }
    const Flag* flag = nullptr;
    if (one_dash && body.size() == 1) flag = FindShort(body[0]);
    if (flag == nullptr) flag = Find(body);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag ", one_dash && body.size() == 1 ? "-" : "--", body));
    }
    body = flag->name;  // messages name the flag by its long form
    if (flag->type == Type::kBool && !value) {
      *static_cast<bool*>(flag->target) = true;
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", body, " needs a value (", flag->value_name, ")"));
      }
      value = args[++i];
    }
    if (absl::Status s = Set(*flag, *value); !s.ok()) return s;
  }
  return positionals;
}

std::string FlagSet::Help() const {
  std::string out = absl::StrCat("Usage: ", program_, " ", usage_, "\n\n");
  if (!description_.empty()) absl::StrAppend(&out, description_, "\n\n");
  if (flags_.empty()) return out;
  absl::StrAppend(&out, "Flags:\n");
  for (const Flag& f : flags_) {
    std::string lhs = absl::StrCat("--", f.name);
    if (f.short_name != 0) lhs = absl::StrCat("-", std::string(1, f.short_name), ", ", lhs);
    if (f.type != Type::kBool) absl::StrAppend(&lhs, " ", f.value_name);
    std::string line = absl::StrFormat("  %-28s %s", lhs, f.help);
    if (f.required) {
      absl::StrAppend(&line, " (required)");
    } else if (!f.default_text.empty()) {
      absl::StrAppend(&line, " (default ", f.default_text, ")");
    }
    if (f.type == Type::kRepeated) absl::StrAppend(&line, " (repeatable)");
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::vector<std::string> Args(int argc, char** argv, int first) {
  std::vector<std::string> out;
  for (int i = first; i < argc; ++i) out.emplace_back(argv[i]);
  return out;
}

std::optional<int> HandleStandardFlags(const FlagSet& flags,
                                       const absl::Status& parse_status, bool help,
                                       bool version) {
  if (help) {
    std::cout << flags.Help();
    return 0;
  }
  if (version) {
    std::cout << flags.program() << " " << VersionString() << "\n";
    return 0;
  }
  if (!parse_status.ok()) {
    std::cerr << flags.program() << ": " << parse_status.message() << "\nRun '"
              << flags.program() << " --help' for usage.\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace pipetrain::common
