#include "transport/nccl_client_comms.hpp"

#include <cuda_runtime_api.h>

#include <optional>
#include <utility>

#include "core/cuda_check.hpp"
#include "kernels/device_event.hpp"
#include "transport/nccl_comm.hpp"

namespace muon::transport {

namespace {

// cudaMalloc'd bytes, freed with the object.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n > 0) MUON_CUDA_CHECK(cudaMalloc(&data, n));
  }
  ~DeviceBuffer() {
    if (data) MUON_CUDA_CHECK_NOTHROW(cudaFree(data));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  size_t bytes = 0;
  void* data = nullptr;
};

int current_device() {
  int d = 0;
  MUON_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

}  // namespace

struct NcclClientComms::Impl {
  Impl(const transport::NcclIdBytes& tx_id, const transport::NcclIdBytes& rx_id,
       uint64_t slot_bytes, std::chrono::milliseconds timeout)
      : device(current_device()),
        tx_stage(slot_bytes),
        rx_stage(slot_bytes),
        tx(tx_id, 2, 1, timeout),  // the server joins tx first, then rx: same order here
        rx(rx_id, 2, 1, timeout) {}
  size_t check_fits(size_t count, transport::DType dtype, const char* what) const {
    const size_t bytes = count * transport::dtype_bytes(dtype);
    if (bytes > tx_stage.bytes) {
      throw InvalidArgument(std::string("nccl data plane: ") + what + " of " +
                            std::to_string(bytes) + " bytes is larger than a slot (" +
                            std::to_string(tx_stage.bytes) + " bytes)");
    }
    return bytes;
  }
  int device;
  DeviceBuffer tx_stage, rx_stage;  // host pushes; momentum and chunks this client does not keep
  DeviceStream push_stream;         // every send (device and host sources)
  DeviceStream reader_stream;
  OwnedEvent produced;         // the caller's stream at a send (sends are serialized)
  transport::NcclComm tx, rx;  // declared last: finalized before the streams and buffers go
};

NcclClientComms::NcclClientComms(const transport::NcclIdBytes& tx_id, const transport::NcclIdBytes& rx_id,
                     uint64_t slot_bytes, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>(tx_id, rx_id, slot_bytes, timeout)) {
  // Connect both communicators now, as the server does right after its join: a communicator's
  // first transfer sets up the connection and cannot return before the peer made its call.
  // (The server posts its receive of a push only when the push frame arrives, and its send of
  // an update before our reader posts the receive; neither may be a first transfer.)
  auto& i = *impl_;
  const transport::SendTile out{i.tx_stage.data, 1, DType::f32};
  const transport::RecvTile in{i.rx_stage.data, 1, DType::f32};
  i.tx.send(0, {&out, 1}, i.push_stream.get());
  i.rx.recv(0, {&in, 1}, i.reader_stream.get());
  i.tx.wait(i.push_stream.get(), timeout);
  i.rx.wait(i.reader_stream.get(), timeout);
}

void NcclClientComms::abort() noexcept {
  impl_->tx.abort();
  impl_->rx.abort();
}

NcclClientComms::~NcclClientComms() {
  synchronize();
}

int NcclClientComms::device() const {
  return impl_->device;
}

void NcclClientComms::send(const void* device_src, size_t count, transport::DType dtype,
                     StreamHandle stream) {
  const auto push = impl_->push_stream.get();
  if (stream != push) {  // the source is ready once `stream` passed this point
    MUON_CUDA_CHECK(cudaEventRecord(impl_->produced.e, static_cast<cudaStream_t>(stream)));
    MUON_CUDA_CHECK(cudaStreamWaitEvent(push, impl_->produced.e, 0));
  }
  const transport::SendTile tile{device_src, count, dtype};
  impl_->tx.send(0, {&tile, 1}, push);
}

StreamHandle NcclClientComms::push_stream() const {
  return impl_->push_stream.get();
}

void NcclClientComms::send_host(const void* host_src, size_t count, transport::DType dtype) {
  const size_t bytes = impl_->check_fits(count, dtype, "a host push");
  const auto stream = impl_->push_stream.get();
  if (bytes > 0) {
    MUON_CUDA_CHECK(
        cudaMemcpyAsync(impl_->tx_stage.data, host_src, bytes, cudaMemcpyHostToDevice, stream));
  }
  send(impl_->tx_stage.data, count, dtype, stream);
  // The staging buffer is reused by the next push, and the caller may reuse host_src.
  impl_->tx.wait(stream, std::chrono::minutes(10));
}

void NcclClientComms::enter_reader_thread() {
  MUON_CUDA_CHECK(cudaSetDevice(impl_->device));
}

StreamHandle NcclClientComms::reader_stream() const {
  return impl_->reader_stream.get();
}

void NcclClientComms::recv(void* device_dst, size_t count, transport::DType dtype) {
  const transport::RecvTile tile{device_dst, count, dtype};
  impl_->rx.recv(0, {&tile, 1}, impl_->reader_stream.get());
}

void NcclClientComms::recv_to_host(void* host_dst, size_t count, transport::DType dtype) {
  const size_t bytes = impl_->check_fits(count, dtype, "a received chunk");
  const auto stream = impl_->reader_stream.get();
  recv(impl_->rx_stage.data, count, dtype);
  if (bytes > 0) {
    MUON_CUDA_CHECK(
        cudaMemcpyAsync(host_dst, impl_->rx_stage.data, bytes, cudaMemcpyDeviceToHost, stream));
  }
  impl_->rx.wait(stream, std::chrono::minutes(10));
}

void NcclClientComms::discard(size_t count, transport::DType dtype) {
  impl_->check_fits(count, dtype, "a received chunk");
  // Stream-ordered after the previous receive into the staging buffer: no wait needed.
  recv(impl_->rx_stage.data, count, dtype);
}

void NcclClientComms::synchronize(std::chrono::milliseconds timeout) noexcept {
  MUON_CUDA_CHECK_NOTHROW(cudaSetDevice(impl_->device));
  // Each wait watches its communicator and aborts it on an error or at the deadline (or throws at
  // once when it was aborted before); either way its NCCL kernels then return (gpu-review F6).
  for (auto [comm, stream] : {std::pair{&impl_->rx, impl_->reader_stream.get()},
                              std::pair{&impl_->tx, impl_->push_stream.get()}}) {
    if (comm->aborted()) continue;  // its transfers returned; nothing to watch
    try {
      comm->wait(stream, timeout);
    } catch (const std::exception& e) {
      abort();
      detail::report_failed_call("NcclClientComms::synchronize", e.what(), __FILE__, __LINE__);
    }
  }
  MUON_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(impl_->reader_stream.get()));
  MUON_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(impl_->push_stream.get()));
}

}  // namespace muon::transport
