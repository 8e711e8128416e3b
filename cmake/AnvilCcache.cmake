# ccache in front of the compiler. PCH-compatible settings: ccache only reuses
# results of TUs that use a precompiled header with these sloppiness flags.
find_program(ANVIL_CCACHE ccache)
if(ANVIL_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}"
      ${ANVIL_CCACHE})
  set(ANVIL_CCACHE_PCH_FLAGS -fpch-preprocess)
  message(STATUS "anvil: using ccache at ${ANVIL_CCACHE}")
endif()
