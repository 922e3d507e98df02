// The observability surface of a real muon-offloadd under hostile or careless use: malformed,
// oversized and pipelined HTTP on --metrics-port, hundreds of idle connections, a step_report
// whose payload is not UTF-8, `muon-offload status` against a path that is not a socket and
// against a listener that never answers. In every case the server keeps serving.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/server_process.hpp"
#include "observability.hpp"

using namespace muon;
using namespace muon::testing;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

// Sends `bytes` on a fresh TCP connection, then reads until the server closes (or resets).
std::string raw_http(uint16_t port, const std::string& bytes) {
  asio::io_context io;
  tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  boost::system::error_code ec;
  asio::write(s, asio::buffer(bytes), ec);
  s.shutdown(tcp::socket::shutdown_send, ec);
  std::string out;
  std::array<char, 65536> buf;
  for (;;) {
    const size_t n = s.read_some(asio::buffer(buf), ec);
    if (ec) break;
    out.append(buf.data(), n);
  }
  return out;
}

// "HTTP/1.1 400 Bad Request\r\n..." -> 400; 0 when the answer is empty.
int status_of(const std::string& answer) {
  if (answer.rfind("HTTP/1.", 0) != 0 || answer.size() < 12) return 0;
  return std::stoi(answer.substr(9, 3));
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

size_t open_fds(pid_t pid) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    ++n;
  }
  return n;
}

void expect_serving(const ServerProcess& server, uint16_t port) {
  const auto a = http_get(port, "/metrics");
  EXPECT_EQ(a.status, 200);
  EXPECT_NE(a.body.find("muon_offload_uptime_seconds"), std::string::npos);
  const auto st = run_cli("status --json --socket " + server.socket());
  EXPECT_EQ(st.exit_code, 0) << st.out;
}

}  // namespace

