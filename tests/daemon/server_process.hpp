// A real muon-offloadd process for tests: spawned on a socket in a temp folder, waited on
// until healthy, stopped with SIGTERM (or SIGKILL) at the end.
#pragma once

#include "transport/asio.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "process.hpp"
#include "transport/endpoint.hpp"
#include "transport/frame.hpp"
#include "transport/messages.hpp"

namespace muon::testing {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const int kThreads = 1;  // server and reference must agree on OpenBLAS threads for bitwise

/// A TCP port free right now on 127.0.0.1 (bound to port 0, then released), for --listen.
inline uint16_t free_tcp_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::address_v4::loopback(), 0});
  return a.local_endpoint().port();
}

/// Writes `token` and a newline to dir/token with `perms` (private by default, as the server
/// requires for --auth-token-file); returns its path.
inline std::string write_token_file(const fs::path& dir, const std::string& token,
                                    fs::perms perms = fs::perms::owner_read |
                                                      fs::perms::owner_write) {
  const auto path = dir / "token";
  std::ofstream(path) << token << "\n";
  fs::permissions(path, perms);
  return path.string();
}

inline fs::path temp_dir() {
  char tmpl[] = "/tmp/muon-it-XXXXXX";
  const char* d = mkdtemp(tmpl);
  if (!d) throw std::runtime_error("mkdtemp failed");
  return d;
}

// One muon-offloadd process.
class ServerProcess {
 public:
  ServerProcess(const fs::path& dir, std::vector<std::string> extra = {},
                const std::string& name = "s")
      : socket_((dir / (name + ".sock")).string()) {
    std::vector<std::string> argv = {MUON_OFFLOADD, "--socket",    socket_,
                                     "--threads",   std::to_string(kThreads), "--log-level",
                                     "warn"};
    // Small slots (many chunks per tensor) unless the test sizes them itself.
    if (std::find(extra.begin(), extra.end(), "--slot-kib") == extra.end()) {
      argv.insert(argv.end(), {"--slot-kib", "64"});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    // Flags of every server of the run (the `deferred_copies.` tests: --defer-host-copies).
    if (const char* more = std::getenv("MUON_TEST_SERVER_ARGS")) {
      std::istringstream words(more);
      for (std::string w; words >> w;) argv.push_back(w);
    }
    pid_ = spawn(argv);
    wait_healthy();
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      wait_exit(pid_, 10s);
    }
  }
  void kill9() {
    kill(pid_, SIGKILL);
    wait_exit(pid_, 10s);
    pid_ = -1;
  }
  std::optional<int> terminate() {
    kill(pid_, SIGTERM);
    auto rc = wait_exit(pid_, 20s);
    pid_ = -1;
    return rc;
  }
  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }

  // Frames over a raw socket, for health checks and abuse tests.
  // `endpoint`: a socket path or tcp://HOST:PORT. Throws (boost::system::system_error) when the
  // server closes the connection before answering.
  static transport::Frame roundtrip(const std::string& endpoint,
                                    const std::vector<std::byte>& bytes) {
    boost::asio::io_context io;
    boost::asio::generic::stream_protocol::socket s(io);
    s.connect(transport::resolve(transport::parse_endpoint(endpoint), io));
    boost::asio::write(s, boost::asio::buffer(bytes));
    transport::FrameDecoder dec;
    std::array<std::byte, 4096> buf;
    for (;;) {
      const size_t n = s.read_some(boost::asio::buffer(buf));
      dec.feed(buf.data(), n);
      if (auto f = dec.next()) return *f;
    }
  }

 private:
  void wait_healthy() {
    const auto end = std::chrono::steady_clock::now() + 20s;
    for (;;) {
      try {
        auto f = roundtrip(socket_,
                           transport::encode_frame(
                               {static_cast<uint16_t>(transport::MessageType::health), 1, "{}"}));
        if (f.type == static_cast<uint16_t>(transport::MessageType::health_ok)) return;
      } catch (const std::exception&) {
      }
      if (std::chrono::steady_clock::now() > end || !alive(pid_)) {
        throw std::runtime_error("muon-offloadd did not become healthy on " + socket_);
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  std::string socket_;
  pid_t pid_ = -1;
};

}  // namespace muon::testing
