// What the control plane carries to share device memory over CUDA IPC on one node, as plain C++
// (no CUDA types; transport/cuda_ipc.hpp converts): the 64-byte handles of cudaIpcMemHandle_t
// and cudaIpcEventHandle_t, a device ring's description and an exported region inside a larger
// cudaMalloc segment, each with a JSON form whose handles are hex strings (transport/hex_bytes).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace muon::transport {

/// CUDA_IPC_HANDLE_SIZE: the bytes of a cudaIpcMemHandle_t or cudaIpcEventHandle_t.
inline constexpr size_t kIpcHandleBytes = 64;

/// The opaque bytes of a cudaIpcMemHandle_t or cudaIpcEventHandle_t.
using IpcHandleBytes = std::array<uint8_t, kIpcHandleBytes>;

/// 128 lowercase hex digits.
std::string ipc_handle_to_hex(const IpcHandleBytes& handle);
/// Throws InvalidArgument naming `what` for anything but 128 hex digits.
IpcHandleBytes ipc_handle_from_hex(std::string_view text, std::string_view what = "IPC handle");

/// A ring of `slots` fixed-size slots in one device allocation, exported by its owner (a server's
/// receive ring, or its result ring). Slot i is bytes [i * slot_bytes, (i + 1) * slot_bytes) of
/// the allocation. Per slot two interprocess events order producer and consumer on the GPU:
///   ready[i]  recorded by the producer after writing slot i; the consumer's stream waits on it;
///   free[i]   recorded by the consumer after reading slot i; the producer's stream waits on it
///             before writing slot i again.
/// The host side (who may write which slot when) stays with the control plane's credits.
struct DeviceRingDescriptor {
  IpcHandleBytes memory{};  ///< cudaIpcGetMemHandle of the allocation base
  uint64_t slots = 0;
  uint64_t slot_bytes = 0;
  std::vector<IpcHandleBytes> ready;  ///< slots event handles
  std::vector<IpcHandleBytes> free;   ///< slots event handles
};

/// {"memory": hex, "slots": n, "slot_bytes": b, "ready": [hex...], "free": [hex...]}.
nlohmann::json ring_descriptor_to_json(const DeviceRingDescriptor& ring);
/// Strict inverse of ring_descriptor_to_json: throws InvalidArgument naming the field when one is
/// missing, of the wrong type or malformed, when slots or slot_bytes is 0, their product
/// overflows, or an event list does not hold exactly `slots` handles.
DeviceRingDescriptor ring_descriptor_from_json(const nlohmann::json& j);

/// A byte range of another process' device allocation: the allocation's IPC handle (exported at
/// its base, as CUDA requires) and the range's offset from that base. A torch tensor usually sits
/// inside a larger cudaMalloc segment of the caching allocator; this names it.
struct ExportedRegion {
  IpcHandleBytes memory{};
  uint64_t offset = 0;  ///< bytes from the allocation base
  uint64_t bytes = 0;
};

/// {"memory": hex, "offset": o, "bytes": b}.
nlohmann::json region_to_json(const ExportedRegion& region);
/// Strict inverse; throws InvalidArgument naming the field (also when offset + bytes overflows).
ExportedRegion region_from_json(const nlohmann::json& j);

}  // namespace muon::transport
