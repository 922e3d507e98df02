// The in-process reference's C ABI (libmuon_offload_reference.so, client/muon_reference.h): its
// updates against the SVD oracle, the handle and muon_local_update agreeing bitwise, the skip
// policy, OpenBLAS' process-wide thread count put back after each update, and bad input refused
// with a status, an ErrorCode and a message.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "client/muon_reference.h"
#include "kernels/ns_schedule.hpp"
#include "svd_oracle.hpp"

namespace {

using muon::testing::compare_with_oracle;
using muon::testing::gaussian;

constexpr const char* kPlain = R"({"momentum": "none", "scale": "none"})";

struct Reference {
  muon_reference* r = nullptr;
  explicit Reference(int threads) { EXPECT_EQ(muon_reference_create(threads, &r), MUON_OK); }
  ~Reference() { muon_reference_destroy(r); }
};

// OpenBLAS' own thread count functions, from the libopenblas the reference library brought in.
int (*blas_get_threads())() {
  return reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
}
void (*blas_set_threads())(int) {
  return reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
}

}  // namespace

TEST(ReferenceCApi, UpdateIsNewtonSchulzOfTheGradientPerTheSvdOracle) {
  const int rows = 32, cols = 48;
  const int64_t shape[] = {rows, cols};
  const auto g = gaussian(rows * cols, 11);
  std::vector<float> u(g.size());
  Reference ref(1);
  ASSERT_EQ(muon_reference_update(ref.r, "w", shape, 2, kPlain, g.data(), nullptr, u.data()), 0)
      << muon_reference_last_error();
  const auto coeffs = muon::find_ns_schedule("keller").coefficients(5);
  const auto rep = compare_with_oracle(g.data(), u.data(), rows, cols, coeffs, 1e-7, 1e-2);
  EXPECT_LT(rep.rel_error, 3e-5);
  EXPECT_LT(rep.max_offdiag, 3e-5);
}

TEST(ReferenceCApi, HandleAndLocalUpdateAgreeBitwiseAcrossSteps) {
  const int64_t shape[] = {3, 16, 24};  // an expert stack
  const size_t n = 3 * 16 * 24;
  const char* opts = R"({"momentum": "ema", "mu": 0.9})";
  std::vector<float> m1(n, 0.0f), m2(n, 0.0f), u1(n), u2(n);
  Reference ref(1);
  for (int step = 0; step < 3; ++step) {
    const auto g = gaussian(n, 20 + step);
    ASSERT_EQ(muon_reference_update(ref.r, "e", shape, 3, opts, g.data(), m1.data(), u1.data()), 0)
        << muon_reference_last_error();
    ASSERT_EQ(muon_local_update("e", shape, 3, opts, g.data(), m2.data(), u2.data(), 1), 0)
        << muon_reference_last_error();
    EXPECT_EQ(std::memcmp(u1.data(), u2.data(), n * sizeof(float)), 0) << "step " << step;
    EXPECT_EQ(std::memcmp(m1.data(), m2.data(), n * sizeof(float)), 0) << "step " << step;
  }
  EXPECT_GT(std::abs(u1[0]) + std::abs(u1[n - 1]), 0.0f);
}

