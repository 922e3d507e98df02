// CUDA streams for the device data plane, as plain C++ sees them. The header names no CUDA type:
// StreamHandle is the runtime's cudaStream_t (both are `CUstream_st*`), so C++ code that never
// includes the CUDA headers can hold, pass and create streams.
#pragma once

#include <string_view>

struct CUstream_st;  // the CUDA runtime's stream: cudaStream_t is `CUstream_st*`

namespace muon {

/// A CUDA stream handle, identical to cudaStream_t (nullptr = the legacy default stream).
using StreamHandle = CUstream_st*;

/// Scheduling priority of a stream the data plane creates. CUDA numbers priorities so that lower
/// is more urgent; cudaDeviceGetStreamPriorityRange gives [greatest, least], e.g. [-5, 0] on
/// Hopper. Then:
///   normal  priority 0: what cudaStreamCreate gives, and PyTorch's default streams.
///   low     the device's least priority. On current GPUs that is 0 as well, so `low` yields
///           only to streams created with a higher priority (NCCL's, or a trainer's
///           torch.cuda.Stream(priority=-1)); a co-located server that must yield to the
///           trainer's default streams gets that from the trainer raising its own priority.
///   high    the device's greatest priority (the copy and receive streams of a server).
enum class StreamPriority { normal, low, high };

/// "normal", "low" or "high"; throws InvalidArgument listing the names otherwise.
StreamPriority parse_stream_priority(std::string_view name);

/// The numeric CUDA priority `priority` maps to on the current device
/// (cudaDeviceGetStreamPriorityRange). Throws DeviceError when the runtime fails (e.g. no GPU).
int stream_priority_value(StreamPriority priority);

/// An owned non-blocking CUDA stream (cudaStreamCreateWithPriority with cudaStreamNonBlocking:
/// never serialized with the legacy default stream), on the device current at construction.
/// Destroying it does not wait for queued work (CUDA finishes it, then releases the stream).
class DeviceStream {
 public:
  /// Throws DeviceError when the stream cannot be created (e.g. no GPU).
  explicit DeviceStream(StreamPriority priority = StreamPriority::normal);
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;

  StreamHandle get() const { return stream_; }
  /// The priority CUDA reports for the stream (cudaStreamGetPriority).
  int priority() const;
  /// Blocks until all work queued on the stream is done. Throws DeviceError on a failed kernel.
  void synchronize() const;

 private:
  StreamHandle stream_ = nullptr;
};

}  // namespace muon
