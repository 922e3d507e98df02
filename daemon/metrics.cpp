#include "daemon/metrics.hpp"

#include <prometheus/text_serializer.h>

#include <cmath>

namespace muon::daemon {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Latencies from 10 us (a small matrix on the CPU) to a minute (a large stack on a slow backend).
const Histogram::BucketBoundaries& seconds_buckets() {
  static const Histogram::BucketBoundaries b = {1e-5,   2.5e-5, 5e-5, 1e-4,   2.5e-4, 5e-4, 1e-3,
                                                2.5e-3, 5e-3,   1e-2, 2.5e-2, 5e-2,   0.1,  0.25,
                                                0.5,    1.0,    2.5,  5.0,    10.0,   25.0, 60.0};
  return b;
}

// Orthogonality errors: healthy quintic schedules land around 0.05..0.55, 1 is a lost direction.
const Histogram::BucketBoundaries& error_buckets() {
  static const Histogram::BucketBoundaries b = {0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4,
                                                0.5,  0.6,  0.8,  1.0, 2.0, 5.0};
  return b;
}

// The counters' index and label of a chunk kind: both replica kinds count as "replica".
size_t kind_index(transport::ChunkKind k) {
  switch (k) {
    case transport::ChunkKind::gradient:
      return 0;
    case transport::ChunkKind::momentum:
      return 1;
    default:
      return 2;
  }
}

const char* kind_label(size_t index) {
  static const char* const labels[] = {"gradient", "momentum", "replica"};
  return labels[index];
}

}  // namespace

std::string shape_label(const MatrixShape& s) {
  std::string out = std::to_string(s.rows) + "x" + std::to_string(s.cols);
  return s.batch == 1 ? out : std::to_string(s.batch) + "x" + out;
}

