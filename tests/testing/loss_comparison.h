// Loss-curve comparisons for the end-to-end tests, as ::testing::AssertionResult: on
// failure they print every step's expected and actual loss and relative error, the
// steps out of tolerance marked, so one failing step shows the whole curve around it.
// The tolerances come from tests/testing/tolerance.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain::testing {

namespace internal {

// |actual - expected| / |expected|, the measure every transparency test uses.
inline double RelativeError(double actual, double expected) {
  return std::abs(actual - expected) / std::abs(expected);
}

inline std::string Scientific(double x) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3e", x);
  return text;
}

// A number as the table shows it, or "-" for a step one side lacks.
inline std::string Cell(const std::vector<double>& losses, size_t i) {
  if (i >= losses.size()) return "-";
  char cell[32];
  std::snprintf(cell, sizeof(cell), "%.9g", losses[i]);
  return cell;
}

// One row a step; the rows where `bad(step)` holds end in `marker`.
template <typename Bad>
std::string LossTable(const std::vector<double>& actual, const std::vector<double>& expected,
                      const Bad& bad, const char* marker) {
  std::string table = "   step        expected          actual   rel. error\n";
  const size_t steps = std::max(actual.size(), expected.size());
  char row[160];
  for (size_t i = 0; i < steps; ++i) {
    const bool both = i < actual.size() && i < expected.size();
    std::snprintf(row, sizeof(row), "  %5zu  %14s  %14s  %11s%s\n", i + 1,
                  Cell(expected, i).c_str(), Cell(actual, i).c_str(),
                  both ? Scientific(RelativeError(actual[i], expected[i])).c_str() : "",
                  !both ? "  <-- missing" : bad(i) ? marker : "");
    table += row;
  }
  return table;
}

}  // namespace internal

// Every step's loss within its tolerance of `expected`'s, relatively (a NaN never
// passes), and as many steps: tolerances[i] for step i + 1. Each is one of
// tests/testing/tolerance.h's, for the arithmetic that separates the two runs.
inline ::testing::AssertionResult LossesMatch(const std::vector<double>& actual,
                                              const std::vector<double>& expected,
                                              const std::vector<double>& tolerances) {
  auto bad = [&](size_t i) {
    const double tolerance = i < tolerances.size() ? tolerances[i] : 0;
    return !(internal::RelativeError(actual[i], expected[i]) <= tolerance);
  };
  size_t failing = actual.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(actual.size(), expected.size()); ++i) failing += bad(i);
  if (failing == 0) return ::testing::AssertionSuccess();
  auto result = ::testing::AssertionFailure();
  if (actual.size() != expected.size()) {
    result << actual.size() << " losses where " << expected.size() << " were expected; ";
  }
  result << "losses differ beyond a relative ";
  if (std::all_of(tolerances.begin(), tolerances.end(),
                  [&](double t) { return t == tolerances.front(); })) {
    result << (tolerances.empty() ? "0" : internal::Scientific(tolerances.front()));
  } else {
    for (size_t i = 0; i < tolerances.size(); ++i) {
      result << (i ? ", " : "(per step) ") << internal::Scientific(tolerances[i]);
    }
  }
  return result << ":\n"
                << internal::LossTable(actual, expected, bad, "  <-- out of tolerance");
}

// The same tolerance at every step; kSameArithmetic (0) asks for the same bits.
inline ::testing::AssertionResult LossesMatch(const std::vector<double>& actual,
                                              const std::vector<double>& expected,
                                              double tolerance) {
  return LossesMatch(actual, expected, std::vector<double>(expected.size(), tolerance));
}

// The losses from step `first_step` (1-based) on each differ from `expected`'s by more
// than `min_difference`, relatively: proof that a setting really changed the training.
inline ::testing::AssertionResult LossesDiffer(const std::vector<double>& actual,
                                               const std::vector<double>& expected,
                                               size_t first_step, double min_difference) {
  auto bad = [&](size_t i) {
    return i + 1 >= first_step &&
           !(internal::RelativeError(actual[i], expected[i]) > min_difference);
  };
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << actual.size() << " losses where " << expected.size() << " were expected:\n"
           << internal::LossTable(actual, expected, bad, "  <-- too close");
  }
  bool same = false;
  for (size_t i = 0; i < actual.size(); ++i) same |= bad(i);
  if (!same) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "from step " << first_step << " on, every loss should differ by more than a relative "
         << internal::Scientific(min_difference) << ":\n"
         << internal::LossTable(actual, expected, bad, "  <-- too close");
}

}  // namespace pipetrain::testing
