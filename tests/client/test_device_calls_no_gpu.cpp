// The device entry points (push_device, wait_update_device) where no GPU is usable (this build
// machine: "CUDA driver version is insufficient"; or a build without CUDA): a clear muon error,
// nothing sent or taken, and the session goes on — a host push, commit and wait_update of the
// same step still give the reference update. On a machine with a GPU the host buffers given here
// are refused as not device memory (InvalidArgument), with the same guarantees.
#include <gtest/gtest.h>

#include "client/device_copy.hpp"
#include "client_fixtures.hpp"

using namespace muon;
using namespace muon::testing;

namespace {

// Runs f, expecting one of the errors a device call without a usable device (or given host
// memory) raises; returns its message.
template <class F>
std::string device_call_error(F&& f) {
  try {
    f();
  } catch (const DeviceError& e) {
    return e.what();
  } catch (const BackendUnavailable& e) {
    return e.what();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "the device call succeeded with a host buffer";
  return "";
}

}  // namespace

TEST(DeviceCalls, FailClearlyWithoutAUsableGpuAndTheSessionLivesOn) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--backend", "cpu"});
  client::Client c(config_for(server.socket()));
  auto reg = one_param("w", {16, 24});
  const int64_t n = 16 * 24;
  c.register_parameters({reg});
  Reference ref(reg);
  std::vector<float> u(static_cast<size_t>(n));

  for (int64_t step = 0; step < 2; ++step) {
    const auto g = gradient(n, step);
    const auto push_msg =
        device_call_error([&] { c.push_device("w", step, 0, g.data(), n, nullptr); });
    EXPECT_NE(push_msg.find("push_device of 'w'"), std::string::npos) << push_msg;
    if (!client::built_with_cuda()) {
      EXPECT_NE(push_msg.find("built without CUDA"), std::string::npos) << push_msg;
    }
    c.push("w", step, 0, g.data(), n);
    c.commit("w", step);
    const auto wait_msg =
        device_call_error([&] { c.wait_update_device("w", step, u.data(), nullptr); });
    EXPECT_NE(wait_msg.find("wait_update_device of 'w'"), std::string::npos) << wait_msg;
    // The update was left held: the host wait gets it, bitwise the reference.
    std::fill(u.begin(), u.end(), 0.0f);
    ASSERT_TRUE(c.wait_update("w", step, u.data()));
    EXPECT_TRUE(same_bits(u, ref.step(g))) << "step " << step;
    const auto stats = c.report_step(step);
    EXPECT_EQ(stats.bytes_pushed, n * 4);  // the failed device push counted nothing
    EXPECT_EQ(stats.parameters, 1);
  }
}

TEST(DeviceCalls, StagingCopiesFailCleanlyWithoutAUsableGpu) {
  std::vector<float> host(4, 1.0f);
  std::vector<float> other(4, 0.0f);
  // Either a GPU is usable here (then these are real copies), or a muon error says why not.
  try {
    client::copy_host_to_device(other.data(), host.data(), 16, nullptr);
  } catch (const DeviceError&) {
  } catch (const BackendUnavailable&) {
  }
  try {
    client::copy_device_to_host(other.data(), host.data(), 16, nullptr);
  } catch (const DeviceError&) {
  } catch (const BackendUnavailable&) {
  }
}
