// The C ABI's error codes (muon_last_error_code, muon_error_code_name) and the options' schema
// (muon_options_schema), against a real server where the server's codes are involved.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "client/muon_client.h"
#include "server_process.hpp"

using namespace muon::testing;
using json = nlohmann::json;

TEST(CApiErrors, CodeNamesRunFromZeroUntilNull) {
  std::vector<std::string> names;
  for (int i = 0; muon_error_code_name(i) != nullptr; ++i) names.emplace_back(muon_error_code_name(i));
  ASSERT_EQ(names.size(), 21u);
  EXPECT_EQ(names[0], "none");
  EXPECT_EQ(names[5], "peer_lost");
  EXPECT_EQ(names[16], "connection_lost");
  EXPECT_EQ(muon_error_code_name(-1), nullptr);
}

TEST(CApiErrors, ClientFailuresSetTheirCodeAndSuccessClearsIt) {
  const char* servers[] = {"/nonexistent/muon-offload-test.sock"};
  muon_client* c = nullptr;
  EXPECT_EQ(muon_client_create(servers, 1, 0, 1, "codes", 50, 1000, &c), MUON_ERR_CONNECTION);
  EXPECT_EQ(muon_last_error_code(), 16);  // connection_lost
  EXPECT_STREQ(muon_last_error_param(), "");  // the client's own failure names nothing
  EXPECT_EQ(muon_last_error_step(), -1);
  EXPECT_EQ(muon_client_create(servers, 0, 0, 1, "codes", 50, 1000, &c), MUON_ERR_INVALID);
  EXPECT_EQ(muon_last_error_code(), 17);  // invalid_argument

  const auto dir = temp_dir();
  ServerProcess server(dir, {"--backend", "cpu"});
  const char* real[] = {server.socket().c_str()};
  ASSERT_EQ(muon_client_create(real, 1, 0, 1, "codes", 5000, 20000, &c), MUON_OK)
      << muon_last_error();
  EXPECT_EQ(muon_last_error_code(), 0);
  const int64_t shape[] = {4, 4};
  const int64_t all[] = {0, 16};
  // A bad option never reaches the server.
  EXPECT_EQ(muon_client_register(c, "w", shape, 2, "f32", "f32", "{\"lr\": 1}", all, 1, all, 1, 0),
            MUON_ERR_INVALID);
  EXPECT_EQ(muon_last_error_code(), 17);
  EXPECT_NE(std::string(muon_last_error()).find("unknown option 'lr'"), std::string::npos)
      << muon_last_error();
  // The server refuses a range outside the parameter: its bad_request, name in the message.
  const int64_t outside[] = {0, 17};
  EXPECT_EQ(muon_client_register(c, "w", shape, 2, "f32", "f32", "{}", outside, 1, all, 1, 0),
            MUON_ERR_SERVER);
  EXPECT_EQ(muon_last_error_code(), 1);  // bad_request
  EXPECT_NE(std::string(muon_last_error()).find("(server error code: bad_request)"),
            std::string::npos)
      << muon_last_error();
  ASSERT_EQ(muon_client_register(c, "w", shape, 2, "f32", "f32", "{}", all, 1, all, 1, 0), MUON_OK)
      << muon_last_error();
  EXPECT_EQ(muon_last_error_code(), 0);
  // The server refuses a step whose gradient holds a NaN: its error names the parameter and
  // the step, as fields (muon_last_error_param/_step), not only in the message.
  std::vector<float> grad(16, 1.0f), update(16);
  grad[5] = std::nanf("");
  ASSERT_EQ(muon_client_push(c, "w", 0, 0, grad.data(), 16), MUON_OK) << muon_last_error();
  ASSERT_EQ(muon_client_commit(c, "w", 0), MUON_OK) << muon_last_error();
  int applied = -1;
  EXPECT_EQ(muon_client_wait_update(c, "w", 0, update.data(), 64, &applied), MUON_ERR_NONFINITE)
      << muon_last_error();
  EXPECT_EQ(muon_last_error_code(), 7);  // non_finite
  EXPECT_STREQ(muon_last_error_param(), "w");
  EXPECT_EQ(muon_last_error_step(), 0);
  grad[5] = 1.0f;  // the refused step is consumed: the next one goes through and clears them
  ASSERT_EQ(muon_client_push(c, "w", 1, 0, grad.data(), 16), MUON_OK) << muon_last_error();
  ASSERT_EQ(muon_client_commit(c, "w", 1), MUON_OK) << muon_last_error();
  ASSERT_EQ(muon_client_wait_update(c, "w", 1, update.data(), 64, &applied), MUON_OK)
      << muon_last_error();
  EXPECT_STREQ(muon_last_error_param(), "");
  EXPECT_EQ(muon_last_error_step(), -1);
  muon_client_destroy(c);
}

TEST(CApiErrors, OptionsSchemaNamesEveryFieldWithItsDefault) {
  const json schema = json::parse(muon_options_schema());
  ASSERT_TRUE(schema.is_array());
  ASSERT_EQ(schema.size(), 15u);
  std::vector<std::string> names;
  for (const auto& f : schema) names.push_back(f.at("name"));
  EXPECT_EQ(names, (std::vector<std::string>{"momentum", "mu", "nesterov", "schedule", "steps",
                                             "coefficients", "eps", "eps_mode", "scale", "extra_scale",
                                             "row_splits", "algorithm", "gram_restart",
                                             "precision", "nonfinite"}));
  EXPECT_EQ(schema[0].at("default"), "sum");
  EXPECT_EQ(schema[2].at("default"), true);
  EXPECT_EQ(schema[3].at("default"), "keller");
  EXPECT_EQ(schema[4].at("type"), "integer");
  EXPECT_EQ(schema[11].at("default"), "auto");
  EXPECT_EQ(schema[12].at("default"), 2);
  EXPECT_EQ(schema[13].at("choices"), (json{"default", "fp32", "bf16", "torch_bf16"}));
  EXPECT_EQ(muon_options_schema(), muon_options_schema());  // one static string
}
