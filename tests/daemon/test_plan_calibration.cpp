// A server started with a plan measures auto's Newton-Schulz choices for the parameters the plan
// has it own as it starts (daemon/plan_calibration.hpp), before any rank registers: a real
// muon-offloadd process on a fresh choice table, tiny shapes (a few seconds).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "kernels/ns_choice.hpp"
#include "server_process.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

// One server, one rank; "w.wide" 16x24 and "w.tall" 40x8 owned by server 0, "w.qkv" 24x16 in 3
// row blocks (8x16 each), and "w.other" 32x32 owned by a server 1 that relays nothing here.
const char* kPlan = R"({
  "servers": [{"id": 0}, {"id": 1}],
  "domains": [{"id": 0, "servers": [0, 1], "compute_ranks": [0]}],
  "ranks": [{"rank": 0}],
  "settings": {"schedule": "keller", "ns_steps": 5},
  "parameters": [
    {"name": "w.wide", "shape": [16, 24], "row_blocks": 1, "owner": 0, "relays": [0]},
    {"name": "w.tall", "shape": [40, 8], "owner": 0, "relays": [0]},
    {"name": "w.qkv", "shape": [24, 16], "row_blocks": 3, "owner": 0, "relays": [0]},
    {"name": "w.other", "shape": [32, 32], "owner": 1, "relays": [1]}]})";

// MUON_OFFLOAD_NS_TABLE set for the processes this test starts, and put back after.
class ScopedTableEnv {
 public:
  explicit ScopedTableEnv(const std::string& path) {
    if (const char* old = std::getenv("MUON_OFFLOAD_NS_TABLE")) old_ = old;
    ::setenv("MUON_OFFLOAD_NS_TABLE", path.c_str(), 1);
  }
  ~ScopedTableEnv() {
    if (old_) {
      ::setenv("MUON_OFFLOAD_NS_TABLE", old_->c_str(), 1);
    } else {
      ::unsetenv("MUON_OFFLOAD_NS_TABLE");
    }
  }

 private:
  std::optional<std::string> old_;
};

std::set<std::string> keys_in(const std::string& table) {
  std::set<std::string> keys;
  for (const auto& e : read_ns_choice_file(table)) keys.insert(e.key);
  return keys;
}

}  // namespace

TEST(PlanCalibration, ServerStartMeasuresTheOwnedShapesBeforeAnyRegistration) {
  const auto dir = temp_dir();
  const std::string plan = (dir / "plan.json").string(), table = (dir / "ns.json").string();
  std::ofstream(plan) << kPlan;
  ScopedTableEnv env(table);
  ASSERT_FALSE(fs::exists(table));
  ServerProcess server(dir, {"--plan", plan, "--server-id", "0"});
  // Wide blocks m x n (rows <= cols): the tall 40x8 is chosen for as 8x40; the fused one per
  // block; server 1's 32x32 is not this server's.
  const std::set<std::string> expected = {
      "fp32 16x24 steps=5 restart=2", "fp32 8x40 steps=5 restart=2", "fp32 8x16 steps=5 restart=2"};
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (keys_in(table) != expected && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(keys_in(table), expected);
  for (const auto& e : read_ns_choice_file(table)) {
    EXPECT_NE(e.machine.find("threads=1"), std::string::npos) << e.machine;  // --threads 1
    EXPECT_NE(e.choice.reason.find("fastest within 3 %"), std::string::npos) << e.choice.reason;
  }
  fs::remove_all(dir);
}
