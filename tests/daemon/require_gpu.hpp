// REQUIRE_GPU(): the first statement of a GPU test. Skips it, saying why, unless this is a CUDA
// build and the process can use a GPU (kernels/device_probe.hpp).
#pragma once

#include <gtest/gtest.h>

#include "kernels/device_probe.hpp"

#if defined(MUON_HAVE_CUDA)
#define REQUIRE_GPU()                                               \
  do {                                                              \
    if (const auto why = cuda_unavailable_reason(); !why.empty()) { \
      GTEST_SKIP() << why;                                          \
    }                                                               \
  } while (0)
#else
#define REQUIRE_GPU() GTEST_SKIP() << "built without CUDA"
#endif
