// TCP control connections: endpoint parsing; a client on "tcp://127.0.0.1:PORT" with the
// server's token (config or MUON_OFFLOAD_TOKEN_FILE) runs 2 steps bitwise equal to the same run
// over the Unix socket (data plane shm: same host); a wrong or missing token is refused with
// ServerError "unauthorized" naming the token; health over TCP works, status over TCP is refused
// before connecting with the reason; a token file is never read for Unix sockets only.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "client/auth_token_source.hpp"
#include "client/health_probe.hpp"
#include "client_fixtures.hpp"
#include "transport/endpoint.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

const std::string kToken = "muon-test-token-0123456789abcdef";

// Unsets MUON_OFFLOAD_TOKEN_FILE for a test and restores it after.
class TokenEnv {
 public:
  TokenEnv() {
    if (const char* v = std::getenv(client::kTokenFileEnv)) saved_ = v;
    ::unsetenv(client::kTokenFileEnv);
  }
  ~TokenEnv() {
    if (saved_.empty()) {
      ::unsetenv(client::kTokenFileEnv);
    } else {
      ::setenv(client::kTokenFileEnv, saved_.c_str(), 1);
    }
  }
  void set(const std::string& v) { ::setenv(client::kTokenFileEnv, v.c_str(), 1); }

 private:
  std::string saved_;
};

// A CPU server on a Unix socket and on 127.0.0.1:port with the test's token.
struct TcpServer {
  explicit TcpServer(const fs::path& dir)
      : port(free_tcp_port()),
        token_file(write_token_file(dir, kToken)),
        process(dir, {"--backend", "cpu", "--listen", "127.0.0.1:" + std::to_string(port),
                      "--auth-token-file", token_file}) {}
  std::string tcp() const { return "tcp://127.0.0.1:" + std::to_string(port); }
  uint16_t port;
  std::string token_file;
  ServerProcess process;
};

// Two steps of one parameter named `name` through a client of `cfg`: the updates.
std::vector<std::vector<float>> two_steps(const client::ClientConfig& cfg,
                                          const std::string& name) {
  client::Client c(cfg);
  return muon::testing::two_steps(c, name, {24, 40});
}

void expect_refused(const client::ClientConfig& cfg) {
  try {
    client::Client c(cfg);
    FAIL() << "a TCP hello without the right token was accepted";
  } catch (const client::ServerError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code, ErrorCode::unauthorized) << what;
    EXPECT_NE(what.find("token"), std::string::npos) << what;
    EXPECT_NE(what.find(cfg.servers[0]), std::string::npos) << what;
  }
}

}  // namespace

TEST(Endpoint, ParsesTcpAndUnix) {
  auto e = transport::parse_endpoint("tcp://h:1");
  EXPECT_TRUE(e.is_tcp());
  EXPECT_EQ(e.host, "h");
  EXPECT_EQ(e.port, 1);
  EXPECT_EQ(e.text, "tcp://h:1");
  e = transport::parse_endpoint("tcp://[::1]:80");
  EXPECT_TRUE(e.is_tcp());
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, 80);
  e = transport::parse_endpoint("tcp://10.0.0.7:65535");
  EXPECT_EQ(e.port, 65535);
  e = transport::parse_endpoint("/tmp/x/muon.sock");
  EXPECT_FALSE(e.is_tcp());
  EXPECT_EQ(e.path, "/tmp/x/muon.sock");
  EXPECT_FALSE(transport::parse_endpoint(std::string(107, 'a')).is_tcp());  // the longest path
}

TEST(Endpoint, RefusesMalformed) {
  for (const char* bad : {"", "tcp://h:0", "tcp://h:65536", "tcp://h:", "tcp://h:8x", "tcp://h",
                          "tcp://:80", "tcp://[]:80", "tcp://h:-1", "tcp://h:99999999999"}) {
    EXPECT_THROW(transport::parse_endpoint(bad), InvalidArgument) << "'" << bad << "'";
  }
  EXPECT_THROW(transport::parse_endpoint(std::string(108, 'a')), InvalidArgument);
  try {
    transport::parse_endpoint("tcp://h:0");
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tcp://h:0"), std::string::npos) << e.what();
  }
}

