// NcclComm's threading contract, without a GPU (gpu-review F3, F4): NCCL is stood in for by
// functions (transport::NcclCalls) that take a little time inside each call and record two calls
// overlapping (NCCL allows one thread at a time across the communicators of one device) and any
// call on a communicator after its ncclCommAbort (the use-after-free of F3). Also run under
// ThreadSanitizer (scripts/sanitize.sh tsan with CUDA on, see tests/transport/CMakeLists.txt).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "transport/nccl_comm.hpp"

namespace {

using namespace std::chrono_literals;
using muon::transport::NcclCalls;
using muon::transport::NcclComm;
using muon::transport::RecvTile;
using muon::transport::SendTile;

struct FakeComm {
  std::atomic<bool> aborted{false};
  std::atomic<int> pending{0};  // polls of ncclCommGetAsyncError left before "done"
};

// What the stand-in saw. Plain globals: NcclCalls holds function pointers.
struct Seen {
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> used_after_abort{0};
  std::atomic<int> calls{0};
  std::atomic<int> aborts{0};
  std::atomic<bool> stream_busy{false};
  std::mutex comms_mu;
  std::deque<FakeComm> comms;  // kept until the test ends: an aborted one must stay readable
} g;

thread_local FakeComm* t_group_comm = nullptr;  // the communicator of this thread's open group

// One NCCL call in progress (RAII), on `c` when given.
struct Inside {
  explicit Inside(FakeComm* c) {
    g.calls++;
    if (g.inside.fetch_add(1) > 0) g.overlaps++;
    if (c != nullptr && c->aborted) g.used_after_abort++;
    std::this_thread::sleep_for(20us);  // widens the window two unlocked calls would share
  }
  ~Inside() { g.inside--; }
};

FakeComm* as_fake(ncclComm_t c) {
  return reinterpret_cast<FakeComm*>(c);
}

ncclResult_t fake_init(ncclComm_t* comm, int, ncclUniqueId, int, ncclConfig_t*) {
  Inside in(nullptr);
  std::lock_guard<std::mutex> l(g.comms_mu);
  FakeComm& c = g.comms.emplace_back();
  c.pending = 3;
  *comm = reinterpret_cast<ncclComm_t>(&c);
  return ncclInProgress;
}
ncclResult_t fake_async_error(ncclComm_t comm, ncclResult_t* state) {
  Inside in(as_fake(comm));
  *state = as_fake(comm)->pending.fetch_sub(1) > 0 ? ncclInProgress : ncclSuccess;
  return ncclSuccess;
}
ncclResult_t fake_group_start() {
  Inside in(nullptr);
  return ncclSuccess;
}
ncclResult_t fake_group_end() {
  Inside in(t_group_comm);
  if (t_group_comm != nullptr) t_group_comm->pending = 2;
  t_group_comm = nullptr;
  return ncclInProgress;
}
ncclResult_t fake_send(const void*, size_t, ncclDataType_t, int, ncclComm_t comm, cudaStream_t) {
  Inside in(as_fake(comm));
  t_group_comm = as_fake(comm);
  return ncclSuccess;
}
ncclResult_t fake_recv(void*, size_t, ncclDataType_t, int, ncclComm_t comm, cudaStream_t) {
  Inside in(as_fake(comm));
  t_group_comm = as_fake(comm);
  return ncclSuccess;
}
ncclResult_t fake_finalize(ncclComm_t comm) {
  Inside in(as_fake(comm));
  as_fake(comm)->pending = 1;
  return ncclInProgress;
}
ncclResult_t fake_destroy(ncclComm_t comm) {
  Inside in(as_fake(comm));
  as_fake(comm)->aborted = true;  // gone: any later call is a use after free
  return ncclSuccess;
}
ncclResult_t fake_abort(ncclComm_t comm) {
  Inside in(as_fake(comm));
  as_fake(comm)->aborted = true;
  g.aborts++;
  return ncclSuccess;
}
const char* fake_error_string(ncclResult_t) {
  return "fake NCCL error";
}
cudaError_t fake_get_device(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t fake_stream_query(cudaStream_t) {
  thread_local int polls = 0;
  if (g.stream_busy) return cudaErrorNotReady;
  return ++polls % 3 != 0 ? cudaErrorNotReady : cudaSuccess;  // transfers take a few polls
}

const NcclCalls kFake{fake_init,     fake_async_error, fake_group_start,  fake_group_end,
                      fake_send,     fake_recv,        fake_finalize,     fake_destroy,
                      fake_abort,    fake_error_string, fake_get_device,  fake_stream_query};

class NcclCommThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    g.overlaps = 0;
    g.used_after_abort = 0;
    g.calls = 0;
    g.aborts = 0;
    g.stream_busy = false;
  }
};

