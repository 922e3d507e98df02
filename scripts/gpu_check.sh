#!/usr/bin/env bash
# GPU check in one go, for a machine with an NVIDIA GPU (sized for one H200, under 10 minutes):
#   1. nvidia-smi (fails loudly when there is no usable GPU),
#   2. Release build with the CUDA backend for sm_90 into build-gpu/,
#   3. test_cuda_backend (fails when its GPU tests skip: on this machine they must run),
#   4. the CUDA benchmarks of bench/muon_bench when that binary exists.
# Writes everything to ${OUT:-build-gpu}/gpu_report.txt (plus test_cuda_backend.xml).
# Exit status: 0 when the tests passed, 1 otherwise, 2 when no GPU is usable.
# Environment: OUT (report folder), JOBS (build parallelism, default nproc),
#              BENCH_FILTER (default: CUDA benchmarks), CUDA_ARCH (default 90).
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
BUILD=build-gpu
OUT_DIR="${OUT:-$BUILD}"
REPORT="$OUT_DIR/gpu_report.txt"
JOBS="${JOBS:-$(nproc)}"
BENCH_FILTER="${BENCH_FILTER:-cuda}"
CUDA_ARCH="${CUDA_ARCH:-90}"
mkdir -p "$OUT_DIR"
: >"$REPORT"

log() { echo "$@" | tee -a "$REPORT"; }
section() { log ""; log "==== $* ($(date -u +%H:%M:%S)) ===="; }
# run LIMIT_S CMD...: runs CMD with a time limit, output to the terminal and the report.
run() {
  local limit=$1
  shift
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$REPORT"
  return "${PIPESTATUS[0]}"
}

section "muon-offload GPU check"
log "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
log "host: $(hostname)  date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"

section "nvidia-smi"
if ! run 60 nvidia-smi; then
  log "FATAL: nvidia-smi failed: no usable NVIDIA GPU on this machine; nothing was built." >&2
  exit 2
fi
run 30 nvidia-smi topo -m || true
NVCC=/usr/local/cuda/bin/nvcc
[[ -x $NVCC ]] || NVCC=nvcc
run 30 "$NVCC" --version || true

section "configure (Release, CUDA ON, sm_$CUDA_ARCH)"
cmake_args=(-S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMUON_OFFLOAD_CUDA=ON
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DMUON_OFFLOAD_TESTS=ON)
if ! run 180 cmake "${cmake_args[@]}" -DMUON_OFFLOAD_BENCH=ON; then
  log "configure with benchmarks failed (Google Benchmark missing?); retrying without them"
  if ! run 180 cmake "${cmake_args[@]}" -DMUON_OFFLOAD_BENCH=OFF; then
    log "FATAL: configure failed" >&2
    exit 1
  fi
fi

section "build"
targets=(test_cuda_backend test_kernels)
if cmake --build "$BUILD" --target help 2>/dev/null | grep -q 'muon_bench'; then
  targets+=(muon_bench)
fi
if ! run 300 cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"; then
  log "FATAL: build failed" >&2
  exit 1
fi

section "test_cuda_backend"
status=0
test_log="$OUT_DIR/test_cuda_backend.log"
run 180 "$BUILD/tests/kernels/test_cuda_backend" --gtest_output="xml:$OUT_DIR/test_cuda_backend.xml" \
  | tee "$test_log"
test_rc=${PIPESTATUS[0]}
if [[ $test_rc -ne 0 ]]; then
  log "RESULT: test_cuda_backend FAILED (exit $test_rc)"
  status=1
elif grep -q '^\[  SKIPPED \]' "$test_log"; then
  log "RESULT: test_cuda_backend SKIPPED GPU tests on a GPU machine (see the reason above): FAILED"
  status=1
else
  log "RESULT: test_cuda_backend passed"
fi
rm -f "$test_log"

section "test_kernels (CPU oracle, Release)"
if ! run 120 "$BUILD/tests/kernels/test_kernels" --gtest_brief=1; then
  log "RESULT: test_kernels FAILED"
  status=1
fi

section "benchmarks"
if [[ -x $BUILD/bench/muon_bench ]]; then
  # Ratios against a reference measured in the same run (architecture guide, section 9).
  if ! run 240 "$BUILD/bench/muon_bench" --benchmark_filter="$BENCH_FILTER"; then
    log "benchmarks failed or ran out of time (240 s)"
    status=1
  fi
else
  log "no bench/muon_bench binary: benchmarks skipped"
fi

section "summary"
log "report: $REPORT"
if [[ $status -eq 0 ]]; then log "GPU CHECK PASSED"; else log "GPU CHECK FAILED"; fi
exit "$status"