TEST(ReferenceCApi, SkipPolicyZeroesTheUpdateAndKeepsTheMomentum) {
  const int64_t shape[] = {8, 8};
  auto g = gaussian(64, 3);
  g[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> momentum(64, 0.25f), u(64, 7.0f);
  Reference ref(1);
  EXPECT_EQ(muon_reference_update(ref.r, "w", shape, 2, R"({"nonfinite": "skip"})", g.data(),
                                  momentum.data(), u.data()),
            1);
  for (float x : u) ASSERT_EQ(x, 0.0f);
  for (float x : momentum) ASSERT_EQ(x, 0.25f);
  // The default policy refuses the same gradient, naming the parameter.
  EXPECT_EQ(muon_reference_update(ref.r, "w", shape, 2, "{}", g.data(), momentum.data(), u.data()),
            MUON_ERR_NONFINITE);
  EXPECT_EQ(muon_reference_last_error_code(), 7);  // non_finite
  EXPECT_NE(std::string(muon_reference_last_error()).find("'w'"), std::string::npos)
      << muon_reference_last_error();
}

TEST(ReferenceCApi, OpenBlasThreadCountIsPutBackAfterEachUpdate) {
  auto get = blas_get_threads();
  auto set = blas_set_threads();
  ASSERT_NE(get, nullptr) << "libopenblas is not in the process";
  ASSERT_NE(set, nullptr);
  set(3);
  ASSERT_EQ(get(), 3);
  const int64_t shape[] = {16, 16};
  const auto g = gaussian(256, 5);
  std::vector<float> u(256);
  Reference ref(1);
  ASSERT_EQ(muon_reference_update(ref.r, "w", shape, 2, kPlain, g.data(), nullptr, u.data()), 0);
  EXPECT_EQ(get(), 3);  // the caller's (e.g. PyTorch's) setting, untouched
  ASSERT_EQ(muon_local_update("w", shape, 2, kPlain, g.data(), nullptr, u.data(), 2), 0);
  EXPECT_EQ(get(), 3);
  set(1);
}

TEST(ReferenceCApi, BadInputIsRefusedWithStatusCodeAndMessage) {
  const int64_t shape[] = {4, 4};
  std::vector<float> g(16, 1.0f), u(16);
  muon_reference* r = nullptr;
  EXPECT_EQ(muon_reference_create(-1, &r), MUON_ERR_INVALID);
  EXPECT_EQ(r, nullptr);
  EXPECT_EQ(muon_reference_last_error_code(), 17);  // invalid_argument
  EXPECT_EQ(muon_reference_update(nullptr, "w", shape, 2, "{}", g.data(), nullptr, u.data()),
            MUON_ERR_INVALID);
  EXPECT_NE(std::string(muon_reference_last_error()).find("null handle"), std::string::npos);

  Reference ref(1);
  EXPECT_EQ(muon_reference_update(ref.r, "w", shape, 2, R"({"lr": 0.1})", g.data(), nullptr,
                                  u.data()),
            MUON_ERR_INVALID);
  EXPECT_NE(std::string(muon_reference_last_error()).find("unknown option 'lr'"),
            std::string::npos)
      << muon_reference_last_error();
  EXPECT_EQ(muon_reference_update(ref.r, "w", shape, 2, "{not json", g.data(), nullptr, u.data()),
            MUON_ERR_INVALID);
  EXPECT_NE(std::string(muon_reference_last_error()).find("not valid JSON"), std::string::npos);
  const int64_t vector_shape[] = {16};
  EXPECT_EQ(muon_reference_update(ref.r, "bias", vector_shape, 1, "{}", g.data(), nullptr,
                                  u.data()),
            MUON_ERR_INVALID);
  EXPECT_NE(std::string(muon_reference_last_error()).find("bias"), std::string::npos)
      << muon_reference_last_error();
  EXPECT_EQ(muon_reference_update(ref.r, "w", shape, 2, "{}", nullptr, nullptr, u.data()),
            MUON_ERR_INVALID);
  // Momentum "sum" (the default) keeps a momentum: a null buffer is refused, not written through.
  EXPECT_EQ(muon_reference_update(ref.r, "w", shape, 2, "{}", g.data(), nullptr, u.data()),
            MUON_ERR_INVALID);
  EXPECT_NE(std::string(muon_reference_last_error()).find("momentum buffer is null"),
            std::string::npos)
      << muon_reference_last_error();
  EXPECT_EQ(muon_local_update("w", shape, 2, "{}", g.data(), nullptr, u.data(), -2),
            MUON_ERR_INVALID);
  // A success clears the thread's last failure.
  EXPECT_EQ(muon_reference_update(ref.r, "w", shape, 2, kPlain, g.data(), nullptr, u.data()), 0);
  EXPECT_EQ(muon_reference_last_error_code(), 0);
  EXPECT_STREQ(muon_reference_last_error(), "");
}
