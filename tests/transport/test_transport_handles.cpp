// The host side of the GPU transports, on the CPU: handle bytes as hex (CUDA IPC handles, NCCL
// unique ids), the JSON forms of device rings and exported regions, and the IPC handle cache's
// open-once logic with an in-process opener that counts its calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "transport/cuda_ipc_cache.hpp"
#include "transport/cuda_ipc_handle.hpp"
#include "transport/hex_bytes.hpp"
#include "transport/nccl_id.hpp"

using namespace muon;
using namespace muon::transport;

// `text` contains `part`.
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

namespace {

IpcHandleBytes handle(uint8_t seed) {
  IpcHandleBytes h;
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return h;
}

// Runs `f`, expecting InvalidArgument whose message contains `part`.
template <class F>
void expect_invalid(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown (expected: " << part << ")";
  } catch (const InvalidArgument& e) {
    EXPECT_CONTAINS(e.what(), part);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

DeviceRingDescriptor ring(uint64_t slots) {
  DeviceRingDescriptor r;
  r.memory = handle(1);
  r.slots = slots;
  r.slot_bytes = 1 << 20;
  for (uint64_t i = 0; i < slots; ++i) {
    r.ready.push_back(handle(static_cast<uint8_t>(10 + i)));
    r.free.push_back(handle(static_cast<uint8_t>(100 + i)));
  }
  return r;
}

// An opener that hands out fake addresses and records every call.
struct Calls {
  std::mutex mutex;
  std::vector<std::string> log;  // "open <first byte>", "close <address>"
  int opens = 0;
  bool fail_next = false;
};

class CountingOpener final : public IpcOpener {
 public:
  explicit CountingOpener(Calls& calls) : calls_(calls) {}
  void* open(const IpcHandleBytes& h) override {
    std::lock_guard lock(calls_.mutex);
    if (calls_.fail_next) {
      calls_.fail_next = false;
      throw DeviceError("fake open failure");
    }
    ++calls_.opens;
    calls_.log.push_back("open " + std::to_string(h[0]));
    return reinterpret_cast<void*>(uintptr_t{0x10000} * (h[0] + 1));
  }
  void close(void* base) noexcept override {
    std::lock_guard lock(calls_.mutex);
    calls_.log.push_back("close " + std::to_string(reinterpret_cast<uintptr_t>(base)));
  }

 private:
  Calls& calls_;
};

}  // namespace

// ---- hex --------------------------------------------------------------------------------------

TEST(HexBytes, RoundTripsEveryByteValue) {
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  const std::string text = to_hex(all);
  ASSERT_EQ(text.size(), 512u);
  EXPECT_EQ(text.substr(0, 8), "00010203");
  EXPECT_EQ(text.substr(504), "fcfdfeff");
  std::vector<uint8_t> back(256);
  from_hex(text, back, "all bytes");
  EXPECT_EQ(back, all);
  std::string upper = text;
  std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
  std::vector<uint8_t> from_upper(256);
  from_hex(upper, from_upper, "upper case");
  EXPECT_EQ(from_upper, all);
}

TEST(IpcHandleHex, RoundTripsAndRejectsMalformedText) {
  const IpcHandleBytes h = handle(3);
  const std::string text = ipc_handle_to_hex(h);
  EXPECT_EQ(text.size(), 128u);
  EXPECT_EQ(ipc_handle_from_hex(text), h);
  expect_invalid([&] { ipc_handle_from_hex(text.substr(1)); }, "expected 128 hex digits");
  expect_invalid([&] { ipc_handle_from_hex(text + "00"); }, "got 130 characters");
  expect_invalid([&] { ipc_handle_from_hex(""); }, "IPC handle");
  std::string bad = text;
  bad[17] = 'g';
  expect_invalid([&] { ipc_handle_from_hex(bad, "ring memory"); },
                 "ring memory: character 17 is not a hex digit");
  bad[17] = ' ';
  expect_invalid([&] { ipc_handle_from_hex(bad); }, "character 17");
}

TEST(NcclIdHex, RoundTripsAndRejectsMalformedText) {
  NcclIdBytes id;
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(255 - i);
  const std::string text = nccl_id_to_hex(id);
  EXPECT_EQ(text.size(), 256u);
  EXPECT_EQ(nccl_id_from_hex(text), id);
  expect_invalid([&] { nccl_id_from_hex(text.substr(0, 128)); }, "NCCL unique id");
  expect_invalid([&] { nccl_id_from_hex(text.substr(0, 255) + "x"); }, "character 255");
}

// ---- descriptors ------------------------------------------------------------------------------

TEST(DeviceRingDescriptorJson, RoundTrips) {
  const auto r = ring(3);
  const nlohmann::json j = ring_descriptor_to_json(r);
  EXPECT_EQ(j.at("slots"), 3);
  EXPECT_EQ(j.at("memory"), ipc_handle_to_hex(r.memory));
  // Through text, as on the wire.
  const auto back = ring_descriptor_from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.memory, r.memory);
  EXPECT_EQ(back.slots, 3u);
  EXPECT_EQ(back.slot_bytes, r.slot_bytes);
  EXPECT_EQ(back.ready, r.ready);
  EXPECT_EQ(back.free, r.free);
}

