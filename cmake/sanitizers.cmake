# Sanitizer and fuzzing builds (scripts/sanitize.sh, scripts/fuzz.sh, CMakePresets.json).
#
#   MUON_OFFLOAD_SANITIZE=address  AddressSanitizer + UndefinedBehaviorSanitizer; UB aborts
#                                  (-fno-sanitize-recover) so a CTest run fails on the first report.
#   MUON_OFFLOAD_SANITIZE=thread   ThreadSanitizer.
#   MUON_OFFLOAD_FUZZ=ON           clang only: every target gets libFuzzer's coverage
#                                  instrumentation plus ASan + UBSan; tests/fuzz links the
#                                  harnesses with -fsanitize=fuzzer (the libFuzzer main).
# The flags apply to C and C++ only: nvcc does not take them (the presets build with CUDA OFF).

set(_muon_sanitize_flags "")
if(MUON_OFFLOAD_SANITIZE STREQUAL "address")
  set(_muon_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined
                           -fno-omit-frame-pointer)
elseif(MUON_OFFLOAD_SANITIZE STREQUAL "thread")
  set(_muon_sanitize_flags -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT MUON_OFFLOAD_SANITIZE STREQUAL "none")
  message(FATAL_ERROR "MUON_OFFLOAD_SANITIZE must be address, thread or none, got '${MUON_OFFLOAD_SANITIZE}'")
endif()

if(MUON_OFFLOAD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "MUON_OFFLOAD_FUZZ needs clang (libFuzzer); scripts/fuzz.sh uses clang++-16")
  endif()
  if(NOT MUON_OFFLOAD_SANITIZE STREQUAL "none")
    message(FATAL_ERROR "MUON_OFFLOAD_FUZZ brings its own sanitizers; leave MUON_OFFLOAD_SANITIZE at none")
  endif()
  set(_muon_sanitize_flags -fsanitize=fuzzer-no-link,address,undefined
                           -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
endif()

if(_muon_sanitize_flags)
  foreach(_flag IN LISTS _muon_sanitize_flags)
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:${_flag}>)
  endforeach()
  # fuzzer-no-link is a compile-time flag; linking takes the sanitizer runtimes only.
  list(REMOVE_ITEM _muon_sanitize_flags -fsanitize=fuzzer-no-link,address,undefined)
  if(MUON_OFFLOAD_FUZZ)
    list(APPEND _muon_sanitize_flags -fsanitize=address,undefined)
  endif()
  add_link_options(${_muon_sanitize_flags})
  message(STATUS "muon-offload: sanitizer flags ${_muon_sanitize_flags}")
endif()
