// Stages that share an emulated device (--device emulated:NAME@SHARED) take turns on
// it, across processes: the order of events is checked, not their speed.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "stage_server/exec/emulated_chunk.h"

namespace pipetrain::stage_server {
namespace {

double MonotonicSeconds() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Another process holds the shared device: this one's turn starts after it lets go.
TEST(EmulatedDeviceTest, AnotherProcessHoldingTheDeviceDelaysThisOne) {
  const std::string name = absl::StrCat("test-", getpid());
  int held[2], released[2];
  ASSERT_EQ(pipe(held), 0);
  ASSERT_EQ(pipe(released), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int fd = open(SharedDeviceLockPath(name).c_str(), O_RDWR | O_CREAT, 0666);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) _exit(1);
    if (write(held[1], "x", 1) != 1) _exit(1);
    usleep(200 * 1000);
    const double at = MonotonicSeconds();
    if (write(released[1], &at, sizeof(at)) != sizeof(at)) _exit(1);
    flock(fd, LOCK_UN);
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(held[0], &c, 1), 1);
  OccupyEmulatedDevice(0.001, name);
  const double done = MonotonicSeconds();
  double released_at = 0;
  ASSERT_EQ(read(released[0], &released_at, sizeof(released_at)),
            static_cast<ssize_t>(sizeof(released_at)));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_GE(done, released_at);
  unlink(SharedDeviceLockPath(name).c_str());
}

// Two threads of one process on one shared device: their turns do not overlap, so the
// two take at least the sum of their times.
TEST(EmulatedDeviceTest, ThreadsOfOneProcessTakeTurnsToo) {
  const std::string name = absl::StrCat("test-threads-", getpid());
  double start[2], end[2];
  auto occupy = [&](int i) {
    start[i] = MonotonicSeconds();
    OccupyEmulatedDevice(0.05, name);
    end[i] = MonotonicSeconds();
  };
  std::thread a(occupy, 0), b(occupy, 1);
  a.join();
  b.join();
  EXPECT_GE(std::max(end[0], end[1]) - std::min(start[0], start[1]), 0.1);
  unlink(SharedDeviceLockPath(name).c_str());
}

}  // namespace
}  // namespace pipetrain::stage_server
