// The Prometheus text exposition format, version 0.0.4: metric families with their HELP
// and TYPE lines, escaped label values, and floats that parse back exactly. Knows
// nothing about pipetrain; prometheus_metrics.h fills it.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pipetrain::coordinator {

// What a scrape of the text format must be answered with.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// One family: a name, its help and type, and its samples. The format wants every sample
// of a family right after its HELP and TYPE, so samples are gathered first and written
// together.
class MetricFamily {
 public:
  MetricFamily(std::string name, std::string help, std::string type = "gauge");
  void Add(MetricLabels labels, double value);
  // HELP, TYPE, then one line per sample; nothing without samples, so a scrape carries
  // no families that say nothing.
  void AppendTo(std::string& out) const;

 private:
  std::string name_, help_, type_;
  std::vector<std::pair<MetricLabels, double>> samples_;
};

// Backslash, double quote and newline escaped as the format requires.
std::string EscapeLabelValue(std::string_view value);
// The shortest text that parses back to `value`; NaN, +Inf and -Inf as Prometheus spells them.
std::string FormatSampleValue(double value);

}  // namespace pipetrain::coordinator
