// The server's Prometheus metrics (prometheus-cpp core: a Registry of counter, gauge and
// histogram families; text exposition by TextSerializer). Events are counted as they happen, on
// the io thread, without locks of ours (prometheus-cpp counters are atomics; a histogram takes
// its own small mutex). Figures that describe state (clients, queue depth, momentum bytes,
// snapshot age) are set from a MetricsState just before each scrape. daemon/README.md lists every
// metric.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "daemon/numeric_health.hpp"
#include "kernels/muon_options.hpp"
#include "transport/messages.hpp"

namespace muon::daemon {

/// State figures, gathered by the Engine at scrape time.
struct MetricsState {
  int clients_connected = 0;  ///< sessions that said hello (compute ranks)
  int sessions_open = 0;      ///< every open connection (probes and status requests too)
  int parameters_registered = 0;
  int64_t scheduler_queued = 0;     ///< jobs waiting for the worker
  int64_t scheduler_in_flight = 0;  ///< parameters submitted whose result is not back yet
  int64_t gathering = 0;            ///< parameters whose current step is being gathered
  int64_t momentum_bytes = 0;       ///< fp32 momentum held for every registered parameter
  /// Wall-clock time of the last snapshot written (none yet: nullopt).
  std::optional<std::chrono::system_clock::time_point> last_snapshot;
};

/// "RxC" for a matrix, "BxRxC" for a batch of matrices: the `shape` label.
std::string shape_label(const MatrixShape& shape);

class Metrics {
 public:
  /// `version` and `backend` go into muon_offload_build_info's labels. A `server_id` >= 0 (the
  /// server's id in the job's plan) is a label of every series, server="<id>", so that the
  /// series of a job's servers stay apart however they are scraped.
  Metrics(const std::string& version, const std::string& backend, int server_id = -1);

  /// A data-plane chunk a client pushed (gradient or momentum), `bytes` on the wire.
  void chunk_received(transport::ChunkKind kind, uint64_t bytes);
  /// A chunk handed to a session for sending (an update, or momentum for state_fetch).
  void chunk_returned(transport::ChunkKind kind, uint64_t bytes);
  /// Backend time (momentum + Newton-Schulz + scale) of one parameter's step.
  void newton_schulz(const MatrixShape& shape, double seconds);
  /// A parameter step of `shape` from its first chunk to its last update handed to the sessions.
  void step_latency(const MatrixShape& shape, double seconds);
  /// A finished parameter step: "applied", "skipped" (non-finite policy skip) or "refused".
  void step_done(const std::string& outcome);
  /// A step report of compute rank `rank` (the time it waited for its updates).
  void step_report(const transport::StepReport& report, int rank);
  /// An error sent to a client (or to every rank of a parameter, counted once), by code.
  void error(ErrorCode code);
  /// `n` parameters of finished jobs forgotten (--forget-finished-jobs-after).
  void parameters_forgotten(size_t n);
  /// A numeric-health sample of parameter `name`.
  void health(const std::string& name, const NumericHealth& h);

  /// Sets the state gauges; call before render().
  void set_state(const MetricsState& state);
  /// The registry in Prometheus text format (version 0.0.4).
  std::string render() const;

  /// Errors counted so far, by code (for `status`).
  std::map<std::string, double> error_counts() const;
  /// Seconds since construction.
  double uptime_seconds() const;

 private:
  template <class T>
  T& cached(prometheus::Family<T>& family, std::map<std::string, T*>& cache,
            const std::string& label, const std::string& value);

  std::shared_ptr<prometheus::Registry> registry_;
  std::chrono::steady_clock::time_point started_;
  std::map<std::string, std::string> server_;  // {"server": id}, or empty; on every family
  prometheus::Family<prometheus::Counter>& chunks_received_;
  prometheus::Family<prometheus::Counter>& bytes_received_;
  prometheus::Family<prometheus::Counter>& chunks_returned_;
  prometheus::Family<prometheus::Counter>& bytes_returned_;
  prometheus::Family<prometheus::Histogram>& ns_seconds_;
  prometheus::Family<prometheus::Histogram>& step_latency_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Histogram& exposed_wait_;
  prometheus::Family<prometheus::Gauge>& last_exposed_wait_;
  prometheus::Counter& step_reports_;
  prometheus::Counter& reported_bytes_;
  prometheus::Counter& forgotten_;
  prometheus::Family<prometheus::Counter>& errors_;
  prometheus::Family<prometheus::Gauge>& health_last_;
  prometheus::Family<prometheus::Gauge>& health_threshold_;
  prometheus::Histogram& health_error_;
  prometheus::Counter& health_samples_;
  prometheus::Counter& nonfinite_;
  prometheus::Gauge& clients_;
  prometheus::Gauge& sessions_;
  prometheus::Gauge& parameters_;
  prometheus::Gauge& queued_;
  prometheus::Gauge& in_flight_;
  prometheus::Gauge& gathering_;
  prometheus::Gauge& momentum_bytes_;
  prometheus::Gauge& uptime_;
  prometheus::Family<prometheus::Gauge>& snapshot_time_;
  prometheus::Family<prometheus::Gauge>& snapshot_age_;
  // The data-plane counters by kind (gradient; momentum: state loads and fetches; replica: an
  // owner's state streamed to its buddy, both kinds): plain pointers on the hot path.
  struct KindCounters {
    prometheus::Counter* chunks[3];
    prometheus::Counter* bytes[3];
  };
  KindCounters received_{}, returned_{};
  // Label value -> metric, so that no event takes a family's lock to find its metric.
  std::map<std::string, prometheus::Histogram*> ns_by_shape_, latency_by_shape_;
  std::map<int, prometheus::Gauge*> wait_by_rank_;
  std::map<std::string, prometheus::Counter*> steps_by_, errors_by_;
  std::map<std::string, prometheus::Gauge*> health_by_param_, threshold_by_param_;
};

}  // namespace muon::daemon