TEST(Tcp, TwoStepsBitwiseAsOverTheUnixSocket) {
  TokenEnv env;
  const auto dir = temp_dir();
  TcpServer server(dir);
  const auto over_unix = two_steps(config_for(server.process.socket()), "w_unix");
  auto cfg = config_for(server.tcp());
  cfg.auth_token = kToken;
  const auto over_tcp = two_steps(cfg, "w_tcp");
  Reference ref(one_param("w_ref", {24, 40}));
  ASSERT_EQ(over_tcp.size(), 2u);
  for (int64_t step = 0; step < 2; ++step) {
    EXPECT_TRUE(same_bits(over_tcp[step], over_unix[step])) << "step " << step;
    EXPECT_TRUE(same_bits(over_tcp[step], ref.step(gradient(24 * 40, step)))) << "step " << step;
  }
}

TEST(Tcp, TokenFromTheEnvironment) {
  TokenEnv env;
  const auto dir = temp_dir();
  TcpServer server(dir);
  env.set(server.token_file);
  client::Client c(config_for(server.tcp()));
  EXPECT_TRUE(c.health().ready);
}

TEST(Tcp, WrongOrMissingTokenIsRefused) {
  TokenEnv env;
  const auto dir = temp_dir();
  TcpServer server(dir);
  auto cfg = config_for(server.tcp());
  cfg.auth_token = "not-the-token-0123456789abcdef";
  expect_refused(cfg);
  cfg.auth_token.clear();  // and no MUON_OFFLOAD_TOKEN_FILE
  expect_refused(cfg);
  // The refusals took nothing: the right token still gets rank 0.
  cfg.auth_token = kToken;
  client::Client c(cfg);
  EXPECT_TRUE(c.health().ready);
}

// remote_data_plane applies to tcp endpoints only: a Unix socket keeps data_plane (shm here),
// a tcp endpoint asks for nccl, which a CPU server refuses naming it.
TEST(Tcp, RemoteDataPlaneAppliesToTcpEndpointsOnly) {
  TokenEnv env;
  const auto dir = temp_dir();
  TcpServer server(dir);
  auto cfg = config_for(server.process.socket());
  cfg.remote_data_plane = transport::DataPlane::nccl;
  {
    client::Client c(cfg);  // shm over the Unix socket
    EXPECT_TRUE(c.health().ready);
  }
  cfg = config_for(server.tcp());
  cfg.auth_token = kToken;
  cfg.remote_data_plane = transport::DataPlane::nccl;
  try {
    client::Client c(cfg);
    FAIL() << "a CPU server accepted the nccl data plane";
  } catch (const client::ServerError& e) {
    EXPECT_EQ(e.code, ErrorCode::unsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("nccl"), std::string::npos) << e.what();
  } catch (const BackendUnavailable& e) {  // a client built without NCCL refuses first
    EXPECT_NE(std::string(e.what()).find("NCCL"), std::string::npos) << e.what();
  }
}

TEST(Tcp, UnreadableTokenFileIsNamed) {
  TokenEnv env;
  const auto dir = temp_dir();
  const auto file = write_token_file(dir, kToken);
  ::chmod(file.c_str(), 0644);
  env.set(file);
  try {
    client::auth_token_for("", {"tcp://127.0.0.1:9"});
    FAIL() << "a token file readable by others was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(client::kTokenFileEnv), std::string::npos) << e.what();
  }
  // Unix sockets only: the file is not read at all.
  EXPECT_EQ(client::auth_token_for("", {"/tmp/s.sock"}), "");
  EXPECT_EQ(client::auth_token_for("given", {"tcp://127.0.0.1:9"}), "given");
}

TEST(Tcp, HealthWorksStatusIsRefused) {
  TokenEnv env;
  const auto dir = temp_dir();
  TcpServer server(dir);
  const auto h = client::wait_healthy(server.tcp(), std::chrono::milliseconds(5000));
  EXPECT_TRUE(h.ready);
  try {
    client::fetch_status(server.tcp(), std::chrono::milliseconds(1000));
    FAIL() << "status over TCP did not say it is unavailable";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("TCP"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(client::fetch_status(server.process.socket(), std::chrono::milliseconds(5000))
                   .empty());  // the Unix socket still answers
}

TEST(Tcp, UnreachablePortIsConnectionLostNamingTheEndpoint) {
  TokenEnv env;
  auto cfg = config_for("tcp://127.0.0.1:" + std::to_string(free_tcp_port()));
  cfg.connect_timeout = std::chrono::milliseconds(200);
  cfg.auth_token = kToken;
  try {
    client::Client c(cfg);
    FAIL() << "connected to a closed port";
  } catch (const client::ConnectionLost& e) {
    EXPECT_NE(std::string(e.what()).find(cfg.servers[0]), std::string::npos) << e.what();
  }
}
