#include "plan/gpu_model.hpp"

#include <algorithm>
#include <cctype>

#include "core/error.hpp"

namespace muon::plan {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// The bonded link count of a GPU's NVSwitch peers (0 when it has none).
int switch_links(const topology::Gpu& g) {
  if (!g.nvswitch) return 0;
  int links = 0;
  for (auto [peer, n] : g.nvlink_peers) links = std::max(links, n);
  return links;
}

}  // namespace

const std::vector<GpuModel>& known_gpu_models() {
  static const std::vector<GpuModel> models = {
      {"a100", "A100 SXM4", 312e12, 19.5e12, 80e9},
      {"h100", "H100 SXM5", 989e12, 67e12, 80e9},
      {"h100_pcie", "H100 PCIe", 756e12, 51e12, 80e9},
      {"h200", "H200 SXM", 989e12, 67e12, 141e9},
      {"b200", "B200 (HGX)", 2250e12, 75e12, 180e9},
      {"gb200", "GB200 (NVL72)", 2500e12, 80e12, 186e9},
  };
  return models;
}

const GpuModel& find_gpu_model(std::string_view key) {
  std::string k = lower(key);
  std::replace(k.begin(), k.end(), '-', '_');
  if (k == "h100_sxm" || k == "h100_sxm5") k = "h100";
  if (k == "a100_sxm" || k == "a100_sxm4") k = "a100";
  std::string known;
  for (const auto& m : known_gpu_models()) {
    if (m.key == k) return m;
    known += (known.empty() ? "" : ", ") + m.key;
  }
  throw InvalidArgument("unknown GPU model '" + std::string(key) + "' (known: " + known + ")");
}

const GpuModel* gpu_model_for_name(std::string_view device_name) {
  const std::string n = lower(device_name);
  // Most specific first: "GB200" contains "B200", "H100 PCIe" contains "H100".
  const char* key = nullptr;
  if (contains(n, "gb200")) {
    key = "gb200";
  } else if (contains(n, "b200")) {
    key = "b200";
  } else if (contains(n, "h200")) {
    key = "h200";
  } else if (contains(n, "h100") && contains(n, "pcie")) {
    key = "h100_pcie";
  } else if (contains(n, "h100")) {
    key = "h100";
  } else if (contains(n, "a100")) {
    key = "a100";
  }
  return key != nullptr ? &find_gpu_model(key) : nullptr;
}

const char* gpu_model_source_name(GpuModelSource source) {
  switch (source) {
    case GpuModelSource::flag:
      return "flag";
    case GpuModelSource::topology:
      return "topology";
    case GpuModelSource::links:
      return "links";
    case GpuModelSource::assumed:
      return "assumed";
  }
  return "?";
}

GpuIdentity identify_gpus(const topology::Machine& machine, std::string_view flag) {
  GpuIdentity id;
  if (!flag.empty()) {
    id.model = find_gpu_model(flag);
    id.source = GpuModelSource::flag;
    id.how = "--gpu-model " + std::string(flag);
  } else {
    // The names the topology gives (JSON "model", NVML's device name).
    std::string named;
    for (const auto& g : machine.gpus) {
      if (g.model.empty()) continue;
      if (named.empty()) {
        named = g.model;
      } else if (g.model != named) {
        throw InvalidArgument("the topology lists GPUs of different models ('" + named + "' and '" +
                              g.model + "'): plan one kind at a time, or pass --gpu-model");
      }
    }
    const GpuModel* by_name = named.empty() ? nullptr : gpu_model_for_name(named);
    const topology::Gpu* first = machine.gpus.empty() ? nullptr : &machine.gpus.front();
    const int links = first != nullptr ? switch_links(*first) : 0;
    if (by_name != nullptr) {
      id.model = *by_name;
      id.source = GpuModelSource::topology;
      id.how = "topology: " + named;
    } else if (first != nullptr && !first->fabric_cluster.empty()) {
      id.model = find_gpu_model("gb200");
      id.source = GpuModelSource::links;
      id.how = "implied by the NVLink fabric clique (GB200 NVL72)";
    } else if (links == 12) {
      id.model = find_gpu_model("a100");
      id.source = GpuModelSource::links;
      id.how = "implied by NV12 NVSwitch links; an A100 40 GB needs --gpu-memory-gb 40";
    } else if (links == 18) {
      id.model = find_gpu_model("h100");
      id.source = GpuModelSource::links;
      id.how =
          "implied by NV18 NVSwitch links; H200 and B200 show NV18 too: --gpu-model "
          "h200|b200";
    } else {
      id.model = find_gpu_model("h100");
      id.source = GpuModelSource::assumed;
      id.how = named.empty() ? "assumed: the topology does not say (--gpu-model)"
                             : "assumed: '" + named + "' is not a known model (--gpu-model)";
    }
  }
  // A size the topology measured (NVML, or "memory_bytes" in JSON) beats the model's nominal one.
  if (!machine.gpus.empty() && machine.gpus.front().memory_bytes > 0) {
    id.model.memory_bytes = static_cast<double>(machine.gpus.front().memory_bytes);
  }
  return id;
}

}  // namespace muon::plan
