// `muon-offload status` run as a process against a real muon-offloadd with a connected client:
// the readable table names the parameter, its shape, its last step and its role; --json carries
// the same; without a server the command exits 2 and says so; a process that holds the socket
// but does not answer is called hung (exit 3), never a missing server; `status --job` and
// `health --job` show every server of a launcher's job manifest at once.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

client::ClientConfig client_of(const std::string& socket, const std::string& name) {
  client::ClientConfig cfg;
  cfg.servers = {socket};
  cfg.name = name;
  return cfg;
}

// Registers a rows x cols parameter (every element pushed and wanted), runs steps 0 and 1 of it
// and sends the step report of step 1.
client::ParameterRegistration two_steps(client::Client& c, const std::string& name, int64_t rows,
                                        int64_t cols, int salt) {
  client::ParameterRegistration r;
  r.name = name;
  r.shape = {rows, cols};
  r.push = {{0, rows * cols}};
  r.want = {{0, rows * cols}};
  c.register_parameters({r});
  std::vector<float> u(static_cast<size_t>(rows * cols));
  for (int64_t step = 0; step < 2; ++step) {
    const auto g = test_gradient(rows * cols, step, salt);
    c.push(r.name, step, 0, g.data(), rows * cols);
    c.commit(r.name, step);
    c.wait_update(r.name, step, u.data());
  }
  c.report_step(1);
  return r;
}

