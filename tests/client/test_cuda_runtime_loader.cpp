// Which CUDA runtime libmuon_offload_client.so uses (client/cuda_runtime_loader.cpp): the one
// already in the process when there is one (PyTorch's), else one it loads itself; never a second
// copy beside the first. Each case runs in a child process, since a process decides once.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "client/muon_client.h"

namespace {

// The distinct files named libcudart* mapped into this process.
std::set<std::string> mapped_runtimes() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> out;
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash != std::string::npos && line.find("libcudart", slash) != std::string::npos) {
      out.insert(line.substr(slash));
    }
  }
  return out;
}

// Exits 0 when `ok`, else prints `why` and exits 1 (the child's verdict for EXPECT_EXIT).
[[noreturn]] void verdict(bool ok, const std::string& why) {
  if (!ok) std::fprintf(stderr, "%s\n", why.c_str());
  std::exit(ok ? 0 : 1);
}

}  // namespace

TEST(CudaRuntimeLoader, NothingIsLoadedUntilADeviceFunctionNeedsIt) {
  if (!muon_client_has_cuda()) GTEST_SKIP() << "client library built without CUDA";
  EXPECT_EXIT(verdict(mapped_runtimes().empty(), "a libcudart is mapped before any device call"),
              ::testing::ExitedWithCode(0), "");
}

TEST(CudaRuntimeLoader, SharesTheRuntimeAlreadyInTheProcess) {
  if (!muon_client_has_cuda()) GTEST_SKIP() << "client library built without CUDA";
  EXPECT_EXIT(
      {
        // As PyTorch does when it imports: its own libcudart, loaded privately (RTLD_LOCAL).
        void* torch_like = dlopen(MUON_TEST_CUDART, RTLD_NOW | RTLD_LOCAL);
        if (!torch_like) verdict(false, std::string("dlopen: ") + dlerror());
        const std::string origin = muon_client_cuda_runtime();
        const auto maps = mapped_runtimes();
        verdict(origin.find("(already loaded)") != std::string::npos && maps.size() == 1,
                "origin '" + origin + "', " + std::to_string(maps.size()) + " runtimes mapped");
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CudaRuntimeLoader, LoadsOneItselfWhenNoneIsThere) {
  if (!muon_client_has_cuda()) GTEST_SKIP() << "client library built without CUDA";
  EXPECT_EXIT(
      {
        const std::string origin = muon_client_cuda_runtime();
        const auto maps = mapped_runtimes();
        verdict(!origin.empty() && origin.find("already") == std::string::npos &&
                    origin.find("libcudart.so.") != std::string::npos && maps.size() == 1,
                "origin '" + origin + "' (" + muon_last_error() + "), " +
                    std::to_string(maps.size()) + " runtimes mapped");
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CudaRuntimeLoader, WithoutCudaTheLibrarySaysSo) {
  if (muon_client_has_cuda()) GTEST_SKIP() << "client library built with CUDA";
  EXPECT_STREQ(muon_client_cuda_runtime(), "");
  EXPECT_EQ(muon_last_error_code(), 19);  // unavailable
  EXPECT_NE(std::string(muon_last_error()).find("without CUDA"), std::string::npos);
}