Metrics::Metrics(const std::string& version, const std::string& backend, int server_id)
    : registry_(std::make_shared<prometheus::Registry>()),
      started_(std::chrono::steady_clock::now()),
      server_(server_id >= 0
                  ? std::map<std::string, std::string>{{"server", std::to_string(server_id)}}
                  : std::map<std::string, std::string>{}),
      chunks_received_(
          BuildCounter()
              .Name("muon_offload_chunks_received_total")
              .Help("Data-plane chunks pushed by clients, by kind (gradient, momentum)")
              .Labels(server_)
              .Register(*registry_)),
      bytes_received_(BuildCounter()
                          .Name("muon_offload_received_bytes_total")
                          .Help("Bytes pushed by clients (wire dtype), by kind")
                          .Labels(server_)
                          .Register(*registry_)),
      chunks_returned_(
          BuildCounter()
              .Name("muon_offload_chunks_returned_total")
              .Help("Chunks sent to clients: kind gradient = updates, momentum = state fetches")
              .Labels(server_)
              .Register(*registry_)),
      bytes_returned_(BuildCounter()
                          .Name("muon_offload_returned_bytes_total")
                          .Help("Bytes sent to clients (update dtype), by kind")
                          .Labels(server_)
                          .Register(*registry_)),
      ns_seconds_(
          BuildHistogram()
              .Name("muon_offload_newton_schulz_seconds")
              .Help("Backend time (momentum, Newton-Schulz, scale) per applied parameter step, by "
                    "shape; a batched call is shared by element count")
              .Labels(server_)
              .Register(*registry_)),
      step_latency_(BuildHistogram()
                        .Name("muon_offload_step_latency_seconds")
                        .Help("Parameter step from its first chunk to its last update handed to "
                              "the sessions, by shape")
                        .Labels(server_)
                        .Register(*registry_)),
      steps_(BuildCounter()
                 .Name("muon_offload_parameter_steps_total")
                 .Help("Parameter steps computed, by outcome (applied, skipped, refused)")
                 .Labels(server_)
                 .Register(*registry_)),
      exposed_wait_(BuildHistogram()
                        .Name("muon_offload_client_exposed_wait_seconds")
                        .Help("Time compute ranks report waiting for their updates, per step")
                        .Labels(server_)
                        .Register(*registry_)
                        .Add({}, seconds_buckets())),
      last_exposed_wait_(BuildGauge()
                             .Name("muon_offload_client_last_exposed_wait_seconds")
                             .Help("The time each compute rank waited for its updates in its last "
                                   "reported step, by rank: the slow rank of a job")
                             .Labels(server_)
                             .Register(*registry_)),
      step_reports_(BuildCounter()
                        .Name("muon_offload_client_step_reports_total")
                        .Help("Step reports received from compute ranks")
                        .Labels(server_)
                        .Register(*registry_)
                        .Add({})),
      reported_bytes_(BuildCounter()
                          .Name("muon_offload_client_reported_pushed_bytes_total")
                          .Help("Gradient bytes compute ranks report pushing (all servers)")
                          .Labels(server_)
                          .Register(*registry_)
                          .Add({})),
      forgotten_(BuildCounter()
                     .Name("muon_offload_parameters_forgotten_total")
                     .Help("Parameters of finished jobs forgotten, their momentum freed "
                           "(--forget-finished-jobs-after)")
                     .Labels(server_)
                     .Register(*registry_)
                     .Add({})),
      errors_(BuildCounter()
                  .Name("muon_offload_errors_total")
                  .Help("Errors sent to clients, by code (bad_request, timeout, peer_lost, "
                        "non_finite, ...); an error broadcast to the ranks of a parameter counts "
                        "once")
                  .Labels(server_)
                  .Register(*registry_)),
      health_last_(BuildGauge()
                       .Name("muon_offload_orthogonality_error")
                       .Help("Last sampled ||X X^T - I||_F / sqrt(m) of the unscaled "
                             "Newton-Schulz output, by parameter")
                       .Labels(server_)
                       .Register(*registry_)),
      health_threshold_(BuildGauge()
                            .Name("muon_offload_orthogonality_error_threshold")
                            .Help("The error above which the last sample of a parameter warns: "
                                  "what the schedule gives that input, plus the rounding "
                                  "allowance (daemon/numeric_health.hpp), by parameter")
                            .Labels(server_)
                            .Register(*registry_)),
      health_error_(BuildHistogram()
                        .Name("muon_offload_orthogonality_error_sampled")
                        .Help("Sampled orthogonality errors of every parameter")
                        .Labels(server_)
                        .Register(*registry_)
                        .Add({}, error_buckets())),
      health_samples_(BuildCounter()
                          .Name("muon_offload_health_samples_total")
                          .Help("Updates whose numeric health was measured")
                          .Labels(server_)
                          .Register(*registry_)
                          .Add({})),
      nonfinite_(BuildCounter()
                     .Name("muon_offload_nonfinite_update_values_total")
                     .Help("NaN or Inf values found in sampled updates")
                     .Labels(server_)
                     .Register(*registry_)
                     .Add({})),
      clients_(BuildGauge()
                   .Name("muon_offload_clients_connected")
                   .Help("Compute ranks connected (sessions that said hello)")
                   .Labels(server_)
                   .Register(*registry_)
                   .Add({})),
      sessions_(BuildGauge()
                    .Name("muon_offload_sessions_open")
                    .Help("Open connections, probes and status requests included")
                    .Labels(server_)
                    .Register(*registry_)
                    .Add({})),
      parameters_(BuildGauge()
                      .Name("muon_offload_parameters_registered")
                      .Help("Parameters whose registration is complete")
                      .Labels(server_)
                      .Register(*registry_)
                      .Add({})),
      queued_(BuildGauge()
                  .Name("muon_offload_scheduler_queued_jobs")
                  .Help("Parameter steps ready and waiting for the Newton-Schulz worker")
                  .Labels(server_)
                  .Register(*registry_)
                  .Add({})),
      in_flight_(BuildGauge()
                     .Name("muon_offload_scheduler_in_flight_jobs")
                     .Help("Parameter steps handed to the worker whose update is not back yet "
                           "(queued and running)")
                     .Labels(server_)
                     .Register(*registry_)
                     .Add({})),
      gathering_(BuildGauge()
                     .Name("muon_offload_parameters_gathering")
                     .Help("Parameters whose current step has chunks but not every commit")
                     .Labels(server_)
                     .Register(*registry_)
                     .Add({})),
      momentum_bytes_(BuildGauge()
                          .Name("muon_offload_momentum_bytes")
                          .Help("Bytes of fp32 momentum held")
                          .Labels(server_)
                          .Register(*registry_)
                          .Add({})),
      uptime_(BuildGauge()
                  .Name("muon_offload_uptime_seconds")
                  .Help("Seconds since the server started")
                  .Labels(server_)
                  .Register(*registry_)
                  .Add({})),
      snapshot_time_(BuildGauge()
                         .Name("muon_offload_last_snapshot_timestamp_seconds")
                         .Help("Unix time of the last snapshot written (absent before the first)")
                         .Labels(server_)
                         .Register(*registry_)),
      snapshot_age_(BuildGauge()
                        .Name("muon_offload_last_snapshot_age_seconds")
                        .Help("Seconds since the last snapshot written (absent before the first)")
                        .Labels(server_)
                        .Register(*registry_)) {
  BuildGauge()
      .Name("muon_offload_build_info")
      .Help("Version and backend of this server (value 1)")
      .Labels(server_)
      .Register(*registry_)
      .Add({{"version", version}, {"backend", backend}})
      .Set(1.0);
  // The common kinds and codes exist from the start, so that rate() sees their first increment.
  for (size_t i = 0; i < 3; ++i) {
    received_.chunks[i] = &chunks_received_.Add({{"kind", kind_label(i)}});
    received_.bytes[i] = &bytes_received_.Add({{"kind", kind_label(i)}});
    returned_.chunks[i] = &chunks_returned_.Add({{"kind", kind_label(i)}});
    returned_.bytes[i] = &bytes_returned_.Add({{"kind", kind_label(i)}});
  }
  for (const ErrorCode code :
       {ErrorCode::bad_request, ErrorCode::timeout, ErrorCode::peer_lost, ErrorCode::non_finite}) {
    cached(errors_, errors_by_, "code", std::string(error_code_name(code)));
  }
  for (const char* outcome : {"applied", "skipped", "refused"}) {
    cached(steps_, steps_by_, "outcome", outcome);
  }
}

