// CUDA_OK(call): a CUDA runtime call that must succeed in a GPU test (a gtest fatal failure naming
// the call and CUDA's message otherwise). For test bodies and void helpers.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#define CUDA_OK(call)                                                                       \
  do {                                                                                      \
    const cudaError_t cuda_ok_err_ = (call);                                                \
    ASSERT_EQ(cuda_ok_err_, cudaSuccess) << #call ": " << cudaGetErrorString(cuda_ok_err_); \
  } while (0)
