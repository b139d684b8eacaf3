// Parsing, overrides and printing of job specs; WithDefaults and ValidateJobSpec live in
// job_spec_validate.cc. The JSON is walked against JobSpec's descriptor first so that
// every unknown field and every wrongly typed value is reported by its dotted path, then
// protobuf's own JSON parser reads the values.
#include "coordinator/spec/job_spec.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using ::google::protobuf::Descriptor;
using ::google::protobuf::FieldDescriptor;
using Json = nlohmann::ordered_json;

// Records where a parse failed; every other callback accepts, so nothing throws.
class ErrorSax final : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    position_ = position;
    detail_ = ex.what();
    return false;
  }
  std::size_t position_ = 0;
  std::string detail_;
};

// "malformed JSON at line 2, column 7 (byte 19): syntax error while parsing ..."
std::string DescribeMalformed(absl::string_view text) {
  ErrorSax sax;
  Json::sax_parse(text.begin(), text.end(), &sax);
  std::string detail = sax.detail_;
  // nlohmann's text repeats the position ("[json.exception...] parse error at line 1,
  // column 2: syntax error ..."); keep only what went wrong.
  if (size_t col = detail.find("column "); col != std::string::npos) {
    if (size_t colon = detail.find(": ", col); colon != std::string::npos) {
      detail = detail.substr(colon + 2);
    }
  }
  const size_t pos = std::min(sax.position_, text.size());
  const absl::string_view before = text.substr(0, pos);
  const size_t line = 1 + std::count(before.begin(), before.end(), '\n');
  const size_t last_newline = before.rfind('\n');
  const size_t column = last_newline == absl::string_view::npos ? pos : pos - last_newline - 1;
  return absl::StrCat("malformed JSON at line ", line, ", column ", column, " (byte ", pos,
                      "): ", detail);
}

absl::StatusOr<Json> ParseObject(absl::string_view text) {
  if (text.find_first_not_of(" \t\r\n") == absl::string_view::npos) {
    return absl::InvalidArgumentError("the job spec is empty; expected one JSON object");
  }
  Json root = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError(DescribeMalformed(text));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a job spec is one JSON object ({\"model\": ..., \"pipeline\": ...}), not a ",
        root.type_name()));
  }
  return root;
}

const FieldDescriptor* FindField(const Descriptor* d, const std::string& key) {
  if (const FieldDescriptor* f = d->FindFieldByName(key)) return f;
  for (int i = 0; i < d->field_count(); ++i) {
    if (d->field(i)->json_name() == key) return d->field(i);
  }
  return nullptr;
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string UnknownField(const Descriptor* d, const std::string& key, const std::string& path) {
  std::vector<std::string> known;
  std::string closest;
  size_t best = 3;  // suggest only names at most two edits away
  for (int i = 0; i < d->field_count(); ++i) {
    known.push_back(d->field(i)->name());
    if (size_t dist = EditDistance(key, d->field(i)->name()); dist < best) {
      best = dist;
      closest = d->field(i)->name();
    }
  }
  std::string out = absl::StrCat("unknown field '", path, "' (known: ", absl::StrJoin(known, ", "),
                                 ")");
  if (!closest.empty()) absl::StrAppend(&out, "; did you mean '", closest, "'?");
  return out;
}

std::string Shown(const Json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return absl::StrCat(v.type_name(), " ", text);
}

bool IsNumericString(const Json& v) {
  if (!v.is_string()) return false;
  const Json n = Json::parse(v.get<std::string>(), nullptr, false);
  return !n.is_discarded() && n.is_number();
}

void Walk(const Json& object, const Descriptor* d, const std::string& path,
          std::vector<std::string>* problems);

// One value of `field` (an element, for repeated fields).
void CheckValue(const Json& v, const FieldDescriptor* field, const std::string& path,
                std::vector<std::string>* problems) {
  if (v.is_null()) return;  // the proto JSON mapping's "default"
  auto wrong = [&](absl::string_view expected) {
    problems->push_back(absl::StrCat(path, ": expected ", expected, ", got ", Shown(v)));
  };
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE:
      if (field->message_type()->file()->package() == "google.protobuf") return;
      if (!v.is_object()) return wrong("an object {...}");
      return Walk(v, field->message_type(), path, problems);
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
      if (v.is_number_float() && v.get<double>() != std::floor(v.get<double>())) {
        return wrong("a whole number");
      }
      if (!v.is_number() && !IsNumericString(v)) wrong("a whole number");
      return;
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      if ((v.is_number() && v.get<double>() < 0) ||
          (v.is_number_float() && v.get<double>() != std::floor(v.get<double>()))) {
        return wrong("a whole number >= 0");
      }
      if (!v.is_number() && !IsNumericString(v)) wrong("a whole number >= 0");
      return;
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_DOUBLE:
      if (!v.is_number() && !v.is_string()) wrong("a number");  // "NaN", "1e-3" are allowed
      return;
    case FieldDescriptor::CPPTYPE_BOOL:
      if (!v.is_boolean()) wrong("true or false");
      return;
    case FieldDescriptor::CPPTYPE_STRING:
      if (!v.is_string()) wrong("a string in quotes");
      return;
    case FieldDescriptor::CPPTYPE_ENUM:
      if (!v.is_string() && !v.is_number_integer()) wrong("an enum name");
      return;
  }
}

