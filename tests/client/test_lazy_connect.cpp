// Connections opened on first use (ClientConfig::connect_on_first_use, on by default in global
// scope): a rank connects only to the servers its parameters use. Here the second configured
// server does not exist: a lazy client is built and trains on the first one (bitwise the eager
// single-server run), registering a parameter on the second fails with ConnectionLost naming its
// endpoint and leaves the first usable; an eager client fails at construction, naming it;
// MUON_OFFLOAD_SERVERS_SCOPE=global turns lazy connection on when the config leaves it unset.
#include <gtest/gtest.h>

#include <cstdlib>

#include "client_fixtures.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

// Sets MUON_OFFLOAD_SERVERS_SCOPE for a test and restores it after.
class ScopeEnv {
 public:
  explicit ScopeEnv(const char* value) {
    if (const char* v = std::getenv(kName)) saved_ = v;
    if (value) {
      ::setenv(kName, value, 1);
    } else {
      ::unsetenv(kName);
    }
  }
  ~ScopeEnv() {
    if (saved_) {
      ::setenv(kName, saved_->c_str(), 1);
    } else {
      ::unsetenv(kName);
    }
  }

 private:
  static constexpr const char* kName = "MUON_OFFLOAD_SERVERS_SCOPE";
  std::optional<std::string> saved_;
};

}  // namespace

TEST(LazyConnect, OnlyTheServersAParameterUses) {
  ScopeEnv scope(nullptr);
  const auto dir = temp_dir();
  ServerProcess server(dir);
  const std::string missing = (dir / "absent.sock").string();

  std::vector<std::vector<float>> expected;
  {
    client::Client eager(config_for(server.socket()));  // rank 0 leaves before the lazy one
    expected = two_steps(eager, "eager.w", {16, 24});
  }

  auto cfg = config_for(server.socket());
  cfg.servers.push_back(missing);
  cfg.connect_timeout = std::chrono::milliseconds(300);
  cfg.connect_on_first_use = true;
  {
    client::Client lazy(cfg);  // the absent server is not contacted
    const auto got = two_steps(lazy, "lazy.w", {16, 24});
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], expected[i])) << i;

    auto on_missing = one_param("elsewhere.w", {8, 8});
    on_missing.server = 1;
    try {
      lazy.register_parameters({on_missing});
      FAIL() << "registered on a server that does not exist";
    } catch (const client::ConnectionLost& e) {
      EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    }
    // The first server's session is untouched: a third step goes through.
    const auto g = gradient(16 * 24, 2);
    lazy.push("lazy.w", 2, 0, g.data(), 16 * 24);
    lazy.commit("lazy.w", 2);
    std::vector<float> u(16 * 24);
    EXPECT_TRUE(lazy.wait_update("lazy.w", 2, u.data()));
    lazy.report_step(2);  // reports go to the open connections only
  }

  cfg.connect_on_first_use = false;
  try {
    client::Client c(cfg);
    FAIL() << "an eager client connected to a server that does not exist";
  } catch (const client::ConnectionLost& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}

TEST(LazyConnect, GlobalScopeConnectsOnFirstUse) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  auto cfg = config_for(server.socket());
  cfg.servers.push_back((dir / "absent.sock").string());
  cfg.connect_timeout = std::chrono::milliseconds(300);
  {
    ScopeEnv scope("global");
    client::Client c(cfg);
    EXPECT_EQ(two_steps(c, "global.w", {16, 24}).size(), 2u);
    c.reconnect();  // reconnects what its parameters use, not the absent server
    const auto g = gradient(16 * 24, 2);
    c.push("global.w", 2, 0, g.data(), 16 * 24);
    c.commit("global.w", 2);
    std::vector<float> u(16 * 24);
    EXPECT_TRUE(c.wait_update("global.w", 2, u.data()));
  }
  ScopeEnv scope("node");
  EXPECT_THROW(client::Client c(cfg), client::ConnectionLost);
}
