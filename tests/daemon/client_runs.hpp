// Test client processes (tests/daemon/test_client_main.cpp) as the integration tests drive
// them: started with a rank, a sharding mode and the servers to use; what they received read
// back from their output file and compared bitwise with a reference.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "process.hpp"

namespace muon::testing {

namespace fs = std::filesystem;

struct ClientRun {
  pid_t pid;
  std::string out;
};

inline ClientRun start_client(const fs::path& dir, const std::vector<std::string>& sockets,
                              int rank, int world, const std::string& mode,
                              std::vector<std::string> extra = {}) {
  ClientRun r;
  r.out = (dir / ("rank" + std::to_string(rank) + "_" + std::to_string(::getpid()) + "_" +
                  std::to_string(std::rand()) + ".bin"))
              .string();
  std::vector<std::string> argv = {MUON_TEST_CLIENT,
                                   "--rank",
                                   std::to_string(rank),
                                   "--world",
                                   std::to_string(world),
                                   "--mode",
                                   mode,
                                   "--out",
                                   r.out};
  for (const auto& s : sockets) {
    argv.push_back("--socket");
    argv.push_back(s);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  r.pid = spawn(argv);
  return r;
}

// (step, param) -> values, as written by the test client.
inline std::map<std::pair<int64_t, int64_t>, std::vector<float>> read_updates(
    const std::string& path) {
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> out;
  std::ifstream f(path, std::ios::binary);
  int64_t h[3];
  while (f.read(reinterpret_cast<char*>(h), sizeof h)) {
    std::vector<float> v(static_cast<size_t>(h[2]));
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    out[{h[0], h[1]}] = std::move(v);
  }
  return out;
}

struct ErrFile {
  std::string code;
  int rank = -1;
  std::string param, message;
};

inline ErrFile read_err(const std::string& out) {
  ErrFile e;
  std::ifstream f(out + ".err");
  std::string rank;
  std::getline(f, e.code);
  std::getline(f, rank);
  std::getline(f, e.param);
  std::getline(f, e.message);
  e.rank = rank.empty() ? -1 : std::stoi(rank);
  return e;
}

inline void expect_bitwise(const std::string& out,
                           const std::vector<std::vector<std::vector<float>>>& ref,
                           int64_t first_step, int64_t steps, const std::string& what) {
  const auto got = read_updates(out);
  for (int64_t s = first_step; s < first_step + steps; ++s) {
    for (size_t pi = 0; pi < ref[s].size(); ++pi) {
      auto it = got.find({s, static_cast<int64_t>(pi)});
      ASSERT_NE(it, got.end()) << what << ": no update for step " << s << " param " << pi;
      ASSERT_EQ(it->second.size(), ref[s][pi].size());
      EXPECT_EQ(std::memcmp(it->second.data(), ref[s][pi].data(), ref[s][pi].size() * 4), 0)
          << what << ": step " << s << " param " << pi << " differs from the in-process kernels";
    }
  }
}

}  // namespace muon::testing
