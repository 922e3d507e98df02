#include "tests/soak/child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace muon::soak {

namespace {

std::runtime_error os_error(const std::string& what, int err) {
  return std::runtime_error(what + ": " + std::strerror(err));
}

}  // namespace

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log_path,
                           bool pipe_stdio) {
  int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1};
  if (pipe_stdio && (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0)) {
    throw os_error("pipe for " + argv.at(0), errno);
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const int log_flags = O_WRONLY | O_CREAT | O_TRUNC;
  if (pipe_stdio) {
    posix_spawn_file_actions_adddup2(&fa, in_pipe[0], STDIN_FILENO);  // dup2 clears CLOEXEC
    posix_spawn_file_actions_adddup2(&fa, out_pipe[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, log_path.c_str(), log_flags, 0644);
  } else {
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log_path.c_str(), log_flags, 0644);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int rc = posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (pipe_stdio) {
    ::close(in_pipe[0]);
    ::close(out_pipe[1]);
    in_ = in_pipe[1];
    out_ = out_pipe[0];
  }
  if (rc != 0) {
    if (in_ >= 0) ::close(in_);
    if (out_ >= 0) ::close(out_);
    throw os_error("cannot start " + argv[0], rc);
  }
}

ChildProcess::~ChildProcess() {
  if (!exit_) {
    ::kill(pid_, SIGKILL);
    wait_exit(std::chrono::seconds(10));
  }
  if (in_ >= 0) ::close(in_);
  if (out_ >= 0) ::close(out_);
}

int ChildProcess::take_stdout_fd() {
  const int fd = out_;
  out_ = -1;
  return fd;
}

bool ChildProcess::write_line(const std::string& line) {
  if (in_ < 0) return false;
  const std::string out = line + "\n";
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::write(in_, out.data() + done, out.size() - done);  // SIGPIPE ignored
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

void ChildProcess::signal(int sig) {
  if (!exit_) ::kill(pid_, sig);
}

std::optional<int> ChildProcess::poll_exit() {
  if (exit_) return exit_;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    if (WIFEXITED(status)) exit_ = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) exit_ = 128 + WTERMSIG(status);
  }
  return exit_;
}

std::optional<int> ChildProcess::wait_exit(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!poll_exit() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return exit_;
}

}  // namespace muon::soak
