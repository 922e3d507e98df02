// The Prometheus endpoint of a real muon-offloadd, read over a real TCP socket while a real
// client pushes steps: exact counts of chunks, bytes, steps, reports and errors; clients
// connected going 1 then 0; numeric health against the orthogonality error computed here from
// the returned update; 404 for other paths. Health sampling must not change a bit of the
// updates.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "client/client.hpp"
#include "daemon/server_process.hpp"
#include "kernels/backend.hpp"
#include "observability.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

struct TestParam {
  std::string name;
  int64_t rows, cols;
  int64_t numel() const { return rows * cols; }
};

client::ParameterRegistration registration(const TestParam& p) {
  client::ParameterRegistration r;
  r.name = p.name;
  r.shape = {p.rows, p.cols};
  r.push = {{0, p.numel()}};
  r.want = {{0, p.numel()}};
  r.options.momentum.mu = 0.9f;
  return r;
}

int64_t chunks_of(int64_t elements, int64_t per_chunk) {
  return (elements + per_chunk - 1) / per_chunk;
}

}  // namespace

TEST(ServerMetrics, EndpointCountsChunksBytesStepsReportsErrorsAndNumericHealth) {
  const auto dir = temp_dir();
  const uint16_t port = free_tcp_port();
  ServerProcess server(dir, {"--metrics-port", std::to_string(port), "--health-sample-every", "1"});
  const int64_t per_chunk = 64 * 1024 / 4;  // ServerProcess runs with --slot-kib 64, fp32
  // A wide matrix cut into 2 chunks and a tall one (transposed inside Newton-Schulz, scaled by
  // sqrt(64/24)).
  const std::vector<TestParam> params = {{"w", 96, 256}, {"t", 64, 24}};
  constexpr int64_t kSteps = 3;

  auto m0 = parse_metrics(http_get(port, "/metrics").body);
  EXPECT_EQ(series(m0, "muon_offload_clients_connected"), 0.0);
  EXPECT_EQ(series(m0, "muon_offload_chunks_received_total{kind=\"gradient\"}"), 0.0);

  client::ClientConfig cfg;
  cfg.servers = {server.socket()};
  cfg.op_timeout = std::chrono::milliseconds(20000);
  int64_t chunks = 0, bytes = 0;
  std::map<std::string, std::vector<float>> last_update;
  {
    client::Client c(cfg);
    std::vector<client::ParameterRegistration> regs;
    for (const auto& p : params) regs.push_back(registration(p));
    c.register_parameters(regs);

    BackendConfig bc;
    bc.cpu_threads = kThreads;
    auto backend = make_backend("cpu", bc);
    std::map<std::string, std::vector<float>> momentum;
    for (const auto& p : params) momentum[p.name].assign(static_cast<size_t>(p.numel()), 0.0f);

    for (int64_t step = 0; step < kSteps; ++step) {
      int64_t step_bytes = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& p = params[i];
        const auto g = test_gradient(p.numel(), step, static_cast<int>(i));
        c.push(p.name, step, 0, g.data(), p.numel());
        c.commit(p.name, step);
        chunks += chunks_of(p.numel(), per_chunk);
        bytes += p.numel() * 4;
        step_bytes += p.numel() * 4;
      }
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& p = params[i];
        std::vector<float> u(static_cast<size_t>(p.numel()));
        ASSERT_TRUE(c.wait_update(p.name, step, u.data()));
        // Sampling reads the update after the fact: the bits stay the in-process kernels'.
        const auto g = test_gradient(p.numel(), step, static_cast<int>(i));
        std::vector<float> ref(u.size());
        backend->muon_update(p.name, {1, p.rows, p.cols}, g.data(), momentum[p.name].data(),
                             ref.data(), regs[i].options);
        ASSERT_EQ(std::memcmp(u.data(), ref.data(), u.size() * 4), 0) << p.name << " step " << step;
        last_update[p.name] = std::move(u);
      }
      const auto stats = c.report_step(step);
      EXPECT_EQ(stats.step, step);
      EXPECT_EQ(stats.bytes_pushed, step_bytes);
      EXPECT_EQ(stats.parameters, 2);
      EXPECT_TRUE(stats.slowest_parameter == "w" || stats.slowest_parameter == "t")
          << stats.slowest_parameter;
      EXPECT_GE(stats.exposed_wait_s, 0.0);
    }

    // Step reports travel on their own; wait until the last one is in.
    const auto m = scrape_until(port, [&](const auto& s) {
      return series(s, "muon_offload_client_step_reports_total") == kSteps;
    });
    EXPECT_EQ(series(m, "muon_offload_clients_connected"), 1.0);
    EXPECT_EQ(series(m, "muon_offload_parameters_registered"), 2.0);
    EXPECT_EQ(series(m, "muon_offload_chunks_received_total{kind=\"gradient\"}"), chunks);
    EXPECT_EQ(series(m, "muon_offload_received_bytes_total{kind=\"gradient\"}"), bytes);
    EXPECT_EQ(series(m, "muon_offload_chunks_received_total{kind=\"momentum\"}"), 0.0);
    // Every rank wants every element back: the same chunks return.
    EXPECT_EQ(series(m, "muon_offload_chunks_returned_total{kind=\"gradient\"}"), chunks);
    EXPECT_EQ(series(m, "muon_offload_returned_bytes_total{kind=\"gradient\"}"), bytes);
    // Step latency by shape, the exposed wait by rank (the last report's).
    EXPECT_EQ(series(m, "muon_offload_step_latency_seconds_count{shape=\"96x256\"}"), kSteps);
    EXPECT_EQ(series(m, "muon_offload_step_latency_seconds_count{shape=\"64x24\"}"), kSteps);
    EXPECT_GE(series(m, "muon_offload_client_last_exposed_wait_seconds{rank=\"0\"}"), 0.0);
    EXPECT_EQ(series(m, "muon_offload_parameter_steps_total{outcome=\"applied\"}"), 2 * kSteps);
    EXPECT_EQ(series(m, "muon_offload_newton_schulz_seconds_count{shape=\"96x256\"}"), kSteps);
    EXPECT_EQ(series(m, "muon_offload_newton_schulz_seconds_count{shape=\"64x24\"}"), kSteps);
    EXPECT_EQ(series(m, "muon_offload_client_exposed_wait_seconds_count"), kSteps);
    EXPECT_EQ(series(m, "muon_offload_client_reported_pushed_bytes_total"), bytes);
    EXPECT_EQ(series(m, "muon_offload_momentum_bytes"), (96 * 256 + 64 * 24) * 4);
    EXPECT_EQ(series(m, "muon_offload_scheduler_queued_jobs"), 0.0);
    EXPECT_EQ(series(m, "muon_offload_scheduler_in_flight_jobs"), 0.0);
    EXPECT_EQ(series(m, "muon_offload_errors_total{code=\"bad_request\"}"), 0.0);

    // Numeric health: every update sampled, none non-finite, and the error is the one computed
    // here from the update the client received (divided by the scale the server applied).
    EXPECT_EQ(series(m, "muon_offload_health_samples_total"), 2 * kSteps);
    EXPECT_EQ(series(m, "muon_offload_nonfinite_update_values_total"), 0.0);
    EXPECT_EQ(series(m, "muon_offload_orthogonality_error_sampled_count"), 2 * kSteps);
    for (const auto& p : params) {
      const double factor = scale_factor(ScaleRule::keller, p.rows, p.cols);
      const double expected = orthogonality_error(last_update[p.name], p.rows, p.cols, factor);
      const double got =
          series(m, "muon_offload_orthogonality_error{parameter=\"" + p.name + "\"}");
      EXPECT_NEAR(got, expected, 1e-4) << p.name;
      // Its threshold: what the schedule gives this full-rank input, plus the fp32 allowance.
      const double limit =
          series(m, "muon_offload_orthogonality_error_threshold{parameter=\"" + p.name + "\"}");
      EXPECT_GT(limit, got) << p.name;
      EXPECT_LT(limit, got + 0.03) << p.name;
      // Keller's quintic leaves singular values in about [0.68, 1.13], not at 1.
      EXPECT_GT(expected, 1e-3) << p.name;
      EXPECT_LT(expected, 0.6) << p.name;
    }

    // A provoked bad request (a commit of a step that has no data) is counted by its code.
    c.commit("w", kSteps + 5);
    const auto m2 = scrape_until(port, [](const auto& s) {
      return series(s, "muon_offload_errors_total{code=\"bad_request\"}") >= 1.0;
    });
    EXPECT_EQ(series(m2, "muon_offload_errors_total{code=\"bad_request\"}"), 1.0);
    EXPECT_EQ(series(m2, "muon_offload_errors_total{code=\"timeout\"}"), 0.0);
  }  // goodbye

  const auto m3 = scrape_until(
      port, [](const auto& s) { return series(s, "muon_offload_clients_connected") == 0; });
  EXPECT_EQ(series(m3, "muon_offload_clients_connected"), 0.0);
  // Counters keep their totals after the client left.
  EXPECT_EQ(series(m3, "muon_offload_chunks_received_total{kind=\"gradient\"}"), chunks);

  const auto ok = http_get(port, "/metrics");
  EXPECT_EQ(ok.status, 200);
  EXPECT_NE(ok.content_type.find("text/plain"), std::string::npos);
  EXPECT_NE(ok.body.find("# TYPE muon_offload_step_latency_seconds histogram"), std::string::npos);
  EXPECT_EQ(http_get(port, "/other").status, 404);
  EXPECT_EQ(http_get(port, "/").status, 404);
  std::filesystem::remove_all(dir);
}

