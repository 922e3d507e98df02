// Jobs coming and going on one real muon-offloadd process (issue 13, "friction a new user hit"):
// a registration that waits for ranks names them, a rank that pushes nothing may commit, a job
// of another world size is taken once the last one left, and a new job identity starts fresh
// under the same names while resume adopts the state the last job left.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "client/client.hpp"
#include "client/health_probe.hpp"
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

client::ClientConfig job_config(const std::string& socket, int rank, int world_size,
                                std::string job = "", bool resume = false) {
  auto cfg = config_for(socket, transport::DataPlane::shm, rank, world_size);
  cfg.job = std::move(job);
  cfg.resume = resume;
  return cfg;
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

// Waits until the server's status shows `name` registering without `rank` missing.
void wait_registered_by(const std::string& socket, const std::string& name, int rank) {
  for (int i = 0; i < 1000; ++i) {
    const auto st = nlohmann::json::parse(client::fetch_status(socket, std::chrono::seconds(5)));
    for (const auto& p : st.at("parameters")) {
      if (p.at("name") != name || !p.contains("missing_ranks")) continue;
      const auto& missing = p.at("missing_ranks");
      if (std::find(missing.begin(), missing.end(), rank) == missing.end()) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL() << "'" << name << "' never showed rank " << rank << "'s registration";
}

// A client's goodbye does not wait for the server: the server may take the next job's hello
// or registration before it has seen the last job's sessions close. Retries f (a connect or a
// registration) while it is refused for `reason` only, for up to 5 s.
template <class F>
auto once_the_last_job_left(const std::string& reason, F&& f) {
  for (int i = 0;; ++i) {
    try {
      return f();
    } catch (const client::ServerError& e) {
      if (i == 500 || !contains(e.what(), reason)) throw;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<float> sum(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> s(a.size());
  for (size_t i = 0; i < a.size(); ++i) s[i] = a[i] + b[i];
  return s;
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

TEST(JobLifecycle, AJobOfAnotherSizeIsTakenOnceTheLastOneLeftKeepingTheState) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  const auto reg = one_param("w", {4, 6});
  Reference ref(reg);
  {
    client::Client c0(job_config(server.socket(), 0, 2)), c1(job_config(server.socket(), 1, 2));
    register_all({&c0, &c1}, {reg, reg});
    const auto g0 = gradient(24, 0, 0), g1 = gradient(24, 0, 1);
    const auto expected = ref.step(sum(g0, g1));
    c1.push("w", 0, 0, g1.data(), 24);
    c1.commit("w", 0);
    EXPECT_TRUE(same_bits(run_step(c0, "w", 0, g0), expected));
    // While the job is connected, a job of another size is refused, saying when it is taken.
    const auto msg = error_text([&] { client::Client one(job_config(server.socket(), 0, 1)); });
    EXPECT_TRUE(contains(msg, "world size mismatch")) << msg;
    EXPECT_TRUE(contains(msg, "once every rank of this one has left")) << msg;
  }
  // Both left: a job of one rank connects and takes 'w' over with its momentum and step (the
  // same job identity, here none, restarted at another size).
  auto one = once_the_last_job_left("world size mismatch", [&] {
    return std::make_unique<client::Client>(job_config(server.socket(), 0, 1));
  });
  one->register_parameters({reg});
  int64_t last = -2;
  const auto momentum = one->fetch_momentum("w", &last);
  EXPECT_EQ(last, 0);
  EXPECT_TRUE(same_bits(momentum, ref.momentum));
  const auto g = gradient(24, 1);
  EXPECT_TRUE(same_bits(run_step(*one, "w", 1, g), ref.step(g)));
  fs::remove_all(dir);
}

TEST(JobLifecycle, ANewJobStartsFreshUnderTheSameNamesAndResumeAdoptsTheState) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  const auto reg = one_param("w", {4, 6});
  {
    // Job A: two steps, then its rank 1 leaves while rank 0 stays.
    client::Client a0(job_config(server.socket(), 0, 2, "job A"));
    {
      client::Client a1(job_config(server.socket(), 1, 2, "job A"));
      register_all({&a0, &a1}, {reg, reg});
      for (int64_t step = 0; step < 2; ++step) {
        const auto g = gradient(24, step, 1);
        a1.push("w", step, 0, g.data(), 24);
        a1.commit("w", step);
        run_step(a0, "w", step, gradient(24, step, 0));
      }
    }
    // A rank of job B meanwhile: refused at once, naming job A's rank still connected.
    auto b1 = once_the_last_job_left("is already connected", [&] {
      return std::make_unique<client::Client>(job_config(server.socket(), 1, 2, "job B"));
    });
    const auto msg = error_text([&] { b1->register_parameters({reg}); });
    EXPECT_TRUE(contains(msg, "belongs to job 'job A', whose rank 0")) << msg;
    EXPECT_TRUE(contains(msg, "is still connected")) << msg;
  }
  // Job A gone: job B registers 'w' fresh, no renaming, and its steps are a fresh run's.
  Reference fresh(reg);
  {
    auto b = once_the_last_job_left("is already connected", [&] {
      return std::make_unique<client::Client>(job_config(server.socket(), 0, 1, "job B"));
    });
    client::Client& b0 = *b;
    once_the_last_job_left("is still connected", [&] { b0.register_parameters({reg}); });
    int64_t last = -2;
    b0.fetch_momentum("w", &last);
    EXPECT_EQ(last, -1);
    for (int64_t step = 0; step < 2; ++step) {
      const auto g = gradient(24, step);
      EXPECT_TRUE(same_bits(run_step(b0, "w", step, g), fresh.step(g))) << "step " << step;
    }
  }
  // Job C resumes: it adopts job B's momentum and step and goes on at step 2.
  auto c = once_the_last_job_left("is already connected", [&] {
    return std::make_unique<client::Client>(
        job_config(server.socket(), 0, 1, "job C", /*resume=*/true));
  });
  client::Client& c0 = *c;
  once_the_last_job_left("is still connected", [&] { c0.register_parameters({reg}); });
  int64_t last = -2;
  EXPECT_TRUE(same_bits(c0.fetch_momentum("w", &last), fresh.momentum));
  EXPECT_EQ(last, 1);
  const auto g = gradient(24, 2);
  EXPECT_TRUE(same_bits(run_step(c0, "w", 2, g), fresh.step(g)));
  fs::remove_all(dir);
}

// The parameters `socket`'s status lists, registered or registering.
std::vector<std::string> status_names(const std::string& socket) {
  std::vector<std::string> names;
  const auto st = nlohmann::json::parse(client::fetch_status(socket, std::chrono::seconds(5)));
  for (const auto& p : st.at("parameters")) names.push_back(p.at("name"));
  return names;
}

// Polls `socket`'s status every 20 ms, handing each listed parameter to `look`, until it lists
// none (true) or `limit` has passed (false: never forgotten).
template <class F>
bool wait_forgotten(const std::string& socket, std::chrono::steady_clock::duration limit,
                    F&& look) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto st = nlohmann::json::parse(client::fetch_status(socket, std::chrono::seconds(5)));
    if (st.at("parameters").empty()) return true;
    for (const auto& p : st.at("parameters")) look(p);
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TEST(JobLifecycle, AFinishedJobIsForgottenAfterTheDelayNotWhileARankOfItIsConnected) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--forget-finished-jobs-after", "0.3"});
  const auto reg = one_param("w", {4, 6});
  Reference ref(reg);
  {
    // Job A's rank stays connected for 5 delays (20 sweeps): nothing of it is forgotten.
    client::Client a(job_config(server.socket(), 0, 1, "job A"));
    a.register_parameters({reg});
    for (int64_t step = 0; step < 2; ++step) {
      const auto g = gradient(24, step);
      EXPECT_TRUE(same_bits(run_step(a, "w", step, g), ref.step(g)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    EXPECT_EQ(status_names(server.socket()), std::vector<std::string>{"w"});
    int64_t last = -2;
    EXPECT_TRUE(same_bits(a.fetch_momentum("w", &last), ref.momentum));
    EXPECT_EQ(last, 1);
  }
  // Gone: its 'w' is forgotten within the delay and a sweep (a quarter of it), not at once.
  EXPECT_EQ(status_names(server.socket()), std::vector<std::string>{"w"});
  const auto gone = std::chrono::steady_clock::now();
  bool counted_down = false;  // the status said whose it is and when it goes
  ASSERT_TRUE(wait_forgotten(server.socket(), std::chrono::seconds(10), [&](const auto& w) {
    EXPECT_EQ(w.at("job"), "job A");
    if (w.contains("forgotten_in_s")) {
      counted_down = true;
      EXPECT_LE(w.at("forgotten_in_s").template get<double>(), 0.3);
    }
  })) << "never forgot";
  EXPECT_TRUE(counted_down);
  EXPECT_GE(std::chrono::steady_clock::now() - gone, std::chrono::milliseconds(250));
  // The same job resuming after that finds nothing: a fresh start.
  auto again = once_the_last_job_left("is already connected", [&] {
    return std::make_unique<client::Client>(
        job_config(server.socket(), 0, 1, "job A", /*resume=*/true));
  });
  again->register_parameters({reg});
  int64_t last = -2;
  again->fetch_momentum("w", &last);
  EXPECT_EQ(last, -1);
  Reference fresh(reg);
  const auto g = gradient(24, 0);
  EXPECT_TRUE(same_bits(run_step(*again, "w", 0, g), fresh.step(g)));
  fs::remove_all(dir);
}

TEST(JobLifecycle, AShortReturnOfTheJobStartsItsForgetDelayAgain) {
  // The delay counts from the last leave, however short the stay before it (shorter than a
  // sweep, here half a second against sweeps every 0.5 s).
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--forget-finished-jobs-after", "2"});
  const auto reg = one_param("w", {4, 6});
  Reference ref(reg);
  {
    client::Client a(job_config(server.socket(), 0, 1, "job A"));
    a.register_parameters({reg});
    const auto g = gradient(24, 0);
    run_step(a, "w", 0, g);
    ref.step(g);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::chrono::steady_clock::time_point left;
  {
    auto back = once_the_last_job_left("is already connected", [&] {
      return std::make_unique<client::Client>(
          job_config(server.socket(), 0, 1, "job A", /*resume=*/true));
    });
    back->register_parameters({reg});
    int64_t last = -2;
    EXPECT_TRUE(same_bits(back->fetch_momentum("w", &last), ref.momentum));
    EXPECT_EQ(last, 0);
    left = std::chrono::steady_clock::now();
  }
  // 1.2 s after the second leave (2.7 s after the first): still there.
  std::this_thread::sleep_until(left + std::chrono::milliseconds(1200));
  EXPECT_EQ(status_names(server.socket()), std::vector<std::string>{"w"});
  ASSERT_TRUE(wait_forgotten(server.socket(),
                             left + std::chrono::seconds(15) - std::chrono::steady_clock::now(),
                             [](const auto&) {}))
      << "never forgot";
  fs::remove_all(dir);
}

TEST(JobLifecycle, RanksOfOneRegistrationMustNameTheSameJob) {
  const auto dir = temp_dir();
  ServerProcess server(dir);
  auto cfg0 = job_config(server.socket(), 0, 2, "job A");
  cfg0.op_timeout = std::chrono::milliseconds(4000);
  client::Client c0(cfg0);
  client::Client c1(job_config(server.socket(), 1, 2, "job B"));
  const auto reg = one_param("w", {4, 6});
  std::string first;
  std::thread t([&] { first = error_text([&] { c0.register_parameters({reg}); }); });
  wait_registered_by(server.socket(), "w", 0);  // rank 0's goes first
  const auto msg = error_text([&] { c1.register_parameters({reg}); });
  EXPECT_TRUE(contains(msg, "rank 1 registers it for job 'job B', the ranks before it for job "
                            "'job A'"))
      << msg;
  t.join();  // rank 0 waits for rank 1 in vain
  EXPECT_TRUE(contains(first, "ranks 1 of the job's 2 have not registered it")) << first;
  fs::remove_all(dir);
}