// A Unix socket that listens and never accepts: what a wedged server looks like from outside.
class SilentListener {
 public:
  explicit SilentListener(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 8) != 0) {
      throw std::runtime_error("cannot listen on " + path);
    }
  }
  ~SilentListener() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  // Stops listening but leaves the socket file: a server that died without cleaning up.
  void die() {
    ::close(fd_);
    fd_ = -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

TEST(ServerStatus, StatusCommandPrintsTheParameterTable) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  client::Client c(client_of(server.socket(), "status-test"));
  const auto r = two_steps(c, "blocks.0.mlp.w1", 16, 40, 0);

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
  ASSERT_GE(row.size(), 7u) << run.out;
  EXPECT_EQ(row[1] + " " + row[2], "[16, 40]") << run.out;
  EXPECT_EQ(row[3], "1") << run.out;
  EXPECT_EQ(row[4], "1") << run.out;
  EXPECT_EQ(row[5], "idle") << run.out;
  EXPECT_EQ(row.back(), "owner") << run.out;  // no plan: this server owns what it has
  // The client row names the rank and its client name.
  EXPECT_NE(run.out.find("status-test"), std::string::npos) << run.out;
  // What auto chose for the parameter's block and why: algorithm, batching, the times.
  const std::string key = "fp32 16x40 steps=5 restart=2";
  std::vector<std::string> choice;
  std::istringstream again(run.out);
  for (std::string line; std::getline(again, line);) {
    if (line.find(key) != std::string::npos) choice = words(line);
  }
  ASSERT_GE(choice.size(), 8u) << run.out;
  EXPECT_TRUE(choice[4] == "plain" || choice[4] == "syrk" || choice[4] == "gram") << run.out;
  EXPECT_NE(run.out.find("fastest within 3 %"), std::string::npos) << run.out;

  const auto js = run_cli("status --json --socket " + server.socket());
  ASSERT_EQ(js.exit_code, 0) << js.out;
  const auto st = nlohmann::json::parse(js.out);
  ASSERT_EQ(st["parameters"].size(), 1u);
  EXPECT_EQ(st["parameters"][0]["name"], r.name);
  EXPECT_EQ(st["parameters"][0]["last_step"], 1);
  EXPECT_EQ(st["world_size"], 1);
  bool listed = false;
  for (const auto& c : st["ns_choices"]) {
    if (c["key"] != key) continue;
    listed = true;
    EXPECT_EQ(c["algorithm"], choice[4]);
    EXPECT_TRUE(c["side_by_side"].is_boolean());
    EXPECT_FALSE(c["reason"].get<std::string>().empty());
  }
  EXPECT_TRUE(listed) << js.out;
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

TEST(ServerStatus, AHungServerIsCalledHungAndNoSecondServerIsSuggested) {
  const auto dir = temp_dir();
  const std::string socket = (dir / "wedged.sock").string();
  SilentListener wedged(socket);
  const auto run = run_cli("status --timeout-ms 300 --socket " + socket);
  EXPECT_EQ(run.exit_code, 3) << run.out;
  EXPECT_NE(run.out.find("is hung: a process (pid " + std::to_string(::getpid()) + ") listens"),
            std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("Do not start another server on this socket"), std::string::npos)
      << run.out;
  EXPECT_EQ(run.out.find("start one with"), std::string::npos) << run.out;
  // Once nobody listens (the socket file left behind), starting one is the advice.
  wedged.die();
  const auto gone = run_cli("status --timeout-ms 300 --socket " + socket);
  EXPECT_EQ(gone.exit_code, 2) << gone.out;
  EXPECT_NE(gone.out.find("start one with `muon-offloadd --socket " + socket), std::string::npos)
      << gone.out;
  std::filesystem::remove_all(dir);
}

TEST(ServerStatus, JobViewShowsEveryServerOfTheJob) {
  const auto dir = temp_dir();
  // The jobs directory the launcher and the CLI agree on, under a private XDG_RUNTIME_DIR.
  const auto xdg = dir / "xdg";
  std::filesystem::create_directories(xdg / "muon-offload" / "jobs");
  ::setenv("XDG_RUNTIME_DIR", xdg.c_str(), 1);
  ServerProcess a(dir, {}, "a");
  ServerProcess b(dir, {}, "b");
  const std::string wedged_socket = (dir / "c.sock").string();
  SilentListener wedged(wedged_socket);
  // Two steps of one parameter on server a, and their step report.
  client::Client c(client_of(a.socket(), "job-rank"));
  two_steps(c, "blocks.0.attn.wq", 8, 24, 1);

  nlohmann::json manifest = {{"schema", "muon-offload-job/1"},
                             {"job", "j42"},
                             {"node_rank", 0},
                             {"host", "here"},
                             {"launcher_pid", ::getpid()},
                             {"started_unix", 1.0 * ::time(nullptr)},
                             {"run_dir", dir.string()},
                             {"plan", nullptr},
                             {"backend", "cpu"},
                             {"trainer", {"python3", "train.py"}},
                             {"servers", nlohmann::json::array()}};
  int i = 0;
  for (const std::string& sock : {a.socket(), b.socket(), wedged_socket}) {
    manifest["servers"].push_back(
        {{"index", i},
         {"plan_id", nullptr},
         {"socket", sock},
         {"pid", i == 2 ? ::getpid() : (i == 0 ? a.pid() : b.pid())},
         {"log", (dir / ("server" + std::to_string(i) + ".log")).string()},
         {"metrics_url", nullptr},
         {"gpu", nullptr}});
    ++i;
  }
  std::ofstream(xdg / "muon-offload" / "jobs" / "j42.node0.1.json") << manifest.dump();

  const auto run = run_cli("status --job j42 --timeout-ms 500 --rate-window-ms 200");
  EXPECT_EQ(run.exit_code, 1) << run.out;  // one server does not answer
  EXPECT_NE(run.out.find("job j42, node 0 on here"), std::string::npos) << run.out;
  std::map<std::string, std::vector<std::string>> rows;
  std::istringstream lines(run.out);
  for (std::string line; std::getline(lines, line);) {
    const auto w = words(line);
    if (w.size() >= 4 && (w[0] == "0" || w[0] == "1" || w[0] == "2")) rows[w[0]] = w;
  }
  ASSERT_EQ(rows.size(), 3u) << run.out;
  EXPECT_EQ(rows["0"][3], "up") << run.out;
  EXPECT_EQ(rows["1"][3], "up") << run.out;
  EXPECT_EQ(rows["2"][3], "HUNG") << run.out;
  // Server a: 1 rank, 1 owned parameter, last step 1, the rank's report.
  const std::string row0 = [&] {
    std::string l;
    for (const auto& w : rows["0"]) l += w + " ";
    return l;
  }();
  EXPECT_NE(row0.find(" 1 1 0 1 "), std::string::npos) << run.out;  // RANKS OWNS RELAYS LAST STEP
  EXPECT_NE(run.out.find("slowest rank of the job: rank 0 (server 0)"), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("server 2: hung: a process (pid " + std::to_string(::getpid()) + ")"),
            std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("do not start another server on that socket"), std::string::npos)
      << run.out;

  // health --job: the two that answer are ready, the hung one is named.
  const auto health = run_cli("health --job j42 --timeout-ms 300");
  EXPECT_EQ(health.exit_code, 1) << health.out;
  EXPECT_NE(health.out.find("ready: node 0 server 0 " + a.socket()), std::string::npos)
      << health.out;
  EXPECT_NE(health.out.find("node 0 server 2: hung"), std::string::npos) << health.out;
  // An unknown job is a clear error naming the jobs there.
  const auto none = run_cli("status --job nope");
  EXPECT_EQ(none.exit_code, 2) << none.out;
  EXPECT_NE(none.out.find("no job 'nope'"), std::string::npos) << none.out;
  EXPECT_NE(none.out.find("jobs there: j42"), std::string::npos) << none.out;
  ::unsetenv("XDG_RUNTIME_DIR");
  std::filesystem::remove_all(dir);
}
