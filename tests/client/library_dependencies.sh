#!/usr/bin/env bash
# What the two libraries of the client side need, read from the libraries themselves:
#   libmuon_offload_client.so     (every trainer loads it) NEEDs no BLAS, no cuBLAS, no CUDA
#                                 runtime and no NCCL, directly or through what it needs; exports
#                                 the muon_* C ABI only; in a CUDA build it carries the device
#                                 planes with the runtime's functions as its own local forwarders.
#   libmuon_offload_reference.so  (the in-process reference) NEEDs OpenBLAS, and nothing of CUDA.
# Usage: library_dependencies.sh CLIENT_LIB REFERENCE_LIB CUDA(ON|OFF) NCCL(ON|OFF)
set -euo pipefail
client=$1 reference=$2 cuda=$3 nccl=$4
status=0
fail() { echo "FAIL: $*" >&2; status=1; }
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
gpu_libs='blas|lapack|cudart|cublas|libcuda\.|nccl|nvrtc|cusparse|cusolver'

echo "== $client NEEDs:"; needed "$client"
if needed "$client" | grep -Ei "$gpu_libs"; then fail "the client library NEEDs the libraries above"; fi
echo "== its whole closure (ldd):"; ldd "$client"
if ldd "$client" | grep -Ei "$gpu_libs"; then fail "the client library's closure holds the libraries above"; fi

exported=$(nm -D --defined-only "$client" | awk '{print $3}')
[[ -n $exported ]] || fail "the client library exports nothing"
if grep -v '^muon_' <<<"$exported"; then fail "the client library exports the symbols above"; fi
grep -qx muon_client_create <<<"$exported" || fail "muon_client_create is not exported"
if grep -qx muon_local_update <<<"$exported"; then fail "muon_local_update is still in the client"; fi
if nm -D --undefined-only "$client" | grep -E ' (cuda|cublas|nccl|openblas|cblas_)'; then
  fail "the client library leaves the functions above to the process"
fi
# Its own local ('t') forwarders: the device planes are in, not their unavailable variant.
local_functions=$(nm "$client" | awk '$2 == "t" {print $3}')
wanted=()
[[ $cuda == ON ]] && wanted+=(cudaMemcpyAsync cudaIpcOpenMemHandle cudaStreamWaitEvent)
[[ $nccl == ON ]] && wanted+=(ncclSend ncclCommAbort)
for f in "${wanted[@]}"; do
  grep -qx "$f" <<<"$local_functions" || fail "$f is not a local function of the client library"
done

echo "== $reference NEEDs:"; needed "$reference"
needed "$reference" | grep -q openblas || fail "the reference library does not NEED OpenBLAS"
if needed "$reference" | grep -Ei 'cudart|cublas|libcuda\.|nccl'; then fail "the reference library NEEDs CUDA libraries"; fi
ref_exported=$(nm -D --defined-only "$reference" | awk '{print $3}')
if grep -v '^muon_' <<<"$ref_exported"; then fail "the reference library exports the symbols above"; fi
for f in muon_local_update muon_reference_create muon_reference_update; do
  grep -qx $f <<<"$ref_exported" || fail "$f is not exported by the reference library"
done
[[ $status == 0 ]] && echo "library dependencies OK"
exit $status