void Walk(const Json& object, const Descriptor* d, const std::string& path,
          std::vector<std::string>* problems) {
  for (const auto& [key, value] : object.items()) {
    const std::string full = path.empty() ? key : absl::StrCat(path, ".", key);
    const FieldDescriptor* field = FindField(d, key);
    if (field == nullptr) {
      problems->push_back(UnknownField(d, key, full));
      continue;
    }
    if (field->is_repeated() && !field->is_map()) {
      if (value.is_null()) continue;
      if (!value.is_array()) {
        problems->push_back(absl::StrCat(full, ": expected a list [...], got ", Shown(value)));
        continue;
      }
      for (size_t i = 0; i < value.size(); ++i) {
        CheckValue(value[i], field, absl::StrCat(full, "[", i, "]"), problems);
      }
    } else if (!field->is_map()) {
      CheckValue(value, field, full, problems);
    }
  }
}

// A list of strings may be written as one string ("tokens": "train.bin"), which is how
// `--set data.tokens=PATH` writes it too: wrapped into a list of one here, before the
// proto JSON parser (which wants a list) sees it. True if it wrapped any.
bool WrapSingleStrings(Json& object, const Descriptor* d) {
  bool wrapped = false;
  for (auto& [key, value] : object.items()) {
    const FieldDescriptor* field = FindField(d, key);
    if (field == nullptr || field->is_map()) continue;
    if (field->is_repeated() && field->cpp_type() == FieldDescriptor::CPPTYPE_STRING &&
        value.is_string()) {
      value = Json::array({value});
      wrapped = true;
    } else if (!field->is_repeated() && field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE &&
               value.is_object()) {
      wrapped |= WrapSingleStrings(value, field->message_type());
    }
  }
  return wrapped;
}

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points
// past U+10FFFF), the rule nlohmann's dump() enforces by throwing.
bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    int extra = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      extra = 1, cp = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2, cp = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (text.size() - i <= static_cast<size_t>(extra)) return false;
    for (int k = 1; k <= extra; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (next & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += extra + 1;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ApplyOverrides(absl::string_view json,
                                           const std::vector<std::string>& overrides) {
  ASSIGN_OR_RETURN(Json root, ParseObject(json));
  for (const std::string& o : overrides) {
    // A spec is JSON text: bytes that are not UTF-8 cannot be written into it (and
    // would make the JSON writer throw; found by tests/fuzz/job_spec_fuzz).
    if (!IsValidUtf8(o)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--set '", absl::CHexEscape(o), "': not valid UTF-8 text (a job spec is JSON)"));
    }
    const size_t eq = o.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--set '", o, "': no '=' (expected FIELD=VALUE, e.g. --set pipeline.stages=4)"));
    }
    const std::string path = o.substr(0, eq), text = o.substr(eq + 1);
    const std::vector<std::string> parts = absl::StrSplit(path, '.');
    if (std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--set '", o, "': '", path, "' is not a field path (expected e.g. training.lr)"));
    }
    Json* node = &root;
    const Descriptor* d = pb::JobSpec::descriptor();
    const FieldDescriptor* field = nullptr;
    for (size_t i = 0; i < parts.size(); ++i) {
      field = d == nullptr ? nullptr : FindField(d, parts[i]);
      d = field == nullptr ? nullptr : field->message_type();
      if (i + 1 == parts.size()) break;
      Json& child = (*node)[parts[i]];  // creates null when absent
      if (child.is_null()) child = Json::object();
      if (!child.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--set '", o, "': ", absl::StrJoin(parts.begin(), parts.begin() + i + 1, "."),
            " is a ", child.type_name(), ", not an object, so it has no field '", parts[i + 1],
            "'"));
      }
      node = &child;
    }
    Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    const bool scalar = !value.is_discarded() && (value.is_number() || value.is_boolean() ||
                                                  value.is_null() || value.is_string());
    // A string field takes the text as typed (--set name=2024), unless it is quoted; a
    // list field also takes a JSON list (--set 'data.tokens=["a.bin","b.bin"]').
    const bool string_field =
        field != nullptr && field->cpp_type() == FieldDescriptor::CPPTYPE_STRING;
    const bool list =
        field != nullptr && field->is_repeated() && !value.is_discarded() && value.is_array();
    if (!list && (!scalar || (string_field && !value.is_string()))) value = text;
    (*node)[parts.back()] = std::move(value);
  }
  return root.dump(2);
}

absl::StatusOr<pb::JobSpec> ParseJobSpec(absl::string_view json) {
  ASSIGN_OR_RETURN(Json root, ParseObject(json));
  // Parsed again from the text as written unless a string had to be wrapped.
  const std::string proto_json =
      WrapSingleStrings(root, pb::JobSpec::descriptor()) ? root.dump() : std::string(json);
  std::vector<std::string> problems;
  Walk(root, pb::JobSpec::descriptor(), "", &problems);
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
  pb::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  if (auto st = google::protobuf::util::JsonStringToMessage(proto_json, &spec, options); !st.ok()) {
    // protobuf says "(pipeline.stages): invalid value ..."; say it like every other error.
    std::string message(st.message());
    const size_t close = message.find("): ");
    if (message.starts_with('(') && close != std::string::npos) {
      message = absl::StrCat(message.substr(1, close - 1), ": ", message.substr(close + 3));
    }
    return absl::InvalidArgumentError(message);
  }
  return spec;
}

std::string JobSpecToJson(const pb::JobSpec& spec) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Printing a valid message cannot fail; an empty object is the fallback all the same.
  if (!google::protobuf::util::MessageToJsonString(spec, &out, options).ok()) out = "{}\n";
  return out;
}

}  // namespace pipetrain::coordinator