muon::transport::NcclIdBytes id() {
  return {};
}

// One exchange of a send and a receive tile, then a wait for its stream.
void round_trip(NcclComm& comm) {
  float buf[4] = {};
  const SendTile out{buf, 4, muon::DType::f32};
  const RecvTile in{buf, 4, muon::DType::f32};
  comm.exchange(1, {&out, 1}, {&in, 1}, nullptr);
  comm.wait(nullptr, 10s);
}

}  // namespace

TEST_F(NcclCommThreads, CallsOnCommunicatorsOfOneDeviceNeverOverlap) {
  std::vector<std::unique_ptr<NcclComm>> comms;
  for (int i = 0; i < 3; ++i) comms.push_back(std::make_unique<NcclComm>(id(), 2, 0, 10s, kFake));
  std::vector<std::thread> threads;
  for (auto& c : comms) {
    threads.emplace_back([&comm = *c] {
      for (int i = 0; i < 100; ++i) round_trip(comm);
    });
  }
  for (auto& t : threads) t.join();
  comms.clear();  // finalize + destroy, each under the device lock too
  EXPECT_GT(g.calls.load(), 3 * 100 * 5);
  EXPECT_EQ(g.overlaps.load(), 0);
  EXPECT_EQ(g.used_after_abort.load(), 0);
  EXPECT_EQ(g.aborts.load(), 0);  // healthy communicators are finalized, not aborted
}

TEST_F(NcclCommThreads, AbortDuringAWaitEndsItAndNothingTouchesTheAbortedCommunicator) {
  NcclComm comm(id(), 2, 0, 10s, kFake);
  g.stream_busy = true;  // transfers that never finish: a peer that is gone
  std::string what;
  std::chrono::duration<double> waited{};
  std::thread waiter([&] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comm.wait(nullptr, 60s);
    } catch (const muon::DeviceError& e) {
      what = e.what();
    }
    waited = std::chrono::steady_clock::now() - t0;
  });
  std::this_thread::sleep_for(20ms);
  comm.abort();
  comm.abort();  // idempotent
  waiter.join();
  EXPECT_NE(what.find("aborted"), std::string::npos) << what;
  EXPECT_LT(waited.count(), 5.0);
  EXPECT_EQ(g.aborts.load(), 1);
  EXPECT_THROW(round_trip(comm), muon::DeviceError);
  EXPECT_EQ(g.used_after_abort.load(), 0);
  EXPECT_EQ(g.overlaps.load(), 0);
}

TEST_F(NcclCommThreads, AbortRacingExchangesFromOtherThreadsIsSafe) {
  for (int round = 0; round < 20; ++round) {
    NcclComm victim(id(), 2, 0, 10s, kFake);
    NcclComm bystander(id(), 2, 0, 10s, kFake);
    std::atomic<bool> stop{false};
    std::atomic<int> victim_errors{0};
    // The pusher runs until the abort reaches it: its next call after the abort must throw,
    // however late the scheduler lets it run (no stop flag, so a loaded machine cannot skip it).
    std::thread pusher([&] {
      for (;;) {
        try {
          round_trip(victim);
        } catch (const muon::DeviceError&) {
          victim_errors++;
          return;
        }
      }
    });
    std::thread other([&] {
      while (!stop) round_trip(bystander);  // another communicator of the device keeps working
    });
    std::this_thread::sleep_for(std::chrono::microseconds(200 * round));
    victim.abort();
    std::this_thread::sleep_for(2ms);
    stop = true;
    pusher.join();
    other.join();
    EXPECT_EQ(victim_errors.load(), 1) << "round " << round;
  }
  EXPECT_EQ(g.used_after_abort.load(), 0);
  EXPECT_EQ(g.overlaps.load(), 0);
  EXPECT_EQ(g.aborts.load(), 20);
}

TEST_F(NcclCommThreads, AWaitPastItsDeadlineAbortsAndSaysSo) {
  NcclComm comm(id(), 2, 0, 10s, kFake);
  g.stream_busy = true;
  try {
    comm.wait(nullptr, 50ms);
    FAIL() << "the wait returned";
  } catch (const muon::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("did not finish within 50 ms"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(g.aborts.load(), 1);
}

TEST(NcclDeviceMutex, OnePerDevice) {
  EXPECT_EQ(&muon::transport::nccl_device_mutex(0), &muon::transport::nccl_device_mutex(0));
  EXPECT_NE(&muon::transport::nccl_device_mutex(0), &muon::transport::nccl_device_mutex(1));
}
