#!/usr/bin/env bash
# The test command: installs what is missing, builds everything (CUDA code too where nvcc is
# present), and runs every test. Usage: scripts/test.sh   (BUILD_DIR=... to choose the build dir)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMUON_OFFLOAD_CUDA=AUTO
cmake --build "$BUILD_DIR" -j"$JOBS"
# OpenBLAS would start one thread per core in every test process; tests run in parallel.
OPENBLAS_NUM_THREADS=1 ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS"
