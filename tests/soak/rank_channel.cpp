#include "tests/soak/rank_channel.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>

namespace muon::soak {

std::vector<std::string> split_words(const std::string& line, size_t max_words) {
  std::vector<std::string> words;
  size_t pos = 0;
  while (pos < line.size() && words.size() + 1 < max_words) {
    const size_t end = line.find(' ', pos);
    if (end == std::string::npos) break;
    words.push_back(line.substr(pos, end - pos));
    pos = end + 1;
  }
  if (pos < line.size()) words.push_back(line.substr(pos));
  return words;
}

void RankChannel::emit(const std::string& line) {
  std::string out = line + "\n";
  const char* p = out.data();
  size_t left = out.size();
  while (left > 0) {
    const ssize_t n = ::write(STDOUT_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("soak rank: the driver's pipe is closed");
    p += n;
    left -= static_cast<size_t>(n);
  }
}

std::optional<std::string> RankChannel::next_command(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (const size_t nl = pending_.find('\n'); nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    pollfd pfd{STDIN_FILENO, POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return std::nullopt;
    char buf[256];
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("soak rank: stdin closed (the driver is gone)");
    pending_.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace muon::soak
