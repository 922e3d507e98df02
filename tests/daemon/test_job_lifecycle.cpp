// Jobs coming and going on one real muon-offloadd process (issue 13, "friction a new user hit"):
// a registration that waits for ranks names them.
#include <gtest/gtest.h>

#include "client/client.hpp"
#include "client_fixtures.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

template <class F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

client::ClientConfig job_config(const std::string& socket, int rank, int world_size) {
  return config_for(socket, transport::DataPlane::shm, rank, world_size);
}

}  // namespace

TEST(JobLifecycle, ALoneRankHearsWhichRanksItsRegistrationWaitsFor) {
  const auto dir = temp_dir();
  ServerProcess server(dir);  // its own registration timeout (30 s) is far off
  auto cfg = job_config(server.socket(), 0, 3);
  cfg.op_timeout = std::chrono::milliseconds(1500);
  client::Client c0(cfg);
  const auto msg = error_text([&] { c0.register_parameters({one_param("alone", {4, 6})}); });
  EXPECT_TRUE(contains(msg, "within 1500 ms")) << msg;
  EXPECT_TRUE(contains(msg, "ranks 1, 2 of the job's 3 have not registered it")) << msg;
  fs::remove_all(dir);
}
