// muon-offloadd: the persistent Muon server. See README.md and daemon/server.hpp.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <malloc.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "cli/number_checks.hpp"
#include "core/error.hpp"
#include "daemon/server.hpp"

int main(int argc, char** argv) {
  using namespace muon;
  daemon::ServerConfig config;
  std::string log_level = "info";
  int64_t step_timeout_ms = config.step_timeout.count();
  uint64_t slot_kib = config.layout.slot_bytes / 1024;
  std::string health_threshold = "auto";

  CLI::App app{
      "muon-offloadd: a persistent Muon optimizer server (momentum + Newton-Schulz) "
      "fed by compute ranks over shared memory or, on the CUDA backend, CUDA IPC"};
  app.set_version_flag("--version", "muon-offloadd " MUON_OFFLOAD_VERSION);
  app.add_option("--socket", config.socket_path,
                 "Unix socket path (default: $MUON_OFFLOAD_SOCKET, else "
                 "$XDG_RUNTIME_DIR/muon-offload/muon-offloadd.sock, else "
                 "/tmp/muon-offload-<uid>/muon-offloadd.sock)");
  app.add_option("--backend", config.backend, "cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app.add_option("--cuda-device", config.cuda_device,
                 "CUDA device ordinal of the CUDA backend (after CUDA_VISIBLE_DEVICES)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_flag("--host-staging", config.host_staging,
               "CUDA backend: keep gradients, momentum and updates in host memory (no GPU data "
               "plane; clients must use the shm data plane)");
  app.add_flag("--defer-host-copies", config.defer_host_copies,
               "Host memory: finish each copy of a step to the host a poll later, as the GPU data "
               "plane does (tests run the GPU path's continuations on the CPU)");
  app.add_option("--stream-priority", config.stream_priority,
                 "Priority of the GPU data plane's Newton-Schulz (compute) stream: normal, low "
                 "(sharing the GPU with a compute rank) or high; its copy streams always run at "
                 "the GPU's greatest priority")
      ->check(CLI::IsMember({"normal", "low", "high"}))
      ->capture_default_str();
  app.add_flag("--cuda-graphs", config.cuda_graphs,
               "Capture each shape's Newton-Schulz sequence as a CUDA graph, then replay it");
  app.add_option("--threads", config.cpu_threads,
                 "OpenBLAS threads of the CPU backend (0: default)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--step-timeout-ms", step_timeout_ms,
                 "A step must be committed by every contributor within this time after its "
                 "first chunk")
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}))
      ->capture_default_str();
  app.add_option("--tx-slots", config.layout.tx_slots, "Client->server ring slots per session")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--rx-slots", config.layout.rx_slots, "Server->client ring slots per session")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--slot-kib", slot_kib, "Bytes per ring slot, in KiB")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--snapshot", config.snapshot_path,
                 "Snapshot file (safetensors) written at shutdown and on request");
  app.add_option("--snapshot-every", config.snapshot_every,
                 "Also write --snapshot every N steps, one step for every parameter, off the io "
                 "thread (a crash loses at most the steps since the last one; 0: never)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--restore", config.restore_path, "Snapshot to restore momentum from at start");
  app.add_option("--listen", config.listen,
                 "Also accept control connections over TCP at HOST:PORT (clients on other nodes; "
                 "their data plane is nccl); needs --auth-token-file");
  app.add_option("--auth-token-file", config.auth_token_file,
                 "Shared secret TCP clients must send in their hello (a file only its owner can "
                 "read)");
  app.add_option(
      "--plan", config.plan_path,
      "The job's plan (muon-offload plan ... --output FILE): parameters it names are registered "
      "by the ranks it routes here; those this server relays for its domain go to "
      "their owner. Needs --server-id");
  app.add_option("--server-id", config.server_id, "This server's id in --plan")
      ->check(CLI::Range(0, (1 << 16) - 1));
  app.add_option("--pool-servers", config.pool_servers,
                 "Every server of the plan in id order (socket paths or tcp://HOST:PORT, comma "
                 "separated): where relayed parameters' owners are reached")
      ->delimiter(',');
  std::string replicate = "on";
  app.add_option("--replicate", replicate,
                 "on: stream each owned parameter's state to its owner's buddy (the plan's "
                 "servers[].buddy) after every step and release the update once the buddy holds "
                 "it, so that the buddy takes over without losing a step when this server dies; "
                 "off: no replication (a crash loses the steps since the last --snapshot)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_flag("--allow-other-users", config.allow_other_users,
               "Accept clients of other uids (default: only this uid)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  app.add_option("--metrics-port", config.metrics_port,
                 "TCP port of the Prometheus endpoint GET /metrics (0: no endpoint)")
      ->capture_default_str();
  app.add_option("--metrics-address", config.metrics_address,
                 "IP address the metrics endpoint binds to")
      ->capture_default_str();
  app.add_option("--health-sample-every", config.health_sample_every,
                 "Measure the orthogonality error and non-finite values of every Nth update of "
                 "each parameter (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--health-warn-threshold", health_threshold,
                 "Warn when a sampled orthogonality error exceeds this; auto: per sample, the "
                 "error the schedule gives that update's own input (its singular values mapped "
                 "through the schedule) plus a rounding allowance")
      ->check([](const std::string& v) -> std::string {
        if (v == "auto") return "";
        try {
          size_t used = 0;
          const double x = std::stod(v, &used);
          if (used == v.size() && x >= 0.0 && std::isfinite(x)) return "";
        } catch (const std::exception&) {
        }
        return "must be 'auto' or a number >= 0, got '" + v + "'";
      })
      ->capture_default_str();
  double forget_after_s = 0;
  app.add_option("--forget-finished-jobs-after", forget_after_s,
                 "Seconds after which the parameters (momentum, last step) of a job none of whose "
                 "ranks is connected any more are forgotten, their memory freed; until then a "
                 "restarted job may resume them (0: keep them until a job registers the same "
                 "names)")
      ->check(cli::finite_range(0, 1e9))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // Up to the next millisecond: a delay below one must not round to 0 (never).
  config.forget_after =
      std::chrono::milliseconds(static_cast<int64_t>(std::ceil(forget_after_s * 1000.0)));
  if (health_threshold != "auto") config.health_warn_threshold = std::stod(health_threshold);
  config.step_timeout = std::chrono::milliseconds(step_timeout_ms);
  config.layout.slot_bytes = slot_kib * 1024;
  config.replicate = replicate == "on";

  auto logger = spdlog::stderr_color_mt("server");
  spdlog::set_default_logger(logger);
  if (const char* env = std::getenv("SPDLOG_LEVEL"); env && *env) log_level = env;
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::flush_on(spdlog::level::warn);

  // Keep freed buffers in the process: glibc would otherwise hand large blocks back to the kernel
  // and every step would fault fresh pages in again (~1.2 GB/s against ~25 GB/s into warm ones).
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);

  int rc = 0;
  try {
    daemon::Server server(config);
    server.run();
  } catch (const std::exception& e) {
    std::cerr << "muon-offloadd: error: " << e.what() << "\n";
    rc = 1;
  }
  spdlog::shutdown();
  return rc;
}
