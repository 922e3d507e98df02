#include "cli/job_manifest.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "topology/json_fields.hpp"

namespace muon::cli {

bool JobManifest::launcher_alive() const {
  return launcher_pid > 0 && (::kill(launcher_pid, 0) == 0 || errno == EPERM);
}

std::string jobs_directory() {
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg) {
    return std::string(xdg) + "/muon-offload/jobs";
  }
  return "/tmp/muon-offload-" + std::to_string(getuid()) + "/jobs";
}

JobManifest parse_job_manifest(const std::string& text, const std::string& path) {
  const topology::JsonDocument doc(text, path);
  const auto root = doc.root();
  const std::string schema = root.string("schema");
  if (schema != "muon-offload-job/1") {
    root.fail("schema", "'" + schema + "' is not muon-offload-job/1");
  }
  JobManifest m;
  m.path = path;
  m.job = root.string("job");
  m.node_rank = static_cast<int>(root.integer("node_rank", 0, 1 << 20));
  m.host = root.string("host");
  m.launcher_pid = static_cast<int>(root.integer("launcher_pid", 1, 1 << 30));
  m.started_unix = root.number("started_unix", 0, 1e12);
  m.run_dir = root.string("run_dir");
  if (!root.at("plan").is_null()) m.plan = root.string("plan");
  m.backend = root.string("backend");
  const auto trainer = root.array("trainer");
  for (size_t i = 0; i < trainer.size(); ++i) {
    if (!trainer.at(i).is_string()) trainer.fail(i, "expected a string");
    m.trainer.push_back(trainer.at(i).get<std::string>());
  }
  const auto servers = root.array("servers");
  for (size_t i = 0; i < servers.size(); ++i) {
    const auto s = servers.object(i);
    JobServer js;
    js.index = static_cast<int>(s.integer("index", 0, 1 << 20));
    if (!s.at("plan_id").is_null()) js.plan_id = static_cast<int>(s.integer("plan_id", 0, 1 << 20));
    js.socket = s.string("socket");
    js.pid = static_cast<int>(s.integer("pid", 1, 1 << 30));
    js.log = s.string("log");
    if (!s.at("metrics_url").is_null()) js.metrics_url = s.string("metrics_url");
    if (!s.at("gpu").is_null()) js.gpu = s.string("gpu");
    m.servers.push_back(std::move(js));
  }
  return m;
}

std::vector<JobManifest> find_job_manifests(std::vector<std::string>* skipped,
                                            const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path where = dir.empty() ? jobs_directory() : dir;
  std::vector<JobManifest> out;
  std::error_code ec;
  if (!fs::is_directory(where, ec)) return out;
  for (const auto& entry : fs::directory_iterator(where, ec)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".json") continue;
    std::ifstream f(entry.path());
    std::stringstream text;
    text << f.rdbuf();
    try {
      out.push_back(parse_job_manifest(text.str(), entry.path().string()));
    } catch (const std::exception& e) {
      if (skipped != nullptr) skipped->push_back(e.what());
    }
  }
  std::sort(out.begin(), out.end(), [](const JobManifest& a, const JobManifest& b) {
    return a.started_unix < b.started_unix;
  });
  return out;
}

}  // namespace muon::cli