TEST(ServerMetrics, NoEndpointUnlessAPortIsGiven) {
  const auto dir = temp_dir();
  const uint16_t port = free_tcp_port();
  ServerProcess server(dir);  // no --metrics-port
  EXPECT_THROW(http_get(port, "/metrics"), boost::system::system_error);
  std::filesystem::remove_all(dir);
}

TEST(ServerMetrics, AServerOfAPlanLabelsEverySeriesWithItsId) {
  const auto dir = temp_dir();
  const uint16_t port = free_tcp_port();
  const auto plan = dir / "plan.json";
  std::ofstream(plan) << R"({"schema": "muon-offload-plan/1",
    "servers": [{"id": 0}, {"id": 1}],
    "domains": [{"id": 0, "servers": [0, 1], "compute_ranks": [0]}],
    "ranks": [{"rank": 0, "domain": 0}],
    "parameters": [{"name": "w", "owner": 1, "relays": [1]}]})";
  ServerProcess server(
      dir, {"--plan", plan.string(), "--server-id", "1", "--metrics-port", std::to_string(port)});
  const auto body = http_get(port, "/metrics").body;
  const auto m = parse_metrics(body);
  EXPECT_EQ(series(m, "muon_offload_clients_connected{server=\"1\"}"), 0.0) << body;
  EXPECT_EQ(series(m, "muon_offload_chunks_received_total{server=\"1\",kind=\"gradient\"}"), 0.0)
      << body;
  // Every series, none without it.
  for (const auto& [name, value] : m) {
    EXPECT_NE(name.find("server=\"1\""), std::string::npos) << name;
  }
  std::filesystem::remove_all(dir);
}
