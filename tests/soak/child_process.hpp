// A child process of the soak driver (the server or a rank), started with posix_spawn: stdin and
// stdout optionally piped to the driver, everything else written to a log file.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace muon::soak {

class ChildProcess {
 public:
  /// Starts argv[0] with the arguments and the driver's environment. With `pipe_stdio` the
  /// child's stdin and stdout are pipes to the driver (stdin_fd(), take_stdout_fd()) and stderr
  /// goes to `log_path`; without, stdin is /dev/null and stdout and stderr go to `log_path`.
  /// Throws std::runtime_error naming the program and the OS error.
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path, bool pipe_stdio);
  /// Kills (SIGKILL) and reaps a child still running; closes the pipe ends still held.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  /// The read end of the child's stdout; the caller owns it from now on (-1 without pipes).
  int take_stdout_fd();
  /// Writes one line to the child's stdin; false when the pipe is closed (the child is gone).
  bool write_line(const std::string& line);

  void signal(int sig);
  /// The exit status once the child exited (reaped here, without blocking): the exit code, or
  /// 128 + the signal number for a child killed by a signal.
  std::optional<int> poll_exit();
  /// Like poll_exit, waiting up to `timeout`.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::optional<int> exit_;
};

}  // namespace muon::soak
