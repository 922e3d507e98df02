#!/usr/bin/env bash
# The main job: a small GPT trained character by character on the fortunes of Debian's `fortunes`
# package by 2 ranks (torch.distributed, gloo, CPU), with Muon running in a muon-offloadd server
# (CPU backend unless a GPU is present) and the model sharded by FSDP2 (fully_shard: each rank
# pushes only its shard of each matrix and prints those bytes next to the full Muon bytes; the
# other runs put the model under DistributedDataParallel); then the same run
# with in-process Muon (the same C++ kernels: the losses must be bitwise equal), with
# torch.optim.Muon + torch.optim.AdamW (the anchor users compare with) and with AdamW alone; then
# a summary (loss difference offload vs torch.optim.Muon, tokens/s, optimizer time exposed).
#
#   scripts/demo.sh            # installs what is missing, builds, trains, summarizes
#
# Environment: BUILD_DIR (default build), JOBS (default nproc), STEPS (default 300),
# OUT_DIR (default a temporary dir: the JSON results and logs land there).
# Exit status: 0 when the claims of the summary hold (end loss below the corpus' unigram entropy,
# offload losses bitwise equal to in-process on the CPU backend), 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)

scripts/install_deps.sh

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
STEPS=${STEPS:-300}
GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  GPU=1
fi
# Configure once. A fresh CPU-only machine skips the CUDA backend (nvcc builds take long); an
# existing build folder keeps its own settings (scripts/test.sh may have configured it).
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  CUDA_OPT=OFF
  [ "$GPU" = 1 ] && CUDA_OPT=AUTO
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMUON_OFFLOAD_CUDA=$CUDA_OPT
fi
cmake --build "$BUILD_DIR" -j"$JOBS" --target muon-offloadd muon-offload muon_offload_client \
  muon_offload_reference
T_BUILT=$(date +%s)

BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
export MUON_OFFLOAD_LIB="$BUILD_DIR/client/libmuon_offload_client.so"
export MUON_OFFLOAD_BIN_DIR="$BUILD_DIR"
OUT_DIR=${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/muon-offload-demo.XXXXXX")}
mkdir -p "$OUT_DIR"
PY=$(scripts/venv-python)   # the venv install_deps.sh made (torch from PyPI)
TRAIN=(examples/train_char_gpt.py --world 2 --steps "$STEPS" --log-every 25)
BACKEND=cpu
LAUNCH=(scripts/muon-offload-launch --threads 1 --bin-dir "$BUILD_DIR")
if [ "$GPU" = 1 ]; then BACKEND=cuda; else LAUNCH+=(--cpu); fi

echo
echo "== 1/4: Muon offloaded to muon-offloadd ($BACKEND backend), 2 ranks under FSDP2, $STEPS steps =="
"${LAUNCH[@]}" -- "$PY" "${TRAIN[@]}" --optimizer offload --fsdp --out "$OUT_DIR/offload.json"
echo
echo "== 2/4: the same with in-process Muon (same C++ kernels, same seed) =="
"$PY" "${TRAIN[@]}" --optimizer inprocess --out "$OUT_DIR/inprocess.json"
echo
echo "== 3/4: torch.optim.Muon + torch.optim.AdamW (the same math, computed by torch) =="
"$PY" "${TRAIN[@]}" --optimizer torch --out "$OUT_DIR/torch.json"
echo
echo "== 4/4: AdamW alone, for comparison =="
"$PY" "${TRAIN[@]}" --optimizer adamw --out "$OUT_DIR/adamw.json"
T_END=$(date +%s)

"$PY" scripts/demo_summary.py --backend "$BACKEND" --build-s $((T_BUILT - T0)) \
  --total-s $((T_END - T0)) "$OUT_DIR/offload.json" "$OUT_DIR/inprocess.json" \
  "$OUT_DIR/torch.json" "$OUT_DIR/adamw.json"
