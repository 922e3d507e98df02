// OpenBLAS' thread count, for the duration of a computation. The count is one setting of the
// whole process, shared with everything else on the same OpenBLAS (PyTorch built on the system
// OpenBLAS, as Debian's python3-torch is): a library running inside another program sets it only
// while it computes.
#pragma once

namespace muon {

/// Sets OpenBLAS' thread count to `threads` when > 0 (else leaves it) and puts the previous count
/// back when destroyed. Not for concurrent use from several threads of one process.
class ScopedBlasThreads {
 public:
  explicit ScopedBlasThreads(int threads);
  ~ScopedBlasThreads();
  ScopedBlasThreads(const ScopedBlasThreads&) = delete;
  ScopedBlasThreads& operator=(const ScopedBlasThreads&) = delete;

  /// OpenBLAS' current thread count (openblas_get_num_threads).
  static int current();

 private:
  int previous_ = 0;  // 0: nothing to restore
};

}  // namespace muon