template <class T>
T& Metrics::cached(prometheus::Family<T>& family, std::map<std::string, T*>& cache,
                   const std::string& label, const std::string& value) {
  auto it = cache.find(value);
  if (it != cache.end()) return *it->second;
  T& m = family.Add({{label, value}});
  cache.emplace(value, &m);
  return m;
}

void Metrics::chunk_received(transport::ChunkKind kind, uint64_t bytes) {
  const auto i = kind_index(kind);
  received_.chunks[i]->Increment();
  received_.bytes[i]->Increment(static_cast<double>(bytes));
}

void Metrics::chunk_returned(transport::ChunkKind kind, uint64_t bytes) {
  const auto i = kind_index(kind);
  returned_.chunks[i]->Increment();
  returned_.bytes[i]->Increment(static_cast<double>(bytes));
}

void Metrics::newton_schulz(const MatrixShape& shape, double seconds) {
  const std::string label = shape_label(shape);
  auto it = ns_by_shape_.find(label);
  if (it == ns_by_shape_.end()) {
    it = ns_by_shape_.emplace(label, &ns_seconds_.Add({{"shape", label}}, seconds_buckets())).first;
  }
  it->second->Observe(seconds);
}

void Metrics::step_latency(const MatrixShape& shape, double seconds) {
  const std::string label = shape_label(shape);
  auto it = latency_by_shape_.find(label);
  if (it == latency_by_shape_.end()) {
    it = latency_by_shape_.emplace(label, &step_latency_.Add({{"shape", label}}, seconds_buckets()))
             .first;
  }
  it->second->Observe(seconds);
}

void Metrics::step_done(const std::string& outcome) {
  cached(steps_, steps_by_, "outcome", outcome).Increment();
}

void Metrics::step_report(const transport::StepReport& report, int rank) {
  step_reports_.Increment();
  const double wait = static_cast<double>(report.exposed_wait_ns) * 1e-9;
  exposed_wait_.Observe(wait);
  auto it = wait_by_rank_.find(rank);
  if (it == wait_by_rank_.end()) {
    it = wait_by_rank_.emplace(rank, &last_exposed_wait_.Add({{"rank", std::to_string(rank)}}))
             .first;
  }
  it->second->Set(wait);
  reported_bytes_.Increment(static_cast<double>(report.bytes_pushed));
}

void Metrics::parameters_forgotten(size_t n) { forgotten_.Increment(static_cast<double>(n)); }

void Metrics::error(ErrorCode code) {
  cached(errors_, errors_by_, "code", std::string(error_code_name(code))).Increment();
}

void Metrics::health(const std::string& name, const NumericHealth& h) {
  health_samples_.Increment();
  nonfinite_.Increment(static_cast<double>(h.nonfinite));
  if (std::isnan(h.orthogonality_error)) return;
  cached(health_last_, health_by_param_, "parameter", name).Set(h.orthogonality_error);
  cached(health_threshold_, threshold_by_param_, "parameter", name).Set(h.threshold);
  health_error_.Observe(h.orthogonality_error);
}

void Metrics::set_state(const MetricsState& s) {
  clients_.Set(s.clients_connected);
  sessions_.Set(s.sessions_open);
  parameters_.Set(s.parameters_registered);
  queued_.Set(static_cast<double>(s.scheduler_queued));
  in_flight_.Set(static_cast<double>(s.scheduler_in_flight));
  gathering_.Set(static_cast<double>(s.gathering));
  momentum_bytes_.Set(static_cast<double>(s.momentum_bytes));
  uptime_.Set(uptime_seconds());
  if (s.last_snapshot) {
    const auto now = std::chrono::system_clock::now();
    snapshot_time_.Add({}).Set(
        std::chrono::duration<double>(s.last_snapshot->time_since_epoch()).count());
    snapshot_age_.Add({}).Set(std::chrono::duration<double>(now - *s.last_snapshot).count());
  }
}

std::string Metrics::render() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

std::map<std::string, double> Metrics::error_counts() const {
  std::map<std::string, double> out;
  for (const auto& [code, counter] : errors_by_) out[code] = counter->Value();
  return out;
}

double Metrics::uptime_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

}  // namespace muon::daemon
