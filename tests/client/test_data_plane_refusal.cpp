// The choice of data plane at hello: a server on the CPU backend refuses cuda_ipc with an error
// that names the data plane and the backend, and the client reports it as ServerError; shm (the
// default) keeps working on the same server.
#include <gtest/gtest.h>

#include "client_fixtures.hpp"

using namespace muon;
using namespace muon::testing;

TEST(DataPlane, CpuServerRefusesCudaIpcWithItsReason) {
  const auto dir = temp_dir();
  ServerProcess server(dir, {"--backend", "cpu"});
  try {
    client::Client c(config_for(server.socket(), transport::DataPlane::cuda_ipc));
    FAIL() << "a CPU server accepted data plane cuda_ipc";
  } catch (const client::ServerError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code, ErrorCode::unsupported) << what;
    EXPECT_NE(what.find("cuda_ipc"), std::string::npos) << what;
    EXPECT_NE(what.find("cpu"), std::string::npos) << what;
    EXPECT_NE(what.find(server.socket()), std::string::npos) << what;
  }
  // The refused hello did not take rank 0: a shm client of the same job connects and works.
  client::Client c(config_for(server.socket()));
  EXPECT_EQ(c.config().data_plane, transport::DataPlane::shm);
  auto reg = one_param("w", {8, 12});
  c.register_parameters({reg});
  Reference ref(reg);
  const auto g = gradient(96, 0);
  c.push("w", 0, 0, g.data(), 96);
  c.commit("w", 0);
  std::vector<float> u(96);
  EXPECT_TRUE(c.wait_update("w", 0, u.data()));
  EXPECT_TRUE(same_bits(u, ref.step(g)));
}

TEST(DataPlane, NamesParse) {
  EXPECT_EQ(transport::parse_data_plane("shm"), transport::DataPlane::shm);
  EXPECT_EQ(transport::parse_data_plane("cuda_ipc"), transport::DataPlane::cuda_ipc);
  EXPECT_THROW(transport::parse_data_plane("nvlink"), InvalidArgument);
}
