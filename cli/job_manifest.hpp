// The job manifests scripts/muon-offload-launch writes while it runs (schema muon-offload-job/1):
// one file per launcher in the user's jobs directory, naming the servers it started (socket,
// pid, log, metrics endpoint, plan id, GPU). What lets `muon-offload status --job` and
// `muon-offload health --job` find every server of a job.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace muon::cli {

/// One server a launcher started.
struct JobServer {
  int index = 0;               ///< its position on this node (server<index>.log)
  std::optional<int> plan_id;  ///< its id in the plan, when launched from one
  std::string socket;
  int pid = -1;
  std::string log;
  std::string metrics_url;  ///< empty: no metrics endpoint
  std::string gpu;          ///< CUDA_VISIBLE_DEVICES it was given; empty: not set
};

/// One launcher's manifest.
struct JobManifest {
  std::string path;  ///< the file it was read from
  std::string job;
  int node_rank = 0;
  std::string host;
  int launcher_pid = -1;
  double started_unix = 0;
  std::string run_dir;
  std::string plan;  ///< empty: no plan
  std::string backend;
  std::vector<std::string> trainer;
  std::vector<JobServer> servers;
  /// Whether the launcher still runs (a manifest of a killed launcher stays behind).
  bool launcher_alive() const;
};

/// $XDG_RUNTIME_DIR/muon-offload/jobs, else /tmp/muon-offload-<uid>/jobs: where the launcher
/// writes (scripts/muon-offload-launch keeps the same rule), next to the server's default socket
/// (daemon/socket_path.hpp).
std::string jobs_directory();

/// Parses a manifest. Throws InvalidArgument naming the file and the field for a file that is
/// not a muon-offload-job/1 document.
JobManifest parse_job_manifest(const std::string& text, const std::string& path);

/// Every manifest in `dir` (default jobs_directory()), oldest first; `skipped` gets one line per
/// file that could not be read or parsed. A missing directory is no jobs.
std::vector<JobManifest> find_job_manifests(std::vector<std::string>* skipped = nullptr,
                                            const std::string& dir = "");

}  // namespace muon::cli
