#include "tests/soak/server_probe.hpp"

#include <sys/stat.h>

#include "transport/asio.hpp"

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "transport/frame.hpp"
#include "transport/messages.hpp"

namespace muon::soak {

namespace fs = std::filesystem;

std::optional<MemorySample> read_memory(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  if (!f) return std::nullopt;
  MemorySample m;
  bool any = false;
  for (std::string line; std::getline(f, line);) {
    std::istringstream in(line);
    std::string key;
    int64_t kib = 0;
    in >> key >> kib;
    if (key == "VmRSS:") m.vm_rss_kib = kib, any = true;
    if (key == "RssAnon:") m.rss_anon_kib = kib;
    if (key == "RssShmem:") m.rss_shmem_kib = kib;
  }
  if (!any) return std::nullopt;  // a zombie has no VmRSS line
  return m;
}

std::vector<std::string> mapped_segments(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::set<std::string> names;  // a segment maps as one or more lines
  const std::string prefix = "/dev/shm/";
  for (std::string line; std::getline(maps, line);) {
    const auto at = line.find(prefix + "muon-");
    if (at == std::string::npos) continue;
    const auto begin = at + prefix.size();
    names.insert(line.substr(begin, line.find(' ', begin) - begin));
  }
  return {names.begin(), names.end()};
}

std::vector<ShmEntry> list_segments() {
  std::vector<ShmEntry> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind("muon-", 0) != 0) continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0) continue;  // removed meanwhile
    out.push_back({name, static_cast<uint64_t>(st.st_size), static_cast<int64_t>(st.st_ctime)});
  }
  return out;
}

namespace {

// One request on a fresh connection and its first reply of `reply` type (or an error frame),
// within `timeout`. The connection is closed on return. Sets `why` when there is no such reply.
std::optional<transport::Frame> request(const std::string& socket, transport::MessageType type,
                                        const std::string& payload, transport::MessageType reply,
                                        std::chrono::milliseconds timeout, std::string& why) {
  namespace asio = boost::asio;
  using local = asio::local::stream_protocol;
  asio::io_context io;
  local::socket s(io);
  std::optional<transport::Frame> result;
  why = "no answer from " + socket + " within " + std::to_string(timeout.count()) + " ms";
  const auto bytes = transport::encode_frame({static_cast<uint16_t>(type), 1, payload});
  transport::FrameDecoder decoder;
  std::array<std::byte, 65536> buf;
  std::function<void(boost::system::error_code, size_t)> on_read = [&](boost::system::error_code ec,
                                                                       size_t n) {
    if (ec) {
      why = "read failed: " + ec.message();
      return;
    }
    decoder.feed(buf.data(), n);
    while (auto f = decoder.next()) {
      if (f->type == static_cast<uint16_t>(reply)) {
        result = std::move(f);
        return;
      }
      if (f->type == static_cast<uint16_t>(transport::MessageType::error)) {
        why = "error: " + f->payload;
        return;
      }
    }
    s.async_read_some(asio::buffer(buf), on_read);
  };
  s.async_connect(local::endpoint(socket), [&](boost::system::error_code ec) {
    if (ec) {
      why = "cannot connect to " + socket + ": " + ec.message();
      return;
    }
    asio::async_write(s, asio::buffer(bytes), [&](boost::system::error_code wec, size_t) {
      if (wec) {
        why = "write failed: " + wec.message();
        return;
      }
      s.async_read_some(asio::buffer(buf), on_read);
    });
  });
  io.run_for(timeout);
  return result;
}

}  // namespace

std::string server_status(const std::string& socket, std::chrono::milliseconds timeout) {
  std::string why;
  auto f = request(socket, transport::MessageType::status, "{}", transport::MessageType::status_ok,
                   timeout, why);
  return f ? f->payload : "no status: " + why;
}

std::string abandoned_hello(const std::string& socket, int rank, int world,
                            std::chrono::milliseconds timeout) {
  std::string why;
  transport::Hello hello;
  hello.rank = rank;
  hello.world_size = world;
  hello.client = "soak: hello, then gone";
  auto f = request(socket, transport::MessageType::hello, transport::encode(hello),
                   transport::MessageType::hello_ok, timeout, why);
  if (!f) throw std::runtime_error("hello as rank " + std::to_string(rank) + ": " + why);
  auto name = transport::decode<transport::HelloOk>(f->payload).shm_name;
  if (!name.empty() && name.front() == '/') name.erase(0, 1);  // as /dev/shm lists it
  return name;
}

}  // namespace muon::soak
