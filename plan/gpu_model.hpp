// The GPU models the planner knows: their published dense compute rates and memory, and how the
// model of a job's GPUs is found (a flag, the topology's own words, or what its links imply).
//
// Rates are NVIDIA's published peaks *without* structured sparsity (datasheets quote the sparse
// figure for tensor cores, marked "with sparsity"; dense is half of it). fp32 is the plain FP32
// rate (CUDA cores, no TF32), what cuBLAS SGEMM reaches when TF32 is not enabled. Sources:
//   A100 SXM4   NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4):
//               BF16 tensor 312 TFLOP/s, FP32 19.5 TFLOP/s, 40 or 80 GB HBM2e.
//   H100 SXM5   NVIDIA H100 Tensor Core GPU datasheet (2023): BF16 tensor 1,979 TFLOP/s with
//               sparsity (989 dense), FP32 67 TFLOP/s, 80 GB HBM3.
//   H100 PCIe   same datasheet: BF16 1,513 with sparsity (756 dense), FP32 51 TFLOP/s, 80 GB.
//   H200 SXM    NVIDIA H200 Tensor Core GPU product brief / datasheet (2024): the H100 SXM's
//               compute (BF16 989 dense, FP32 67) with 141 GB HBM3e.
//   B200 (HGX)  NVIDIA GB200 NVL72 / HGX B200 specifications, "individual Blackwell GPU"
//               (nvidia.com/en-us/data-center/gb200-nvl72): HGX B200 FP16/BF16 tensor 4.5 PFLOP/s
//               with sparsity (2.25 dense), FP32 75 TFLOP/s, 180 GB HBM3e.
//   GB200       the same table, GB200 NVL72 column: FP16/BF16 tensor 5 PFLOP/s with sparsity
//               (2.5 dense), FP32 80 TFLOP/s, 186 GB HBM3e per GPU.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "topology/machine.hpp"

namespace muon::plan {

/// One GPU model: published dense peaks and memory.
struct GpuModel {
  std::string
      key;  ///< what --gpu-model takes: "a100", "h100", "h100_pcie", "h200", "b200", "gb200"
  std::string name;     ///< "H100 SXM5"
  double bf16_flops;    ///< FLOP/s, dense BF16 tensor-core peak (what MFU is quoted against)
  double fp32_flops;    ///< FLOP/s, plain FP32 peak (no TF32)
  double memory_bytes;  ///< HBM capacity, bytes (decimal GB as NVIDIA quotes them)
};

/// Every model the planner knows, in the order above.
const std::vector<GpuModel>& known_gpu_models();

/// The model for a --gpu-model key (case-insensitive; "h100_sxm" and "h100-sxm" name "h100").
/// Throws InvalidArgument listing the known keys.
const GpuModel& find_gpu_model(std::string_view key);

/// The model a device name denotes, as NVML and nvidia-smi print it ("NVIDIA A100-SXM4-80GB",
/// "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA B200", "NVIDIA GB200");
/// nullptr when the name is none of them.
const GpuModel* gpu_model_for_name(std::string_view device_name);

/// Where the model of a job's GPUs came from.
enum class GpuModelSource {
  flag,      ///< --gpu-model
  topology,  ///< the topology names the device ("model" in JSON, NVML's device name)
  links,     ///< implied by the links: fabric clique -> GB200, NVSwitch NV12 -> A100, NV18 -> H100
  assumed,   ///< nothing says: H100 SXM5 assumed (memory is then only warned about, never refused)
};

/// The model of the job's GPUs and how it was found.
struct GpuIdentity {
  GpuModel model;
  GpuModelSource source = GpuModelSource::assumed;
  /// One line for the plan's header: "--gpu-model h200", "topology: NVIDIA A100-SXM4-40GB",
  /// "implied by NV12 NVSwitch links (A100 and A800 have 12)", "assumed: ...".
  std::string how;
};

/// Identifies the GPUs of `machine`: `flag` (a --gpu-model key) when non-empty; else the device
/// names of the topology (all GPUs must agree); else the links (fabric clique: GB200; NVSwitch
/// with 12 links per peer: A100; 18: H100 SXM5, though H200 and HGX B200 show 18 too); else
/// assumed H100 SXM5. A memory size in the topology (Gpu::memory_bytes, e.g. an A100 40 GB)
/// replaces the model's. Throws InvalidArgument for an unknown flag, or when the topology names
/// different models (plan one kind at a time, or pass --gpu-model).
GpuIdentity identify_gpus(const topology::Machine& machine, std::string_view flag);

/// "flag", "topology", "links", "assumed".
const char* gpu_model_source_name(GpuModelSource source);

}  // namespace muon::plan
