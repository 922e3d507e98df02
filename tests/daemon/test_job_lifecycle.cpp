// Jobs coming and going on one real muon-offloadd process (issue 13, "friction a new user hit"):
// a registration that waits for ranks names them, a rank that pushes nothing may commit.
#include <gtest/gtest.h>

#include <thread>

#include "client/client.hpp"
#include "client_fixtures.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

std::vector<float> run_step(client::Client& c, const std::string& name, int64_t step,
                            const std::vector<float>& g) {
  c.push(name, step, 0, g.data(), static_cast<int64_t>(g.size()));
  c.commit(name, step);
  std::vector<float> u(g.size());
  c.wait_update(name, step, u.data());
  return u;
}

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

// Registers `regs[r]` from `clients[r]` at once (a registration waits for every rank).
void register_all(std::vector<client::Client*> clients,
                  std::vector<client::ParameterRegistration> regs) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(clients.size());
  for (size_t r = 0; r < clients.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        clients[r]->register_parameters({regs[r]});
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t r = 0; r < errors.size(); ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
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

TEST(JobLifecycle, ARankThatPushesNothingMayCommitBeforeOrAfterTheOthers) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  client::Client c0(job_config(server.socket(), 0, 2)), c1(job_config(server.socket(), 1, 2));
  auto reg0 = one_param("w", {4, 6});
  auto reg1 = reg0;
  reg1.push.clear();  // an empty shard: rank 1 only receives
  register_all({&c0, &c1}, {reg0, reg1});
  Reference ref(reg0);
  std::vector<float> u(24);
  for (int64_t step = 0; step < 3; ++step) {
    const auto g = gradient(24, step);
    c1.commit("w", step);  // before rank 0 pushed anything: nothing to commit, harmless
    const auto expected = ref.step(g);
    EXPECT_TRUE(same_bits(run_step(c0, "w", step, g), expected)) << "step " << step;
    c1.commit("w", step);  // and after the step ran
    ASSERT_TRUE(c1.wait_update("w", step, u.data())) << "step " << step;
    EXPECT_TRUE(same_bits(u, expected)) << "step " << step;
  }
  fs::remove_all(dir);
}
