// How the planner's tables (schedules, recompute modes) list their rows in help and
// errors: "a, b, c or d", and one "  name  description" line per row. A row is any
// struct with `name` and `description`.
#pragma once

#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>

namespace pipetrain::planner {

template <typename Rows>
std::string OrList(const Rows& rows) {
  std::string out;
  size_t i = 0;
  for (const auto& row : rows) {
    if (i > 0) out += i + 1 == std::size(rows) ? " or " : ", ";
    out += row.name;
    ++i;
  }
  return out;
}

// The descriptions start in one column.
template <typename Rows>
std::string HelpLines(const Rows& rows) {
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, std::string_view(row.name).size());
  std::string out;
  for (const auto& row : rows) {
    const std::string_view name = row.name;
    out += "  ";
    out += name;
    out += std::string(width + 2 - name.size(), ' ');
    out += row.description;
    out += '\n';
  }
  return out;
}

}  // namespace pipetrain::planner
