// What a trainer process pays to start talking to the server: load libmuon_offload_client.so
// (dlopen, as Python's ctypes does) and connect one rank (muon_client_create: socket, hello,
// shared-memory ring) to a running muon-offloadd. Every sample is a fresh process (the dynamic
// loader's work happens once per process), which times itself from before dlopen to after
// muon_client_create and reports through a pipe.
//
// Rows (Google Benchmark, manual time = the child's own figure, median over the iterations):
//   client_start/load_and_connect  dlopen + create, in a fresh process: the figure the issue
//                                  targets (<= 50 ms per rank)
//   client_start/load              dlopen alone (the library and everything it NEEDs)
//   client_start/connect           create alone, library already loaded: the reference; the
//                                  counter load_and_connect/connect says what loading adds
// Usage: client_start_bench [--lib PATH] [google benchmark flags]; PATH defaults to this build's
// libmuon_offload_client.so (give another build's to compare, e.g. the one before a change).
// The program links nothing of the project (only Google Benchmark and libc), so that the
// children's dlopen finds none of the client's dependencies already loaded.
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
std::string g_lib = MUON_CLIENT_LIB;
std::string g_socket;

using CreateFn = int (*)(const char* const*, int, int, int, const char*, int64_t, int64_t, void**);
using DestroyFn = void (*)(void*);

enum class Part { load_and_connect, load, connect };

// Runs in the child: the seconds `part` took, or a negative value on failure.
double child_measure(Part part) {
  const auto t0 = Clock::now();
  void* lib = dlopen(g_lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "dlopen %s: %s\n", g_lib.c_str(), dlerror());
    return -1;
  }
  const auto t1 = Clock::now();
  if (part == Part::load) return std::chrono::duration<double>(t1 - t0).count();
  auto create = reinterpret_cast<CreateFn>(dlsym(lib, "muon_client_create"));
  auto destroy = reinterpret_cast<DestroyFn>(dlsym(lib, "muon_client_destroy"));
  const char* servers[] = {g_socket.c_str()};
  void* client = nullptr;
  if (!create || create(servers, 1, 0, 1, "start bench", 5000, 20000, &client) != 0) {
    std::fprintf(stderr, "muon_client_create failed\n");
    return -1;
  }
  const auto t2 = Clock::now();
  destroy(client);
  return std::chrono::duration<double>(part == Part::connect ? t2 - t1 : t2 - t0).count();
}

// Forks a fresh process for one sample; returns its figure.
double sample(Part part) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const double s = child_measure(part);
    (void)!write(fds[1], &s, sizeof s);
    _exit(s < 0 ? 1 : 0);
  }
  close(fds[1]);
  double s = -1;
  if (read(fds[0], &s, sizeof s) != sizeof s) s = -1;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return s;
}

void run(benchmark::State& state, Part part) {
  if (g_socket.empty()) {
    state.SkipWithError("no server");
    return;
  }
  for (auto _ : state) {
    const double s = sample(part);
    if (s < 0) {
      state.SkipWithError("a sample failed (see stderr)");
      return;
    }
    state.SetIterationTime(s);
  }
}

// muon-offloadd on a socket in a private temporary folder, until destroyed (SIGTERM).
class Server {
 public:
  Server() {
    char tmpl[] = "/tmp/muon-start-bench-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    socket_ = dir_ + "/s.sock";
    std::vector<std::string> args = {MUON_OFFLOADD, "--socket", socket_, "--backend", "cpu",
                                     "--log-level", "warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) pid_ = 0;
  }
  ~Server() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }
  /// The socket once a connection succeeds (within 60 s), else "".
  std::string ready() const {
    for (int i = 0; i < 6000 && pid_ > 0; ++i) {
      const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
      const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      close(fd);
      if (ok) return socket_;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return "";
  }

 private:
  std::string dir_, socket_;
  pid_t pid_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--lib") == 0 && i + 1 < argc) {
      g_lib = argv[++i];
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  Server server;
  g_socket = server.ready();
  for (auto [name, part] : {std::pair{"client_start/load_and_connect", Part::load_and_connect},
                            std::pair{"client_start/load", Part::load},
                            std::pair{"client_start/connect", Part::connect}}) {
    benchmark::RegisterBenchmark(name, [part = part](benchmark::State& s) { run(s, part); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(15)
        ->Repetitions(1);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
