// Helpers of the observability tests (a free TCP port: server_process.hpp): an HTTP GET with Beast,
// the Prometheus text format parsed into series -> value, a client step, and the orthogonality
// error computed in double from a returned update.
#pragma once

#include "transport/asio.hpp"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/client.hpp"
#include "daemon/server_process.hpp"
#include "kernels/scale_rule.hpp"

namespace muon::testing {

struct HttpAnswer {
  int status = 0;
  std::string content_type;
  std::string body;
};

/// GET http://127.0.0.1:port/target over a fresh TCP connection.
inline HttpAnswer http_get(uint16_t port, const std::string& target) {
  namespace http = boost::beast::http;
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket s(io);
  s.connect({boost::asio::ip::make_address("127.0.0.1"), port});
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "127.0.0.1");
  http::write(s, req);
  boost::beast::flat_buffer buf;
  http::response<http::string_body> res;
  http::read(s, buf, res);
  return {static_cast<int>(res.result_int()), std::string(res[http::field::content_type]),
          res.body()};
}

/// Prometheus text exposition -> {"name{labels}": value}; comments skipped.
inline std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

/// Scrapes until `done(metrics)` holds (a server handles reports and goodbyes asynchronously),
/// for at most 20 s; returns the last scrape either way.
inline std::map<std::string, double> scrape_until(
    uint16_t port, const std::function<bool(const std::map<std::string, double>&)>& done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    auto m = parse_metrics(http_get(port, "/metrics").body);
    if (done(m) || std::chrono::steady_clock::now() > end) return m;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

/// value of a series, or -1 when the scrape does not hold it.
inline double series(const std::map<std::string, double>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? -1.0 : it->second;
}

/// A deterministic full-rank gradient: uniform in [-1, 1) from a hash of (i, step, salt)
/// (splitmix64), so that its singular values are spread like a random matrix's.
inline std::vector<float> test_gradient(int64_t n, int64_t step, int salt) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull +
                 static_cast<uint64_t>(step) * 0xBF58476D1CE4E5B9ull +
                 static_cast<uint64_t>(salt) * 0x94D049BB133111EBull + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    g[i] = static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }
  return g;
}

/// ||X X^T - I||_F / sqrt(m) in double for the wide orientation X of U / factor, U rows x cols.
inline double orthogonality_error(const std::vector<float>& u, int64_t rows, int64_t cols,
                                  double factor) {
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows, k = tall ? rows : cols;
  auto x = [&](int64_t i, int64_t j) {  // X[i][j] of the wide orientation
    const float v = tall ? u[j * cols + i] : u[i * cols + j];
    return static_cast<double>(v) / factor;
  };
  double sum = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double g = 0.0;
      for (int64_t l = 0; l < k; ++l) g += x(i, l) * x(j, l);
      const double d = g - (i == j ? 1.0 : 0.0);
      sum += d * d;
    }
  }
  return std::sqrt(sum / static_cast<double>(m));
}

/// What a `muon-offload` run printed (stdout and stderr) and its exit code (-1: not run or
/// killed by a signal).
struct CliRun {
  int exit_code = -1;
  std::string out;
};

/// Runs the CLI (MUON_OFFLOAD_CLI, set by CMake) through the shell with `args` (test-made paths
/// without spaces).
inline CliRun run_cli(const std::string& args) {
  CliRun r;
  FILE* p = ::popen((std::string(MUON_OFFLOAD_CLI) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace muon::testing
