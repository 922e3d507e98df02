/* C ABI of the muon-offload client library (for Python via ctypes and other languages).
 *
 * Every function returns MUON_OK (0) or a negative MUON_ERR_* code (muon_status.h); the message
 * of the last failure on the calling thread (naming the parameter, rank or server involved) is
 * returned by muon_last_error(). Handles are not thread-safe: one thread per handle at a time.
 *
 * Ranges are passed as flat int64 arrays [begin0, end0, begin1, end1, ...] of element indices
 * over the parameter's flattened elements. Options are a JSON object with the fields of
 * `muon-offload orthogonalize` plus momentum: {"momentum": "sum"|"ema"|"none", "mu": 0.95,
 * "nesterov": true, "schedule": "keller", "steps": 0, "coefficients": [], "eps": 1e-7,
 * "eps_mode": "scale_invariant", "scale": "keller", "extra_scale": 1.0, "row_splits": [],
 * "algorithm": "plain", "precision": "default", "nonfinite": "error"}; missing fields take these
 * defaults. "coefficients": [a, b, c] runs that quintic every step instead of "schedule"
 * (torch.optim.Muon's ns_coefficients; "steps" 0 means 5). "precision": "torch_bf16" rounds
 * where torch.optim.Muon's bf16 Newton-Schulz does (CPU servers; for parity checks). */
#ifndef MUON_CLIENT_H_
#define MUON_CLIENT_H_

#include <stdint.h>

#include "muon_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct muon_client muon_client;

/* The message of the last failure on this thread ("" when none). */
const char* muon_last_error(void);
/* The cause of the last failure on this thread: an ErrorCode integer (core/error_code.hpp; stable
 * across versions, 0 when none). For MUON_ERR_SERVER / _NONFINITE / _PEER_LOST / _TIMEOUT from
 * the server it is the server's code ("bad_request" 1, "unsupported" 3, "unauthorized" 4,
 * "peer_lost" 5, "timeout" 6, "non_finite" 7, "shutdown" 12, ...); for failures of the client
 * itself one of "connection_lost" 16, "invalid_argument" 17, "device" 18, "unavailable" 19,
 * "internal" 20. */
int muon_last_error_code(void);
/* What the server's error of the last failure on this thread names: the parameter ("" none),
 * the step (-1 none: e.g. a registration's timeout, against a step's) and the rank (-1 none).
 * "" / -1 for failures of the client itself. */
const char* muon_last_error_param(void);
int64_t muon_last_error_step(void);
int muon_last_error_rank(void);
/* The name of an ErrorCode integer ("peer_lost"), or NULL outside the enum: callers build their
 * code tables from this (0, 1, 2, ... until NULL). */
const char* muon_error_code_name(int code);

/* The Muon options' schema as a JSON array, one object per field of the options JSON:
 * {"name", "group" ("momentum"|"orthogonalize"), "type" ("string"|"integer"|"number"|"boolean"|
 * "integer_list"|"number_list"), "default", "choices" (accepted names or null), "cli_flag" (the
 * flag of `muon-offload orthogonalize` or null), "doc"}. Static storage; never NULL. */
const char* muon_options_schema(void);

/* The Unix socket a muon-offloadd started without --socket listens on, by the server's own rule
 * (daemon/socket_path.hpp): $MUON_OFFLOAD_SOCKET, else $XDG_RUNTIME_DIR/muon-offload/
 * muon-offloadd.sock, else /tmp/muon-offload-<uid>/muon-offloadd.sock, read from this process's
 * environment now. Thread-local storage, valid until the next call on this thread; never NULL. */
const char* muon_default_socket_path(void);

/* Connects a compute rank to `n_servers` servers: Unix socket paths, or "tcp://HOST:PORT" for a
 * server's TCP control plane (the token then comes from the file named by the environment
 * variable MUON_OFFLOAD_TOKEN_FILE, or is passed to muon_client_create_auth). */
int muon_client_create(const char* const* servers, int n_servers, int rank, int world_size,
                       const char* name, int64_t connect_timeout_ms, int64_t op_timeout_ms,
                       muon_client** out);
/* muon_client_create with the data plane of every connection: "shm" (also NULL or ""; host
 * shared memory), "cuda_ipc" (the servers' device rings over CUDA IPC, same node, servers on
 * the CUDA backend) or "nccl" (NCCL point-to-point with servers on the CUDA backend built with
 * NCCL, e.g. on another node). cuda_ipc and nccl work on the CUDA device current on the calling
 * thread: make the trainer's device current first (cudaSetDevice). A server that cannot serve
 * the data plane refuses with MUON_ERR_SERVER and its reason; a client without CUDA, NCCL or GPU
 * fails with MUON_ERR_UNAVAILABLE or MUON_ERR_DEVICE. */
