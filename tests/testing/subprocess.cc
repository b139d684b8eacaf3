#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::testing {
namespace {

using Clock = std::chrono::steady_clock;

int DecodeWaitStatus(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

absl::StatusOr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  char tmpl[] = "/tmp/pipetrain-test-stderr-XXXXXX";
  int err_fd = mkstemp(tmpl);
  if (err_fd < 0) return absl::InternalError("mkstemp failed");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // The child must not inherit the test's blocked signals.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  close(err_fd);
  Subprocess p;
  p.pid_ = pid;
  p.out_fd_ = out[0];
  p.err_path_ = tmpl;
  return p;
}

Subprocess::Subprocess(Subprocess&& o) noexcept
    : pid_(o.pid_), out_fd_(o.out_fd_), err_path_(std::move(o.err_path_)),
      buffered_(std::move(o.buffered_)), reaped_(o.reaped_), exit_code_(o.exit_code_) {
  o.pid_ = -1;
  o.out_fd_ = -1;
  o.reaped_ = true;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (!err_path_.empty()) unlink(err_path_.c_str());
}

absl::StatusOr<std::string> Subprocess::WaitForLine(const std::string& needle,
                                                    std::chrono::milliseconds deadline) {
  const auto end = Clock::now() + deadline;
  while (true) {
    size_t nl;
    while ((nl = buffered_.find('\n')) != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      if (line.find(needle) != std::string::npos) return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no line containing '", needle, "' within ", deadline.count(), " ms; stderr: ",
          stderr_text()));
    }
    pollfd pfd{out_fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    ssize_t n = read(out_fd_, buf, sizeof buf);
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat("stdout closed before a line containing '",
                                                 needle, "'; stderr: ", stderr_text()));
    }
    buffered_.append(buf, n);
  }
}

void Subprocess::Signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

absl::StatusOr<int> Subprocess::Wait(std::chrono::milliseconds deadline) {
  if (reaped_) return exit_code_;
  const auto end = Clock::now() + deadline;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      exit_code_ = DecodeWaitStatus(status);
      return exit_code_;
    }
    if (Clock::now() >= end) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      reaped_ = true;
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " did not exit within ", deadline.count(), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string Subprocess::stderr_text() const {
  std::ifstream in(err_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<RunResult> RunCommand(const std::vector<std::string>& argv,
                                     std::chrono::milliseconds deadline) {
  auto p = Subprocess::Start(argv);
  if (!p.ok()) return p.status();
  RunResult r;
  // Drain stdout until EOF or deadline, then reap.
  const auto end = Clock::now() + deadline;
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
    if (left.count() <= 0) break;
    pollfd pfd{p->out_fd_, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t n = read(p->out_fd_, buf, sizeof buf);
    if (n <= 0) break;
    r.out.append(buf, n);
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
  auto code = p->Wait(std::max(left, std::chrono::milliseconds(1)));
  if (!code.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(absl::StrJoin(argv, " "), ": ",
                                                    code.status().message()));
  }
  r.exit_code = *code;
  r.err = p->stderr_text();
  return r;
}

}  // namespace pipetrain::testing
