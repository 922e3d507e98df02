// The C ABI of the data planes: muon_client_create_ex (data plane by name), the device entry
// points and their error codes and messages where no GPU is usable, and the session living on.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "client/muon_client.h"
#include "client/muon_reference.h"
#include "scenario.hpp"
#include "server_process.hpp"

using namespace muon::testing;

namespace {

muon_client* create(const std::string& socket, const char* plane, int* rc) {
  const char* servers[] = {socket.c_str()};
  muon_client* c = nullptr;
  *rc = muon_client_create_ex(servers, 1, 0, 1, "c api test", 5000, 20000, plane, &c);
  return c;
}

std::vector<float> gradient(int64_t n) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[i] = grad_value(0, 0, 0, i);
  return g;
}

bool device_error_code(int rc) {
  return rc == MUON_ERR_DEVICE || rc == MUON_ERR_UNAVAILABLE || rc == MUON_ERR_INVALID;
}

}  // namespace

TEST(CApiDataPlane, UnknownDataPlaneIsInvalid) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--backend", "cpu"});
  int rc = 0;
  EXPECT_EQ(create(server.socket(), "nvlink", &rc), nullptr);
  EXPECT_EQ(rc, MUON_ERR_INVALID);
  EXPECT_EQ(muon_last_error_code(), 17);  // invalid_argument
  const std::string msg = muon_last_error();
  EXPECT_NE(msg.find("cuda_ipc"), std::string::npos) << msg;
}

TEST(CApiDataPlane, CpuServerRefusesCudaIpc) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--backend", "cpu"});
  int rc = 0;
  EXPECT_EQ(create(server.socket(), "cuda_ipc", &rc), nullptr);
  EXPECT_EQ(rc, MUON_ERR_SERVER);
  EXPECT_EQ(muon_last_error_code(), 3);  // the server's "unsupported"
  EXPECT_STREQ(muon_error_code_name(muon_last_error_code()), "unsupported");
  const std::string msg = muon_last_error();
  EXPECT_NE(msg.find("cuda_ipc"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
}

TEST(CApiDataPlane, DeviceCallsReportCodeAndMessageAndTheSessionLivesOn) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--backend", "cpu"});
  int rc = 0;
  muon_client* c = create(server.socket(), nullptr, &rc);  // NULL: shm
  ASSERT_EQ(rc, MUON_OK) << muon_last_error();
  const int64_t shape[] = {8, 12};
  const int64_t all[] = {0, 96};
  ASSERT_EQ(
      muon_client_register(c, "w", shape, 2, "f32", "f32", "{\"mu\": 0.9}", all, 1, all, 1, 0),
      MUON_OK)
      << muon_last_error();
  const auto g = gradient(96);
  std::vector<float> u(96), momentum(96, 0.0f), expected(96);
  ASSERT_EQ(muon_local_update("w", shape, 2, "{\"mu\": 0.9}", g.data(), momentum.data(),
                              expected.data(), kThreads),
            0)
      << muon_reference_last_error();

  rc = muon_client_push_device(c, "w", 0, 0, g.data(), 96, nullptr);
  EXPECT_TRUE(device_error_code(rc)) << rc;
  EXPECT_NE(std::string(muon_last_error()).find("push_device of 'w'"), std::string::npos)
      << muon_last_error();
  if (!muon_client_has_cuda()) {
    EXPECT_EQ(rc, MUON_ERR_UNAVAILABLE);
  }

  ASSERT_EQ(muon_client_push(c, "w", 0, 0, g.data(), 96), MUON_OK) << muon_last_error();
  ASSERT_EQ(muon_client_commit(c, "w", 0), MUON_OK) << muon_last_error();
  int applied = -1;
  // The buffer size is checked first, like muon_client_wait_update's.
  EXPECT_EQ(muon_client_wait_update_device(c, "w", 0, u.data(), 95 * 4, nullptr, &applied),
            MUON_ERR_INVALID);
  EXPECT_NE(std::string(muon_last_error()).find("need 384"), std::string::npos)
      << muon_last_error();
  rc = muon_client_wait_update_device(c, "w", 0, u.data(), 96 * 4, nullptr, &applied);
  EXPECT_TRUE(device_error_code(rc)) << rc;
  EXPECT_NE(std::string(muon_last_error()).find("wait_update_device of 'w'"), std::string::npos)
      << muon_last_error();
  ASSERT_EQ(muon_client_wait_update(c, "w", 0, u.data(), 96 * 4, &applied), MUON_OK)
      << muon_last_error();
  EXPECT_EQ(applied, 1);
  EXPECT_EQ(std::memcmp(u.data(), expected.data(), 96 * 4), 0);
  muon_client_destroy(c);
}