int muon_client_create_ex(const char* const* servers, int n_servers, int rank, int world_size,
                          const char* name, int64_t connect_timeout_ms, int64_t op_timeout_ms,
                          const char* data_plane, muon_client** out);
/* muon_client_create_ex with the servers' shared secret for tcp:// endpoints (muon-offloadd
 * --auth-token-file; sent in the hello over TCP only, never over a Unix socket). NULL or "":
 * read from the file named by MUON_OFFLOAD_TOKEN_FILE when a tcp endpoint is given. A tcp
 * server refuses a missing or wrong token with MUON_ERR_SERVER ("unauthorized"). */
int muon_client_create_auth(const char* const* servers, int n_servers, int rank, int world_size,
                            const char* name, int64_t connect_timeout_ms, int64_t op_timeout_ms,
                            const char* data_plane, const char* auth_token, muon_client** out);
void muon_client_destroy(muon_client* c);

/* The training job of this client's registrations from now on: the same string on every rank of
 * the job (e.g. a UUID rank 0 makes and broadcasts; at most 256 bytes; NULL or "": none), and
 * whether they resume (0/1). A server holding a parameter of another job registers it anew once
 * none of that job's ranks is connected: fresh (momentum and step dropped), or keeping its
 * momentum and last step with resume = 1; while a rank of that job is connected the registration
 * fails with MUON_ERR_SERVER (bad_request, naming the rank). Without a job the server keeps a
 * parameter's state by name across jobs. MUON_ERR_INVALID for a longer job. */
int muon_client_set_job(muon_client* c, const char* job, int resume);

/* 1 when this library was built with CUDA (the *_device functions and cuda_ipc can work). */
int muon_client_has_cuda(void);
/* The CUDA runtime this library uses. The library links none: at the first use of a device
 * function it takes the one already in the process (PyTorch's; then "libcudart.so.13 (already
 * loaded)"), else loads one by soname, else the toolkit's it was built against (its path). Calling
 * this loads it. "" when none could be loaded or the library was built without CUDA; the reason is
 * then muon_last_error() (MUON_ERR_UNAVAILABLE, "unavailable"). Static storage; never NULL. */
const char* muon_client_cuda_runtime(void);

/* Registers one parameter with server `server` and waits until every rank registered it (every
 * rank of the job must register the same parameters). A wait past op_timeout_ms fails with
 * MUON_ERR_TIMEOUT naming the ranks that have not registered it.
 * grad_dtype / update_dtype: "f32" or "bf16". */
int muon_client_register(muon_client* c, const char* name, const int64_t* shape, int ndim,
                         const char* grad_dtype, const char* update_dtype, const char* options_json,
                         const int64_t* push_ranges, int n_push, const int64_t* want_ranges,
                         int n_want, int server);

/* Pushes `count` elements (grad dtype) at element `offset`. */
int muon_client_push(muon_client* c, const char* name, int64_t step, int64_t offset,
                     const void* data, int64_t count);
/* muon_client_push from CUDA device memory: `count` elements (grad dtype) at device_ptr, copied
 * after the work already queued on `cuda_stream` (a cudaStream_t; NULL: the legacy default
 * stream), on the connection's push stream (muon_client_push_stream), so that `cuda_stream` never
 * waits for the server. cuda_ipc: straight into the server's GPU (nccl: ncclSend), returns once
 * the copies are enqueued (keep device_ptr alive and unchanged until the push stream has passed
 * them: work on `cuda_stream` after muon_client_wait_update_device of the step is); shm: staged
 * through host memory, returns once pushed. MUON_ERR_INVALID when device_ptr is not device
 * memory. */
int muon_client_push_device(muon_client* c, const char* name, int64_t step, int64_t offset,
                            const void* device_ptr, int64_t count, void* cuda_stream);
/* Pushes `count` elements (grad dtype) at packed position `packed` of this rank's push ranges
 * sorted and laid end to end (a sharded rank's local tensor): a column block (a row range x a
 * column range, one range per row) goes as one push, chunked only by the slot size, and the
 * server scatters it into the matrix. MUON_ERR_INVALID when [packed, packed + count) is not
 * inside the rank's push elements (nothing pushed). */
int muon_client_push_packed(muon_client* c, const char* name, int64_t step, int64_t packed,
                            const void* data, int64_t count);
/* muon_client_push_packed from CUDA device memory, as muon_client_push_device. */
int muon_client_push_packed_device(muon_client* c, const char* name, int64_t step, int64_t packed,
                                   const void* device_ptr, int64_t count, void* cuda_stream);
/* The cudaStream_t that muon_client_push_device of `name` copies on (*cuda_stream; NULL on shm),
 * for a caching allocator's record-stream call on the pushed buffer. MUON_ERR_INVALID for an
 * unknown parameter. */
