#include "kernels/blas_threads.hpp"

#include <cblas.h>

namespace muon {

ScopedBlasThreads::ScopedBlasThreads(int threads) {
  if (threads <= 0) return;
  previous_ = openblas_get_num_threads();
  if (previous_ != threads) {
    openblas_set_num_threads(threads);
  } else {
    previous_ = 0;
  }
}

ScopedBlasThreads::~ScopedBlasThreads() {
  if (previous_ > 0) openblas_set_num_threads(previous_);
}

int ScopedBlasThreads::current() {
  return openblas_get_num_threads();
}

}  // namespace muon
