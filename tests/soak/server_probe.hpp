// What the soak driver reads about the server from outside: its memory (/proc/<pid>/status),
// the shared-memory segments it maps (/proc/<pid>/maps), the segments left in /dev/shm, and its
// `status` answer on the control socket.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace muon::soak {

/// Resident memory of a process, KiB (/proc/<pid>/status: VmRSS = RssAnon + RssFile + RssShmem).
struct MemorySample {
  int64_t vm_rss_kib = 0;
  int64_t rss_anon_kib = 0;   ///< heap and anonymous mappings: momentum, buffers, sessions
  int64_t rss_shmem_kib = 0;  ///< mapped shared memory: the sessions' ring segments
};

/// The process' memory, or nullopt when it is gone.
std::optional<MemorySample> read_memory(pid_t pid);

/// Names ("muon-<hex>") of the muon shared-memory segments the process maps now.
std::vector<std::string> mapped_segments(pid_t pid);

/// A muon segment that exists in /dev/shm.
struct ShmEntry {
  std::string name;  ///< "muon-<hex>"
  uint64_t bytes = 0;
  int64_t ctime_s = 0;  ///< status change time, seconds since the epoch (creation, here)
};

/// Every /dev/shm/muon-* entry.
std::vector<ShmEntry> list_segments();

/// The server's `status` JSON (sessions, parameters, steps in progress), or a line saying why
/// there is none, within `timeout`.
std::string server_status(const std::string& socket, std::chrono::milliseconds timeout);

/// Says hello as `rank` of a `world`-rank job, takes the session's segment name ("muon-<hex>")
/// from the answer and closes the connection without mapping the segment: what a client killed
/// during its connect leaves behind. The server must remove that name. Throws std::runtime_error
/// when the server does not answer hello_ok.
std::string abandoned_hello(const std::string& socket, int rank, int world,
                            std::chrono::milliseconds timeout);

}  // namespace muon::soak
