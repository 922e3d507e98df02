// A PeerLink's nccl plane: the session's two communicators as the client end of an nccl session
// (transport/nccl_client_comms.hpp) on this server's GPU. Joining, staging a host chunk into
// device memory and waiting for a transfer block, so they run on a thread of the plane's own, in
// call order (NCCL's transfers of a communicator must be posted in the peer's order), and each
// completion is posted back to the link's strand: the io thread never waits for the peer or the
// device. The thread is joined by the destructor (after abort(): a peer that is gone never
// finishes its side).
#include <condition_variable>
#include <cuda_runtime_api.h>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "core/cuda_check.hpp"
#include "daemon/pool/link_plane.hpp"
#include "transport/nccl_client_comms.hpp"

namespace muon::daemon {

namespace {

class NcclLinkPlane final : public LinkPlane {
 public:
  NcclLinkPlane(const transport::HelloOk& ok, int device, std::chrono::milliseconds timeout,
                LinkPost post)
      : post_(std::move(post)) {
    const auto tx = *ok.nccl_tx_id;
    const auto rx = *ok.nccl_rx_id;
    const uint64_t slot_bytes = ok.slot_bytes;
    // The join is the first task: transfers queued meanwhile wait behind it.
    run([this, tx, rx, slot_bytes, device, timeout] {
      MUON_CUDA_CHECK(cudaSetDevice(device));
      auto comms = std::make_unique<transport::NcclClientComms>(tx, rx, slot_bytes, timeout);
      std::lock_guard lk(mu_);
      comms_ = std::move(comms);
      if (aborted_) comms_->abort();
    });
    thread_ = std::thread([this] { loop(); });
  }

  ~NcclLinkPlane() override {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  bool sends_after_frame() const override { return true; }
  void fill_slot(uint32_t, const std::byte*, size_t) override {
    throw InvalidArgument("the nccl plane of a peer link sends after the frame, into no slot");
  }
  void send(const std::byte* src, size_t bytes, transport::DType dtype,
            TransferDone done) override {
    queue([this, src, bytes, dtype] { comms().send_host(src, bytes / dtype_bytes(dtype), dtype); },
          std::move(done));
  }
  void receive(uint32_t, std::byte* dst, size_t bytes, transport::DType dtype,
               TransferDone done) override {
    queue(
        [this, dst, bytes, dtype] {
          const size_t count = bytes / dtype_bytes(dtype);
          if (dst) comms().recv_to_host(dst, count, dtype);
          else comms().discard(count, dtype);
        },
        std::move(done));
  }
  void abort() noexcept override {
    std::lock_guard lk(mu_);
    aborted_ = true;
    if (comms_) comms_->abort();
  }

 private:
  transport::NcclClientComms& comms() {
    std::lock_guard lk(mu_);
    if (!join_error_.empty()) throw DeviceError("joining the peer's NCCL session: " + join_error_);
    if (aborted_ || !comms_) throw DeviceError("the nccl link to the peer server was aborted");
    return *comms_;
  }
  // A task and the completion posted after it: "" or what it threw.
  void queue(std::function<void()> work, TransferDone done) {
    run([this, work = std::move(work), done = std::move(done)] {
      std::string error;
      try {
        work();
      } catch (const std::exception& e) {
        error = e.what();
      }
      post_([done, error] { done(error); });
    });
  }
  void run(std::function<void()> task) {
    {
      std::lock_guard lk(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) break;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      try {
        task();
      } catch (const std::exception& e) {  // the join: the transfers behind it fail with it
        std::lock_guard lk(mu_);
        join_error_ = e.what();
      }
    }
    std::unique_ptr<transport::NcclClientComms> comms;
    {
      std::lock_guard lk(mu_);
      comms = std::move(comms_);
    }
    comms.reset();  // waits for its streams with a deadline (aborted first when the peer left)
  }

  LinkPost post_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  bool aborted_ = false;
  std::string join_error_;  // why the join failed ("" joined, or not yet)
  std::unique_ptr<transport::NcclClientComms> comms_;  // made on the thread by the join
  std::thread thread_;  // last: started once the members it uses exist
};

}  // namespace

std::unique_ptr<LinkPlane> make_nccl_link_plane(const transport::HelloOk& ok, int device,
                                                std::chrono::milliseconds timeout,
                                                LinkPost post) {
  return std::make_unique<NcclLinkPlane>(ok, device, timeout, std::move(post));
}

}  // namespace muon::daemon
