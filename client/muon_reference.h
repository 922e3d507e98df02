/* C ABI of the in-process Muon reference (libmuon_offload_reference.so): the server's own CPU
 * kernels (OpenBLAS, fp32) run in the calling process, for InProcessMuon and for tests that
 * compare the server's updates bitwise. A trainer that offloads Muon never loads this library,
 * so the client (libmuon_offload_client.so) carries no BLAS.
 *
 * Status codes are those of muon_status.h; the message and ErrorCode of the last failure on the
 * calling thread come from muon_reference_last_error() / muon_reference_last_error_code().
 * Options are the JSON object of muon_client.h (fields of muon_options_schema(); missing ones
 * take their defaults, unknown ones are refused). */
#ifndef MUON_REFERENCE_H_
#define MUON_REFERENCE_H_

#include <stdint.h>

#include "muon_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct muon_reference muon_reference;

/* The message of the last failure on this thread ("" when none), and its ErrorCode (0: none). */
const char* muon_reference_last_error(void);
int muon_reference_last_error_code(void);

/* A CPU backend with `threads` OpenBLAS threads (0: OpenBLAS' own setting). OpenBLAS' thread
 * count is process-wide (PyTorch may run on the same OpenBLAS): it is set only while an update
 * computes and restored before the call returns. Results are bitwise the server's
 * (muon-offloadd --backend cpu --threads N) at the same thread count. Its work buffers are
 * reused across updates; one thread at a time per handle. */
int muon_reference_create(int threads, muon_reference** out);
void muon_reference_destroy(muon_reference* r);

/* One Muon step of one parameter (shape [r, c] or [b, r, c], fp32 row-major, numel elements
 * each): momentum (NULL allowed for momentum "none") is updated in place and the update
 * scale * NS(input) written. Returns 0, or 1 when the non-finite policy "skip" skipped the step
 * (update zeroed, momentum untouched). */
int muon_reference_update(muon_reference* r, const char* name, const int64_t* shape, int ndim,
                          const char* options_json, const float* grad, float* momentum,
                          float* update);

/* muon_reference_update on the calling thread's own reference (made at its first call and kept,
 * `threads` as muon_reference_create; the signature libmuon_offload_client.so had before the
 * reference moved here). */
int muon_local_update(const char* name, const int64_t* shape, int ndim, const char* options_json,
                      const float* grad, float* momentum, float* update, int threads);

#ifdef __cplusplus
}
#endif

#endif /* MUON_REFERENCE_H_ */
