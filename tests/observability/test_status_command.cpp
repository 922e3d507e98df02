// `muon-offload status` run as a process against a real muon-offloadd with a connected client:
// the readable table names the parameter, its shape and its last step; --json carries the same;
// without a server the command exits 2 and says so.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "client/client.hpp"
#include "daemon/server_process.hpp"
#include "observability.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

}  // namespace

TEST(ServerStatus, StatusCommandPrintsTheParameterTable) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  client::ClientConfig cfg;
  cfg.servers = {server.socket()};
  cfg.name = "status-test";
  client::Client c(cfg);
  client::ParameterRegistration r;
  r.name = "blocks.0.mlp.w1";
  r.shape = {16, 40};
  r.push = {{0, 640}};
  r.want = {{0, 640}};
  c.register_parameters({r});
  std::vector<float> u(640);
  for (int64_t step = 0; step < 2; ++step) {
    const auto g = test_gradient(640, step, 0);
    c.push(r.name, step, 0, g.data(), 640);
    c.commit(r.name, step);
    c.wait_update(r.name, step, u.data());
  }
  c.report_step(1);

  const auto run = run_cli("status --socket " + server.socket());
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_NE(run.out.find("muon-offloadd "), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("world size 1"), std::string::npos) << run.out;
  // The parameter row: name, shape, last step 1, 1 contributor, idle.
  std::vector<std::string> row;
  std::istringstream lines(run.out);
  for (std::string line; std::getline(lines, line);) {
    const auto w = words(line);
    if (!w.empty() && w[0] == r.name) row = w;
  }
  ASSERT_GE(row.size(), 6u) << run.out;
  EXPECT_EQ(row[1] + " " + row[2], "[16, 40]") << run.out;
  EXPECT_EQ(row[3], "1") << run.out;
  EXPECT_EQ(row[4], "1") << run.out;
  EXPECT_EQ(row[5], "idle") << run.out;
  // The client row names the rank and its client name.
  EXPECT_NE(run.out.find("status-test"), std::string::npos) << run.out;

  const auto js = run_cli("status --json --socket " + server.socket());
  ASSERT_EQ(js.exit_code, 0) << js.out;
  const auto st = nlohmann::json::parse(js.out);
  ASSERT_EQ(st["parameters"].size(), 1u);
  EXPECT_EQ(st["parameters"][0]["name"], r.name);
  EXPECT_EQ(st["parameters"][0]["last_step"], 1);
  EXPECT_EQ(st["world_size"], 1);
  std::filesystem::remove_all(dir);
}

TEST(ServerStatus, StatusWithoutAServerExits2WithAClearMessage) {
  const auto dir = temp_dir();
  const std::string socket = (dir / "nobody.sock").string();
  const auto run = run_cli("status --timeout-ms 200 --socket " + socket);
  EXPECT_EQ(run.exit_code, 2) << run.out;
  EXPECT_NE(run.out.find("no muon-offloadd answers on '" + socket + "'"), std::string::npos)
      << run.out;
  std::filesystem::remove_all(dir);
}