TEST(MetricsAbuse, MalformedRequestsGetAnErrorStatusAndTheServerLivesOn) {
  const auto dir = temp_dir();
  const uint16_t port = free_tcp_port();
  ServerProcess server(dir, {"--metrics-port", std::to_string(port)});

  EXPECT_EQ(status_of(raw_http(port, std::string("\x00\xff\x13garbage\r\n\r\n", 14))), 400);
  EXPECT_EQ(status_of(raw_http(port, "GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n")), 400);
  EXPECT_EQ(
      status_of(raw_http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")),
      400);
  // A 1 MiB request line and a 100 kB header: over Beast's 8 KiB header limit.
  EXPECT_EQ(status_of(raw_http(
                port, "GET /" + std::string(1 << 20, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n")),
            431);
  EXPECT_EQ(status_of(raw_http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: " +
                                         std::string(100000, 'a') + "\r\n\r\n")),
            431);
  // A small body on POST: 405; a 3 MB body: over the 1 MiB body limit.
  EXPECT_EQ(status_of(raw_http(port,
                               "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                               "Connection: close\r\n\r\nhello")),
            405);
  const auto big =
      raw_http(port, "PUT /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n\r\n" +
                         std::string(3000000, 'x'));
  EXPECT_EQ(status_of(big), 413) << big.substr(0, 200);
  expect_serving(server, port);
}

TEST(MetricsAbuse, HttpOneZeroPipeliningAndAbsoluteTargetsAreAnswered) {
  const auto dir = temp_dir();
  const uint16_t port = free_tcp_port();
  ServerProcess server(dir, {"--metrics-port", std::to_string(port)});

  // HTTP/1.0 without Host: answered in 1.0 and closed.
  const auto old = raw_http(port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(old.rfind("HTTP/1.0 200", 0), 0u) << old.substr(0, 100);
  EXPECT_NE(old.find("muon_offload_build_info"), std::string::npos);
  // Three pipelined requests on one connection: three answers, in order.
  const auto piped = raw_http(port,
                              "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                              "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                              "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(count(piped, "HTTP/1.1 200 OK"), 2u);
  EXPECT_EQ(count(piped, "HTTP/1.1 404 Not Found"), 1u);
  EXPECT_LT(piped.find("200 OK"), piped.find("404 Not Found"));
  // An absolute-form target names the same resource (RFC 9112 3.2.2).
  EXPECT_EQ(status_of(raw_http(port,
                               "GET http://127.0.0.1/metrics HTTP/1.1\r\nHost: x\r\n"
                               "Connection: close\r\n\r\n")),
            200);
  expect_serving(server, port);
}

TEST(MetricsAbuse, FiveHundredIdleConnectionsNeitherBlockAScrapeNorHoldFiveHundredDescriptors) {
  const auto dir = temp_dir();
  const uint16_t port = free_tcp_port();
  ServerProcess server(dir, {"--metrics-port", std::to_string(port)});
  const size_t before = open_fds(server.pid());

  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> idle;
  for (int i = 0; i < 500; ++i) {
    auto s = std::make_unique<tcp::socket>(io);
    s->connect({asio::ip::make_address("127.0.0.1"), port});
    if (i % 2 == 1) asio::write(*s, asio::buffer(std::string("GET /metrics HTTP/1.1\r\n")));
    idle.push_back(std::move(s));
  }
  // Accepted in order: once this scrape is answered, every idle connection was accepted.
  const auto a = http_get(port, "/metrics");
  EXPECT_EQ(a.status, 200);
  // The endpoint keeps at most its cap (64) of them open, not 500 descriptors.
  EXPECT_LT(open_fds(server.pid()), before + 100);
  // Connections closed mid-request, some with a reset.
  for (size_t i = 0; i < idle.size(); ++i) {
    if (i % 3 == 0) idle[i]->set_option(asio::socket_base::linger(true, 0));
    idle[i]->close();
  }
  expect_serving(server, port);
}

TEST(MetricsAbuse, AStepReportThatIsNotUtf8IsRefusedAndTheServerLivesOn) {
  const auto dir = temp_dir();
  const uint16_t port = free_tcp_port();
  ServerProcess server(dir, {"--metrics-port", std::to_string(port)});
  namespace tr = transport;
  auto frame = [](tr::MessageType t, std::string payload) {
    return tr::encode_frame({static_cast<uint16_t>(t), 7, std::move(payload)});
  };
  asio::io_context io;
  asio::local::stream_protocol::socket s(io);
  s.connect(asio::local::stream_protocol::endpoint(server.socket()));
  tr::FrameDecoder dec;
  auto next = [&] {
    std::array<std::byte, 4096> buf;
    for (;;) {
      if (auto f = dec.next()) return *f;
      const size_t n = s.read_some(asio::buffer(buf));
      dec.feed(buf.data(), n);
    }
  };
  auto send = [&](const std::vector<std::byte>& b) { asio::write(s, asio::buffer(b)); };

  send(frame(tr::MessageType::step_report, R"({"step":1,"exposed_wait_ns":5,"bytes_pushed":1})"));
  auto e = next();
  ASSERT_EQ(e.type, static_cast<uint16_t>(tr::MessageType::error));
  EXPECT_NE(e.payload.find("before hello"), std::string::npos) << e.payload;
  send(frame(tr::MessageType::hello, R"({"rank":0,"world_size":1,"client":"abuser"})"));
  ASSERT_EQ(next().type, static_cast<uint16_t>(tr::MessageType::hello_ok));
  for (const std::string& bad :
       {std::string(R"({"step":1,"exposed_wait_ns":-5,"bytes_pushed":1})"),
        std::string(R"({"step":1,"exposed_wait_ns":1.5,"bytes_pushed":1})"),
        std::string(R"({"step":1,"exposed_wait_ns":NaN,"bytes_pushed":1})"),
        std::string(R"({"step":1,"exposed_wait_ns":9223372036854775808,"bytes_pushed":1})"),
        std::string("\xff\xfe"), std::string("{\"step\":1,\"slowest_parameter\":\"\xc3\x28\"}")}) {
    send(frame(tr::MessageType::step_report, bad));
    e = next();
    ASSERT_EQ(e.type, static_cast<uint16_t>(tr::MessageType::error)) << bad;
    EXPECT_NE(e.payload.find("bad_request"), std::string::npos) << e.payload;
  }
  // The largest report the protocol takes is counted, not refused.
  send(frame(
      tr::MessageType::step_report,
      R"({"step":3,"exposed_wait_ns":4611686018427387904,"bytes_pushed":4611686018427387904})"));
  const auto m = scrape_until(port, [](const auto& m) {
    return series(m, "muon_offload_client_step_reports_total") >= 1.0;
  });
  EXPECT_EQ(series(m, "muon_offload_client_step_reports_total"), 1.0);
  EXPECT_EQ(series(m, "muon_offload_errors_total{code=\"bad_request\"}"), 7.0);
  expect_serving(server, port);
}

TEST(MetricsAbuse, StatusSaysWhatIsWrongWithAPathThatIsNotAServer) {
  const auto dir = temp_dir();
  const auto file = (dir / "not-a-socket").string();
  std::ofstream(file) << "x";
  auto r = run_cli("status --timeout-ms 200 --socket " + file);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("is not a socket"), std::string::npos) << r.out;

  // A listener that accepts and never answers: status gives up after its timeout and calls it
  // hung (exit 3), not absent: no second server should be started on a live socket.
  const auto mute = (dir / "mute.sock").string();
  asio::io_context io;
  asio::local::stream_protocol::acceptor acceptor(io, asio::local::stream_protocol::endpoint(mute));
  r = run_cli("status --timeout-ms 300 --socket " + mute);
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find("did not answer status within 300 ms"), std::string::npos) << r.out;
}
