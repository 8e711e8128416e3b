# Private copies of the libstdc++ code that the torch wheel exports too.
#
# The wheel's libtorch.so (built on manylinux with a newer GCC) exports its own
# copies of std::filesystem, the string streams, a few std::string members and
# the std::__throw_* helpers.
# Its std::filesystem::remove_all calls a newer libstdc++'s internals through a
# weak reference that is null against GCC 12/13's libstdc++, so a process in
# which the dynamic linker finds libtorch's copy first (libtorch earlier in
# DT_NEEDED, as Ubuntu's toolchain orders it, or LD_PRELOAD) crashes pruning
# checkpoints. DT_NEEDED order cannot be trusted, so the symbols are not looked
# up at run time at all: the stateless members of the compiler's own
# libstdc++.a that define them (no global data, so no second copy of any
# locale id or other process-wide object) are linked into each Anvil binary
# and hidden there (--exclude-libs). The dynamic linker never sees a reference
# it could bind to torch. tests/core/symbol_binding_test.sh checks the result.
#
# anvil_link_private_stdcxx(<target>) links the archive into <target>; it must
# come before LibTorch on the link line, which target_link_libraries order gives.
set(_anvil_stdcxx_members
  fs_ops.o fs_dir.o fs_path.o cow-fs_ops.o cow-fs_dir.o cow-fs_path.o
  sstream-inst.o lt5-sstream-inst.o string-inst.o wstring-inst.o functexcept.o
  snprintf_lite.o)

execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.a
  OUTPUT_VARIABLE _anvil_libstdcxx_a OUTPUT_STRIP_TRAILING_WHITESPACE)
set(ANVIL_PRIVATE_STDCXX "" CACHE INTERNAL "")
if(IS_ABSOLUTE "${_anvil_libstdcxx_a}" AND EXISTS "${_anvil_libstdcxx_a}")
  set(_dir "${CMAKE_BINARY_DIR}/private-stdcxx")
  set(_lib "${_dir}/libanvil_private_stdcxx.a")
endif()
# Made once per compiler library: a re-run of CMake must not relink everything.
if(_lib AND (NOT EXISTS "${_lib}" OR "${_anvil_libstdcxx_a}" IS_NEWER_THAN "${_lib}"))
  file(REMOVE_RECURSE "${_dir}")
  file(MAKE_DIRECTORY "${_dir}")
  execute_process(COMMAND ${CMAKE_AR} t "${_anvil_libstdcxx_a}"
    OUTPUT_VARIABLE _all OUTPUT_STRIP_TRAILING_WHITESPACE)
  string(REPLACE "\n" ";" _all "${_all}")
  set(_have "")
  foreach(m IN LISTS _anvil_stdcxx_members)
    if(m IN_LIST _all)
      list(APPEND _have ${m})
    endif()
  endforeach()
  execute_process(COMMAND ${CMAKE_AR} x "${_anvil_libstdcxx_a}" ${_have}
    WORKING_DIRECTORY "${_dir}" RESULT_VARIABLE _rc1)
  execute_process(COMMAND ${CMAKE_AR} rcs "${_lib}" ${_have}
    WORKING_DIRECTORY "${_dir}" RESULT_VARIABLE _rc2)
  if(NOT (_rc1 EQUAL 0 AND _rc2 EQUAL 0))
    file(REMOVE "${_lib}")
  endif()
  message(STATUS "Anvil: private libstdc++ members (${_have}) from ${_anvil_libstdcxx_a}")
endif()
if(_lib AND EXISTS "${_lib}")
  set(ANVIL_PRIVATE_STDCXX "${_lib}" CACHE INTERNAL "")
endif()
if(NOT ANVIL_PRIVATE_STDCXX)
  message(WARNING "Anvil: no libstdc++.a found; std::filesystem and string streams bind at run time, "
                  "where libtorch's exported copies can win (tests/core/symbol_binding_test.sh fails)")
endif()

function(anvil_link_private_stdcxx target)
  if(ANVIL_PRIVATE_STDCXX)
    target_link_libraries(${target} PRIVATE "${ANVIL_PRIVATE_STDCXX}")
    target_link_options(${target} PRIVATE "LINKER:--exclude-libs,libanvil_private_stdcxx.a")
  endif()
endfunction()