int muon_client_push_stream(muon_client* c, const char* name, void** cuda_stream);
/* Declares this rank's pushes of (name, step) complete; the server starts the step once every
 * contributor committed. A rank whose push ranges are empty (an empty shard) contributes nothing:
 * it need not commit, and a commit from it is ignored (before or after the others pushed). */
int muon_client_commit(muon_client* c, const char* name, int64_t step);
/* Waits for the update; writes the packed want ranges (update dtype) to dst (dst_bytes checked).
 * *applied is 0 when the server skipped the step (zeros). */
int muon_client_wait_update(muon_client* c, const char* name, int64_t step, void* dst,
                            int64_t dst_bytes, int* applied);
/* muon_client_wait_update into CUDA device memory (dst_bytes checked): the values are there for
 * work queued on `cuda_stream` after the call (cuda_ipc: returns once the copy is enqueued; shm:
 * once it is done). On MUON_ERR_INVALID / MUON_ERR_DEVICE / MUON_ERR_UNAVAILABLE the update stays
 * held: a later wait of the same step still gets it. */
int muon_client_wait_update_device(muon_client* c, const char* name, int64_t step, void* device_dst,
                                   int64_t dst_bytes, void* cuda_stream, int* applied);
/* 1 when the update of (name, step) is complete, 0 when not, < 0 on error. */
int muon_client_update_ready(muon_client* c, const char* name, int64_t step);
/* Where the update of (name, step) stands, as muon_client_wait_update would find it now; never
 * waits: 0 pending (the wait would wait), 1 complete, 2 failed (the server failed the step: the
 * wait returns its error), 3 the connection is lost; < 0 on error. */
int muon_client_update_state(muon_client* c, const char* name, int64_t step);

/* Momentum (fp32, all numel elements) of a parameter, and its last applied step. */
int muon_client_fetch_momentum(muon_client* c, const char* name, float* dst, int64_t numel,
                               int64_t* last_step);
/* The same once the parameter's step has reached after_step (the caller's last optimizer step;
   -1: now): a rank that wants no update of the parameter returns from its step before the
   others have pushed theirs. The server answers at the latest after its step timeout, with what
   it holds then. */
int muon_client_fetch_momentum_after(muon_client* c, const char* name, int64_t after_step,
                                     float* dst, int64_t numel, int64_t* last_step);
int muon_client_load_momentum(muon_client* c, const char* name, int64_t step, const float* src,
                              int64_t numel);
int muon_client_snapshot(muon_client* c, int server, const char* path);
/* Whether a server reported a rank of this job lost (it tells every rank at once, between steps
 * too): *rank = the lowest such rank and `message` its report (NUL-terminated, truncated to
 * message_len - 1 bytes), or *rank = -1 when none was. Trainers check it before their own
 * collectives, so that a dead peer surfaces as the server's verdict. */
int muon_client_lost_peer(muon_client* c, int* rank, char* message, int64_t message_len);
/* What server `server` keeps through a crash, as its hello said: its --snapshot path
 * (NUL-terminated, truncated to path_len - 1 bytes; "" none) and *every its --snapshot-every
 * steps (0: only on request and when stopped; -1: not connected, or a server that does not
 * say); *lost = 1 when the connection to it was lost, else 0. */
int muon_client_snapshot_config(muon_client* c, int server, char* path, int64_t path_len,
                                int64_t* every, int* lost);
/* Reconnects to every server and registers every parameter again. */
int muon_client_reconnect(muon_client* c);

/* Closes this rank's step once it holds every update: sends a step report to every server (it
 * feeds the server's muon_offload_client_exposed_wait_seconds and `muon-offload status`) and
 * returns the figures accumulated since the previous report: seconds spent blocked in
 * muon_client_wait_update, gradient bytes pushed, updates taken, and the name of the parameter
 * whose update arrived last (NUL-terminated, truncated to slowest_len - 1 bytes). `step` is a
 * label (the optimizer's step). Every output pointer may be NULL. */
int muon_client_report_step(muon_client* c, int64_t step, double* exposed_wait_s,
                            int64_t* bytes_pushed, int* parameters, char* slowest,
                            int64_t slowest_len);

/* The push frames (ring slots of gradient bytes) of the step the last muon_client_report_step
 * closed, into *push_frames: one per slot-sized chunk of each push (a column block pushed with
 * muon_client_push_packed is one when it fits a slot). */
int muon_client_last_push_frames(muon_client* c, int64_t* push_frames);

/* The in-process Muon (muon_local_update) is not in this library: it is
 * libmuon_offload_reference.so (muon_reference.h), so that trainers that offload load no BLAS. */

#ifdef __cplusplus
}
#endif

#endif /* MUON_CLIENT_H_ */
