// muon_soak: the soak test of muon-offloadd (see soak_driver.hpp and bench/README.md, "Soak").
// Exit code 0 when every bound held, 1 when one did not (the summary says which), 2 on bad
// arguments or when the soak could not start.
#include <signal.h>
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "tests/soak/soak_driver.hpp"

int main(int argc, char** argv) {
  using namespace muon::soak;
  SoakConfig c;
  c.server_bin = MUON_OFFLOADD;
  c.rank_bin = MUON_SOAK_RANK;
  CLI::App app{
      "muon_soak: N rank processes x M steps against one real muon-offloadd, SIGKILL and restart "
      "of random ranks every K steps; checks server memory, shared-memory segments, hangs and "
      "every update bitwise against the in-process kernels"};
  app.add_option("--clients", c.clients, "rank processes")->capture_default_str();
  app.add_option("--steps", c.steps, "steps of every parameter (0: until --duration)")
      ->capture_default_str();
  app.add_option("--kill-every", c.kill_every, "SIGKILL random ranks every K steps (0: never)")
      ->capture_default_str();
  app.add_option("--kill-max", c.kill_max, "ranks killed at once: 1..this, at random")
      ->capture_default_str();
  app.add_option("--duration", c.duration_s, "stop after this many seconds (0: no limit)")
      ->capture_default_str();
  app.add_option("--shapes", c.shapes, "parameter set: small or gpt2")
      ->check(CLI::IsMember({"small", "gpt2"}))
      ->capture_default_str();
  app.add_option("--backward-ms", c.backward_ms,
                 "each rank spreads a round's pushes over this long, like a backward pass")
      ->capture_default_str();
  app.add_option("--hang", c.hang_s, "seconds any wait may take before it counts as a hang")
      ->capture_default_str();
  app.add_option("--warmup", c.warmup_steps,
                 "steps before RSS samples count (default: 2 x --kill-every, or 5)");
  app.add_option("--rss-bound-mib", c.rss_bound_mib, "allowed VmRSS growth after warm-up, MiB")
      ->capture_default_str();
  app.add_option("--rss-bound-pct", c.rss_bound_pct,
                 "... or this % of the first sample after warm-up, whichever is larger")
      ->capture_default_str();
  app.add_option("--slot-kib", c.slot_kib, "server ring slot size, KiB (0: random per run)")
      ->capture_default_str();
  app.add_option("--seed", c.seed, "seed of the kill schedule and the chunking")
      ->capture_default_str();
  app.add_option("--server", c.server_bin, "muon-offloadd binary")->capture_default_str();
  app.add_option("--server-arg", c.server_args,
                 "one more flag for the server, repeatable (e.g. --server-arg=--defer-host-copies)");
  app.add_option("--rank-bin", c.rank_bin, "muon_soak_rank binary")->capture_default_str();
  app.add_option("--work-dir", c.work_dir, "logs, events, result.json (default: a new /tmp dir)");
  app.add_option("--json", c.json_path, "write the result as JSON here too");
  app.add_flag("--keep", c.keep, "keep the work folder after a pass");
  CLI11_PARSE(app, argc, argv);

  ::signal(SIGPIPE, SIG_IGN);                // a killed rank's stdin: write() returns EPIPE instead
  ::setenv("OPENBLAS_NUM_THREADS", "1", 1);  // the ranks' kernels, like the server's --threads 1
  try {
    SoakDriver driver(c);
    const auto r = driver.run();
    std::cout << summary_text(r, c);
    return r.failures.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "muon_soak: " << e.what() << "\n";
    return 2;
  }
}
