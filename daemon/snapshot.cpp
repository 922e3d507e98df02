#include "daemon/snapshot.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "transport/messages.hpp"

namespace muon::daemon {
namespace {

using json = nlohmann::json;

// Tensor bytes go to and from disk as they lie in memory; safetensors is little-endian.
static_assert(std::endian::native == std::endian::little, "snapshots assume a little-endian host");

constexpr const char* kFormat = "muon-offload-momentum";
constexpr const char* kVersion = "1";
// safetensors' own limit on the header size; also bounds what a corrupt length makes us allocate.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

std::string os_error(int err) {
  return std::strerror(err);
}

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* data, size_t size, const std::string& tmp) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("snapshot: writing '" + tmp + "' failed: " + os_error(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// Reads exactly `size` bytes at `offset`; false at end of file.
bool pread_all(int fd, void* data, size_t size, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n =
        ::pread(fd, p, std::min<size_t>(size, size_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw InvalidArgument("snapshot '" + path + "': read failed: " + os_error(errno));
    }
    if (n == 0) return false;
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
  return true;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

void write_snapshot(const std::string& path, const std::vector<SnapshotEntry>& entries,
                    const std::vector<NsChoiceTable::Entry>& ns_choices) {
  // Tensors sorted by name (the safetensors convention); the data follows in the same order.
  std::vector<const SnapshotEntry*> sorted;
  for (const auto& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(),
            [](const SnapshotEntry* a, const SnapshotEntry* b) { return a->name < b->name; });

  json header = json::object();
  json meta = {{"format", kFormat}, {"version", kVersion}};
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const auto& e = *sorted[i];
    const std::string who = "snapshot '" + path + "': entry '" + e.name + "'";
    if (e.name.empty() || e.name == "__metadata__") throw InvalidArgument(who + ": invalid name");
    if (i > 0 && sorted[i - 1]->name == e.name) throw InvalidArgument(who + ": duplicate name");
    if (e.shape.size() != 2 && e.shape.size() != 3) {
      throw InvalidArgument(who + ": shape " + shape_str(e.shape) + " is not [r, c] or [b, r, c]");
    }
    int64_t count = 1;
    for (int64_t d : e.shape) {
      if (d <= 0)
        throw InvalidArgument(who + ": shape " + shape_str(e.shape) + " has a zero extent");
      count *= d;
    }
    if (static_cast<size_t>(count) != e.momentum.size()) {
      throw InvalidArgument(who + ": shape " + shape_str(e.shape) + " needs " +
                            std::to_string(count) + " values, momentum holds " +
                            std::to_string(e.momentum.size()));
    }
    const uint64_t bytes = e.momentum.size() * sizeof(float);
    header[e.name] = {
        {"dtype", "F32"}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    meta["step:" + e.name] = std::to_string(e.last_step);
    meta["options:" + e.name] = transport::options_to_json(e.options);
    offset += bytes;
  }
  if (const int64_t s = common_step(entries); s != -2) meta["step"] = std::to_string(s);
  if (!ns_choices.empty()) meta["ns_choices"] = ns_choices_to_json(ns_choices);
  header["__metadata__"] = meta;
  const std::string text = header.dump();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t{text.size()} >> (8 * i));

  // Temporary file in the same folder, fsync, rename over `path`, fsync the folder: the file at
  // `path` is the old one or the complete new one, also across a power loss.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (f.fd < 0) throw Error("snapshot: cannot create '" + tmp + "': " + os_error(errno));
    try {
      write_all(f.fd, len, sizeof(len), tmp);
      write_all(f.fd, text.data(), text.size(), tmp);
      for (const auto* e : sorted) {
        write_all(f.fd, e->momentum.data(), e->momentum.size() * sizeof(float), tmp);
      }
      if (::fsync(f.fd) != 0)
        throw Error("snapshot: fsync of '" + tmp + "' failed: " + os_error(errno));
      const int fd = f.fd;
      f.fd = -1;
      if (::close(fd) != 0)
        throw Error("snapshot: closing '" + tmp + "' failed: " + os_error(errno));
      if (::rename(tmp.c_str(), path.c_str()) != 0) {
        throw Error("snapshot: renaming '" + tmp + "' to '" + path +
                    "' failed: " + os_error(errno));
      }
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  Fd d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd < 0)
    throw Error("snapshot '" + path + "': cannot open folder '" + dir + "': " + os_error(errno));
  if (::fsync(d.fd) != 0) {
    throw Error("snapshot '" + path + "': fsync of folder '" + dir +
                "' failed: " + os_error(errno));
  }
}

std::vector<SnapshotEntry> read_snapshot(const std::string& path,
                                         std::vector<NsChoiceTable::Entry>* ns_choices) {
  const std::string who = "snapshot '" + path + "'";
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw InvalidArgument(who + ": cannot open: " + os_error(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw InvalidArgument(who + ": cannot stat: " + os_error(errno));
  const auto file_size = static_cast<uint64_t>(st.st_size);

  unsigned char len[8];
  if (file_size < sizeof(len) || !pread_all(f.fd, len, sizeof(len), 0, path)) {
    throw InvalidArgument(who + " is truncated: " + std::to_string(file_size) +
                          " bytes, less than the 8-byte header length");
  }
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= uint64_t{len[i]} << (8 * i);
  if (header_size > kMaxHeaderBytes) {
    throw InvalidArgument(who + ": header length " + std::to_string(header_size) +
                          " exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (header_size > file_size - 8) {
    throw InvalidArgument(who + " is truncated: header of " + std::to_string(header_size) +
                          " bytes, but only " + std::to_string(file_size - 8) + " bytes follow");
  }
  std::string text(header_size, '\0');
  if (!pread_all(f.fd, text.data(), text.size(), 8, path)) {
    throw InvalidArgument(who + " is truncated (shrank while reading)");
  }
  const uint64_t data_begin = 8 + header_size, data_size = file_size - data_begin;

  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw InvalidArgument(who + ": header is not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!header.is_object()) throw InvalidArgument(who + ": header is not a JSON object");

  // __metadata__: string values only (safetensors), with our format tag and version.
  auto mit = header.find("__metadata__");
  if (mit == header.end() || !mit->is_object()) {
    throw InvalidArgument(who + ": no __metadata__ with the format tag '" + kFormat + "'");
  }
  const json& meta = *mit;
  auto meta_str = [&](const std::string& key) -> const std::string* {
    auto it = meta.find(key);
    return it != meta.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
  };
  const std::string* format = meta_str("format");
  if (format == nullptr || *format != kFormat) {
    throw InvalidArgument(who + ": missing or wrong format tag (want __metadata__.format = '" +
                          kFormat + "')");
  }
  const std::string* version = meta_str("version");
  if (version == nullptr || *version != kVersion) {
    throw InvalidArgument(who + ": unsupported version '" + (version ? *version : "") +
                          "' (this build reads version " + kVersion + ")");
  }

  std::vector<NsChoiceTable::Entry> choices;
  if (const std::string* text = meta_str("ns_choices")) {
    try {
      choices = ns_choices_from_json(*text);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(who + ": bad ns_choices: " + e.message());
    }
  }

  struct Placed {
    SnapshotEntry entry;
    uint64_t begin, end;
  };
  std::vector<Placed> placed;
  for (auto it = header.begin(); it != header.end(); ++it) {  // sorted by name (std::map)
    if (it.key() == "__metadata__") continue;
    const std::string t = who + ": tensor '" + it.key() + "'";
    const json& v = it.value();
    if (!v.is_object()) throw InvalidArgument(t + " is not a JSON object");
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) throw InvalidArgument(t + " has no dtype");
    if (*dt != "F32") {
      throw InvalidArgument(t + " has dtype '" + dt->get<std::string>() +
                            "'; only F32 is supported");
    }
    Placed p;
    p.entry.name = it.key();
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array() || (sh->size() != 2 && sh->size() != 3)) {
      throw InvalidArgument(t + ": shape must be [r, c] or [b, r, c]");
    }
    uint64_t count = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() <= 0 ||
          d.get<int64_t>() > (int64_t{1} << 40)) {
        throw InvalidArgument(t + ": shape holds an invalid extent " + d.dump());
      }
      p.entry.shape.push_back(d.get<int64_t>());
      count *= static_cast<uint64_t>(d.get<int64_t>());
      if (count > (uint64_t{1} << 40)) throw InvalidArgument(t + ": shape is too large");
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      throw InvalidArgument(t + ": data_offsets must be [begin, end] non-negative integers");
    }
    p.begin = (*off)[0].get<uint64_t>();
    p.end = (*off)[1].get<uint64_t>();
    const std::string offsets = "[" + std::to_string(p.begin) + ", " + std::to_string(p.end) + ")";
    if (p.end < p.begin || p.end - p.begin != count * sizeof(float)) {
      throw InvalidArgument(t + ": data_offsets " + offsets + " do not match shape " +
                            shape_str(p.entry.shape) + " (" +
                            std::to_string(count * sizeof(float)) + " bytes of F32)");
    }
    if (p.end > data_size) {
      throw InvalidArgument(who + " is truncated: tensor '" + it.key() + "' data_offsets " +
                            offsets + " lie past the end of the data (" +
                            std::to_string(data_size) + " bytes)");
    }
    const std::string* step = meta_str("step:" + it.key());
    if (step == nullptr)
      throw InvalidArgument(t + ": missing step (__metadata__ 'step:" + it.key() + "')");
    try {
      size_t used = 0;
      p.entry.last_step = std::stoll(*step, &used);
      if (used != step->size()) throw std::invalid_argument("trailing characters");
    } catch (const std::exception&) {
      throw InvalidArgument(t + ": step '" + *step + "' is not an integer");
    }
    const std::string* options = meta_str("options:" + it.key());
    if (options == nullptr) {
      throw InvalidArgument(t + ": missing options (__metadata__ 'options:" + it.key() + "')");
    }
    try {
      p.entry.options = transport::options_from_json(*options);
    } catch (const Error& e) {
      throw InvalidArgument(t + ": bad options: " + e.message());
    }
    placed.push_back(std::move(p));
  }

  // The data section holds the tensors back to back, without holes or overlaps (as safetensors
  // checks), and nothing after them.
  std::vector<const Placed*> by_offset;
  for (const auto& p : placed) by_offset.push_back(&p);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Placed* a, const Placed* b) { return a->begin < b->begin; });
  uint64_t expect = 0;
  for (const auto* p : by_offset) {
    if (p->begin != expect) {
      throw InvalidArgument(who + ": tensor '" + p->entry.name + "' data_offsets start at " +
                            std::to_string(p->begin) + ", expected " + std::to_string(expect) +
                            " (overlapping or non-contiguous data)");
    }
    expect = p->end;
  }
  if (expect != data_size) {
    throw InvalidArgument(who + ": " + std::to_string(data_size - expect) +
                          " bytes after the last tensor's data");
  }

  std::vector<SnapshotEntry> out;
  out.reserve(placed.size());
  for (auto& p : placed) {
    p.entry.momentum.resize((p.end - p.begin) / sizeof(float));
    if (!pread_all(f.fd, p.entry.momentum.data(), p.end - p.begin, data_begin + p.begin, path)) {
      throw InvalidArgument(who + " is truncated (shrank while reading)");
    }
    out.push_back(std::move(p.entry));
  }
  if (ns_choices != nullptr) *ns_choices = std::move(choices);
  return out;
}

int64_t common_step(const std::vector<SnapshotEntry>& entries) {
  if (entries.empty()) return -2;
  const int64_t s = entries.front().last_step;
  for (const auto& e : entries) {
    if (e.last_step != s) return -2;
  }
  return s;
}

std::string describe_steps(const std::vector<SnapshotEntry>& entries) {
  std::map<int64_t, std::vector<std::string>> by_step;
  for (const auto& e : entries) by_step[e.last_step].push_back(e.name);
  std::vector<std::pair<int64_t, std::vector<std::string>>> order(by_step.begin(), by_step.end());
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  std::string out;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& [step, names] = order[i];
    out += (i ? ", " : "") + std::to_string(names.size()) + (i ? "" : " parameter(s)") +
           " at step " + std::to_string(step) + " (";
    for (size_t k = 0; k < names.size() && k < 3; ++k) out += (k ? ", '" : "'") + names[k] + "'";
    out += names.size() > 3 ? ", ...)" : ")";
  }
  return out;
}

}  // namespace muon::daemon
