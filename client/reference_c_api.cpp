// The C ABI of client/muon_reference.h: the in-process reference over the CPU backend.
#include <memory>
#include <string>

#include "client/c_abi_args.hpp"
#include "client/c_abi_status.hpp"
#include "client/muon_reference.h"
#include "kernels/blas_threads.hpp"
#include "kernels/cpu_backend.hpp"

struct muon_reference {
  int threads = 0;
  muon::CpuBackend backend;  // OpenBLAS' count left alone: ScopedBlasThreads sets it per update
};

namespace {

thread_local muon::capi::CAbiStatus g_last;

int update(muon_reference& r, const char* name, const int64_t* shape, int ndim,
           const char* options_json, const float* grad, float* momentum, float* out) {
  const std::string n = name ? name : "?";
  const auto s = muon::matrix_shape_from_dims(muon::capi::dims(shape, ndim), n);
  const auto options = muon::capi::options(options_json);
  if (!grad || !out) throw muon::InvalidArgument("matrix '" + n + "': null gradient or update");
  muon::ScopedBlasThreads blas(r.threads);
  return r.backend.muon_update(n, s, grad, momentum, out, options) ? 0 : 1;
}

}  // namespace

extern "C" {

const char* muon_reference_last_error(void) {
  return g_last.message.c_str();
}

int muon_reference_last_error_code(void) {
  return static_cast<int>(g_last.code);
}

int muon_reference_create(int threads, muon_reference** out) {
  return muon::capi::guarded(g_last, [&] {
    if (!out) throw muon::InvalidArgument("muon_reference_create: null out");
    if (threads < 0) throw muon::InvalidArgument("muon_reference_create: threads must be >= 0");
    auto r = std::make_unique<muon_reference>();
    r->threads = threads;
    *out = r.release();
    return MUON_OK;
  });
}

void muon_reference_destroy(muon_reference* r) {
  delete r;
}

int muon_reference_update(muon_reference* r, const char* name, const int64_t* shape, int ndim,
                          const char* options_json, const float* grad, float* momentum,
                          float* update_out) {
  return muon::capi::guarded(g_last, [&] {
    if (!r) throw muon::InvalidArgument("muon_reference_update: null handle");
    return update(*r, name, shape, ndim, options_json, grad, momentum, update_out);
  });
}

int muon_local_update(const char* name, const int64_t* shape, int ndim, const char* options_json,
                      const float* grad, float* momentum, float* update_out, int threads) {
  return muon::capi::guarded(g_last, [&] {
    if (threads < 0) throw muon::InvalidArgument("muon_local_update: threads must be >= 0");
    // One reference per calling thread, so its work buffers stay warm across calls.
    thread_local muon_reference r;
    r.threads = threads;
    return update(r, name, shape, ndim, options_json, grad, momentum, update_out);
  });
}

}  // extern "C"
