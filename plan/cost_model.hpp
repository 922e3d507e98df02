// The cost model of a plan, per server and per training step: Newton-Schulz time from a GEMM
// rate, transfer time from link bandwidths, the GPU share a dedicated server gives up, and what
// stays exposed on the step's critical path. Every figure is in seconds, bytes, FLOP/s or bytes/s.
//
// Defaults, and where they come from:
//   GEMM rate          the server GPU's published dense peak for the Newton-Schulz precision
//                      (plan/gpu_model.hpp: bf16 tensor cores, or plain fp32) x 0.80 (a large
//                      cuBLAS GEMM's share of the peak: 790 of 989 TFLOP/s on H100, the figure of
//                      the architecture guide's "Sizing") x 0.70 (Newton-Schulz's share of that
//                      GEMM rate, gemm_efficiency). Pass a measured rate (bench/) with
//                      --gemm-tflops and --gemm-efficiency 1.
//   launch overhead    5 us per GEMM launch, 3 launches per step (one per product); the sizing
//                      table counts FLOPs only and is reproduced with 0.
//   training           6 x active parameters FLOPs per token, at 40 % MFU of the compute GPU's
//                      dense bf16 peak (989e12 FLOP/s on H100/H200 SXM, the figure MFU is quoted
//                      against); this is what reproduces the guide's "NS / step time" column.
//   NVLink             25e9 bytes/s per link and direction (NVLink 3 and 4: NV12 on A100 = 300
//                      GB/s, NV18 on H100/H200 = 450 GB/s per GPU and direction);
//   NVLink 5 (fabric)  50e9 bytes/s per link and direction (GB200 NVL72: 18 links = 900 GB/s);
//   PCIe               25e9 bytes/s per GPU and direction (Gen4 x16 in practice; Gen5 ~50e9);
//   network            50e9 bytes/s per GPU and direction (one 400 Gb/s NIC per GPU);
//   wire format        4 bytes per element: gradient tiles and updates in fp32, the transport's
//                      default (transport/messages.hpp);
//   overlap window     2/3 of the compute step: gradients arrive during backward (about 2/3 of a
//                      step's FLOPs) and the server works while they do.
#pragma once

#include <array>
#include <string>

#include "kernels/muon_options.hpp"
#include "plan/model_config.hpp"
#include "topology/domains.hpp"
#include "topology/machine.hpp"

namespace muon::plan {

/// Where a server runs: on a GPU of its own, or sharing a compute rank's GPU (low stream
/// priority, or embedded in the trainer).
enum class Placement { dedicated, colocated };
const char* placement_name(Placement p);

/// A large cuBLAS GEMM's share of a GPU's dense peak (790 of 989 TFLOP/s bf16 on H100).
inline constexpr double kGemmFractionOfPeak = 0.80;

/// The kind of link a transfer crosses.
enum class LinkKind { nvlink, fabric, pcie, network };
inline constexpr int kLinkKinds = 4;
const char* link_kind_name(LinkKind kind);

struct CostSettings {
  std::string schedule = "keller";  ///< Newton-Schulz schedule (kernels/ns_schedule.hpp)
  int ns_steps = 5;
  NsAlgorithm algorithm = NsAlgorithm::syrk;
  /// Precision of the Newton-Schulz products on the server: bf16 (tensor cores, the CUDA
  /// backend's default) or fp32; picks the peak the GEMM rate derives from.
  Precision ns_precision = Precision::bf16;
  double gemm_flops = kGemmFractionOfPeak * 989e12;  ///< FLOP/s, GEMM rate of one server GPU
  double gemm_efficiency = 0.70;                     ///< share of gemm_flops Newton-Schulz reaches
  double launch_overhead_s = 5e-6;                   ///< seconds per GEMM launch
  double train_peak_flops = 989e12;  ///< FLOP/s per compute GPU (dense bf16), what MFU refers to
  double mfu = 0.40;
  double nvlink_link_bw = 25e9;  ///< bytes/s per NVLink link and direction
  double fabric_link_bw = 50e9;  ///< bytes/s per NVLink 5 link and direction (fabric domains)
  double pcie_bw = 25e9;         ///< bytes/s per GPU and direction
  double network_bw = 50e9;      ///< bytes/s per GPU and direction
  double wire_bytes = 4;         ///< bytes per gradient/update element on the wire
  double overlap_fraction = 2.0 / 3.0;
  /// Share of a co-located server's Newton-Schulz time its host rank loses (1: all of it).
  double colocated_interference = 1.0;
};

/// Seconds of Newton-Schulz for `flops` at the settings' rate: flops / (gemm_flops x efficiency).
double ns_seconds(double flops, const CostSettings& s);

/// Predicted seconds for one parameter on its owner: ns_seconds(ns_run_flops) plus
/// 3 x steps launch overheads. The LPT balances on this.
double parameter_seconds(const MuonMatrix& m, const CostSettings& s);

/// Training FLOPs of one step: 6 x active parameters x tokens (Kaplan et al. 2020).
double training_flops(const ModelConfig& model, double tokens_per_step);

/// The link inside a domain: fabric for fabric cliques, nvlink for NVSwitch and direct NVLink,
/// pcie for PCIe-only domains.
LinkKind domain_link(topology::DomainKind kind);

/// Bytes/s one GPU can receive (or send) over `kind`: for NVLink its links x per-link rate
/// (NVSwitch and fabric GPUs: the bonded count to a peer, 18 on H100/GB200, NV12 on A100; 18 when
/// a fabric GPU lists no peer; direct NVLink: the sum over peers), else the PCIe or network rate.
double link_bandwidth(LinkKind kind, const topology::Gpu& gpu, const CostSettings& s);

/// What one server moves and computes per step.
struct ServerLoad {
  double ns_flops = 0;
  double ns_s = 0;       ///< sum of its parameters' parameter_seconds
  double max_job_s = 0;  ///< its longest parameter
  double max_job_bytes = 0;
  double momentum_bytes = 0;                   ///< fp32 momentum of the parameters it owns
  std::array<double, kLinkKinds> bytes_in{};   ///< per LinkKind
  std::array<double, kLinkKinds> bytes_out{};  ///< per LinkKind
  std::array<double, kLinkKinds> bandwidth{};  ///< this server GPU's bytes/s per LinkKind
  /// max over kinds and directions of bytes / bandwidth: links run concurrently and full duplex.
  double link_s() const;
};

/// Seconds of a server's work that the step waits for, beyond the overlap window `window_s`:
///   dedicated   max(0, max(ns_s, link_s) - window_s) + max_job_s + max_job_bytes / bw(intra):
///               the server keeps up with backward or not, and the longest parameter may be the
///               last to arrive, so its NS and its update's transfer stay on the critical path;
///   colocated   colocated_interference x ns_s + max(0, link_s - window_s): the NS runs on a GPU
///               that also trains, so its time is taken from that rank, and a synchronous step
///               waits for the slowest rank.
double server_exposed_seconds(Placement placement, const ServerLoad& load, LinkKind intra,
                              double window_s, const CostSettings& s);

}  // namespace muon::plan
