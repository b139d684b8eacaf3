// Runs the project's binaries from tests: start with pipes, read stdout lines with a
// deadline, signal and reap by pid. Every wait has a deadline; a child still alive
// when its Subprocess is destroyed is killed (only that pid).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::testing {

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string out;
  std::string err;
};

// Runs argv to completion (killing it at the deadline) and returns its output.
absl::StatusOr<RunResult> RunCommand(const std::vector<std::string>& argv,
                                     std::chrono::milliseconds deadline);

class Subprocess {
 public:
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv);
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // Reads stdout until a line containing `needle`; returns that line.
  absl::StatusOr<std::string> WaitForLine(const std::string& needle,
                                          std::chrono::milliseconds deadline);
  void Signal(int sig);
  // Waits for exit; returns the exit code (-1 if killed by a signal). At the deadline
  // the child is killed and an error returned. Once it has ended, returns the same code
  // again at once (-1 after a kill at the deadline): the pid may be another process's.
  absl::StatusOr<int> Wait(std::chrono::milliseconds deadline);
  std::string stderr_text() const;  // what it wrote to stderr so far

 private:
  friend absl::StatusOr<RunResult> RunCommand(const std::vector<std::string>& argv,
                                              std::chrono::milliseconds deadline);
  Subprocess() = default;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string err_path_;
  std::string buffered_;
  bool reaped_ = false;
  int exit_code_ = -1;  // once reaped_
};

}  // namespace pipetrain::testing
