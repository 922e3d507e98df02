// A shared library the client library loads at run time instead of linking it (the CUDA runtime,
// NCCL): the copy already in the process when there is one (PyTorch's, found by soname with
// RTLD_NOLOAD), else the first candidate that loads. RTLD_LOCAL throughout: nothing of it is made
// visible to the libraries loaded later.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <string>

namespace muon::client {

struct RuntimeLibrary {
  void* handle = nullptr;
  std::string origin;   ///< "NAME (already loaded)", or the candidate that loaded; "" when none
  std::string failure;  ///< each candidate's dlerror, "; "-separated, when none loaded

  /// The entry point `name`, or nullptr (no library, or it lacks the symbol).
  void* entry(const char* name) const { return handle ? dlsym(handle, name) : nullptr; }
};

/// The first of `sonames` already loaded, else the first of `candidates` (sonames or paths)
/// that dlopen loads.
inline RuntimeLibrary load_runtime_library(std::initializer_list<const char*> sonames,
                                           std::initializer_list<const char*> candidates) {
  RuntimeLibrary lib;
  for (const char* name : sonames) {
    if ((lib.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD))) {
      lib.origin = std::string(name) + " (already loaded)";
      return lib;
    }
  }
  for (const char* name : candidates) {
    if ((lib.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL))) {
      lib.origin = name;
      return lib;
    }
    const char* e = dlerror();
    lib.failure += std::string(lib.failure.empty() ? "" : "; ") + (e ? e : name);
  }
  return lib;
}

}  // namespace muon::client
