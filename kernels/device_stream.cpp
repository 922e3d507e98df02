#include "kernels/device_stream.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "core/cuda_check.hpp"
#include "core/error.hpp"

namespace muon {

int stream_priority_value(StreamPriority priority) {
  int least = 0, greatest = 0;
  MUON_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  switch (priority) {
    case StreamPriority::low:
      return least;
    case StreamPriority::high:
      return greatest;
    case StreamPriority::normal:
      break;
  }
  // 0 is the default priority; clamped in case a device ever leaves it out of its range.
  return std::clamp(0, greatest, least);
}

DeviceStream::DeviceStream(StreamPriority priority) {
  const int value = stream_priority_value(priority);
  MUON_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, value));
}

DeviceStream::~DeviceStream() {
  if (stream_ != nullptr) MUON_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
}

int DeviceStream::priority() const {
  int value = 0;
  MUON_CUDA_CHECK(cudaStreamGetPriority(stream_, &value));
  return value;
}

void DeviceStream::synchronize() const {
  MUON_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace muon