TEST(DeviceRingDescriptorJson, RejectsMalformedFieldsByName) {
  const nlohmann::json good = ring_descriptor_to_json(ring(2));
  auto with = [&](const char* key, nlohmann::json v) {
    auto j = good;
    j[key] = std::move(v);
    return j;
  };
  auto without = [&](const char* key) {
    auto j = good;
    j.erase(key);
    return j;
  };
  expect_invalid([&] { ring_descriptor_from_json(nlohmann::json::array()); }, "not a JSON object");
  expect_invalid([&] { ring_descriptor_from_json(without("memory")); }, "'memory' missing");
  expect_invalid([&] { ring_descriptor_from_json(with("memory", 5)); }, "memory must be a hex");
  expect_invalid([&] { ring_descriptor_from_json(with("memory", "abc")); }, "device ring: memory");
  expect_invalid([&] { ring_descriptor_from_json(with("slots", -1)); }, "'slots' must be");
  expect_invalid([&] { ring_descriptor_from_json(with("slots", "2")); }, "'slots' must be");
  expect_invalid([&] { ring_descriptor_from_json(with("slots", 0)); }, "must be positive");
  expect_invalid([&] { ring_descriptor_from_json(with("slots", 3)); }, "must list 3 event");
  expect_invalid([&] { ring_descriptor_from_json(with("slot_bytes", uint64_t{1} << 63)); },
                 "overflows");
  expect_invalid([&] { ring_descriptor_from_json(without("free")); }, "'free' missing");
  auto bad_event = good;
  bad_event["ready"][1] = std::string(128, 'z');
  expect_invalid([&] { ring_descriptor_from_json(bad_event); }, "ready[1]");
}

TEST(ExportedRegionJson, RoundTripsAndRejectsMalformedFields) {
  const ExportedRegion r{handle(9), 5 * 1024 * 1024 + 256, 1 << 20};
  const auto back = region_from_json(nlohmann::json::parse(region_to_json(r).dump()));
  EXPECT_EQ(back.memory, r.memory);
  EXPECT_EQ(back.offset, r.offset);
  EXPECT_EQ(back.bytes, r.bytes);
  auto j = region_to_json(r);
  j["offset"] = UINT64_MAX;
  expect_invalid([&] { region_from_json(j); }, "overflows");
  j = region_to_json(r);
  j.erase("bytes");
  expect_invalid([&] { region_from_json(j); }, "exported region: field 'bytes' missing");
  j = region_to_json(r);
  j["offset"] = 1.5;
  expect_invalid([&] { region_from_json(j); }, "'offset' must be a non-negative integer");
}

// ---- the handle cache -------------------------------------------------------------------------

TEST(IpcHandleCache, OpensEachHandleOnceAndClosesEverythingLatestFirst) {
  Calls calls;
  {
    IpcHandleCache cache(std::make_unique<CountingOpener>(calls));
    void* a = cache.open(handle(1));
    EXPECT_EQ(cache.open(handle(1)), a);  // cached: no second open
    void* b = cache.open(handle(2));
    EXPECT_NE(a, b);
    EXPECT_EQ(cache.open(handle(2)), b);
    EXPECT_EQ(calls.opens, 2);
    EXPECT_EQ(cache.size(), 2u);
    cache.open(handle(3));
    EXPECT_EQ(calls.opens, 3);
  }
  const auto addr = [](uint8_t seed) {
    return std::to_string(uintptr_t{0x10000} * (handle(seed)[0] + 1));
  };
  const std::vector<std::string> expected = {"open " + std::to_string(handle(1)[0]),
                                             "open " + std::to_string(handle(2)[0]),
                                             "open " + std::to_string(handle(3)[0]),
                                             "close " + addr(3),
                                             "close " + addr(2),
                                             "close " + addr(1)};
  EXPECT_EQ(calls.log, expected);
}

TEST(IpcHandleCache, CloseUnmapsOnceAndAReopenOpensAgain) {
  Calls calls;
  IpcHandleCache cache(std::make_unique<CountingOpener>(calls));
  cache.open(handle(4));
  EXPECT_TRUE(cache.close(handle(4)));
  EXPECT_FALSE(cache.close(handle(4)));
  EXPECT_FALSE(cache.close(handle(5)));  // never opened
  EXPECT_EQ(cache.size(), 0u);
  cache.open(handle(4));
  EXPECT_EQ(calls.opens, 2);
  EXPECT_EQ(std::count_if(calls.log.begin(), calls.log.end(),
                          [](const std::string& s) { return s.rfind("close", 0) == 0; }),
            1);
}

TEST(IpcHandleCache, AFailedOpenCachesNothing) {
  Calls calls;
  IpcHandleCache cache(std::make_unique<CountingOpener>(calls));
  calls.fail_next = true;
  EXPECT_THROW(cache.open(handle(6)), DeviceError);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_NE(cache.open(handle(6)), nullptr);  // the next attempt opens
  EXPECT_EQ(calls.opens, 1);
}

TEST(IpcHandleCache, ConcurrentFirstUseOpensOnce) {
  Calls calls;
  IpcHandleCache cache(std::make_unique<CountingOpener>(calls));
  std::vector<std::thread> threads;
  std::atomic<int> same{0};
  void* expected = reinterpret_cast<void*>(uintptr_t{0x10000} * (handle(7)[0] + 1));
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < 100; ++k) {
        if (cache.open(handle(7)) == expected) same.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(same.load(), 800);
  EXPECT_EQ(calls.opens, 1);
}

TEST(IpcHandleCache, NeedsAnOpener) {
  EXPECT_THROW(IpcHandleCache(nullptr), InvalidArgument);
}
