#include "coordinator/metrics/prometheus_text.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {
namespace {

// The format escapes backslash and newline in HELP text and label values, and double
// quotes only in label values (they are literal in HELP text).
std::string Escape(std::string_view text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  return Escape(value, /*quotes=*/true);
}

std::string FormatSampleValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return ec == std::errc() ? std::string(buffer, end) : absl::StrCat(value);
}

MetricFamily::MetricFamily(std::string name, std::string help, std::string type)
    : name_(std::move(name)), help_(std::move(help)), type_(std::move(type)) {}

void MetricFamily::Add(MetricLabels labels, double value) {
  samples_.emplace_back(std::move(labels), value);
}

void MetricFamily::AppendTo(std::string& out) const {
  if (samples_.empty()) return;
  absl::StrAppend(&out, "# HELP ", name_, " ", Escape(help_, /*quotes=*/false), "\n# TYPE ", name_, " ",
                  type_, "\n");
  for (const auto& [labels, value] : samples_) {
    out += name_;
    if (!labels.empty()) {
      out += '{';
      for (size_t i = 0; i < labels.size(); ++i) {
        absl::StrAppend(&out, i > 0 ? "," : "", labels[i].first, "=\"",
                        EscapeLabelValue(labels[i].second), "\"");
      }
      out += '}';
    }
    absl::StrAppend(&out, " ", FormatSampleValue(value), "\n");
  }
}

}  // namespace pipetrain::coordinator
