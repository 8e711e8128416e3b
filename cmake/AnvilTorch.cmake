# Locate LibTorch from the PyPI torch wheel in the project venv when the caller
# did not point CMake at it (scripts/build.sh passes it explicitly).
if(NOT Torch_DIR AND NOT DEFINED ENV{Torch_DIR})
  set(_anvil_py "${CMAKE_SOURCE_DIR}/.venv/bin/python")
  if(EXISTS "${_anvil_py}")
    execute_process(
      COMMAND "${_anvil_py}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _anvil_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _anvil_rc)
    if(_anvil_rc EQUAL 0)
      list(APPEND CMAKE_PREFIX_PATH "${_anvil_torch_prefix}")
    endif()
  endif()
endif()
# A CUDA wheel makes Caffe2's CMake probe the local GPUs with a try_run; give
# it the architectures instead (Hopper: H100/H200) so configuring works on
# machines without a GPU. Override with -DTORCH_CUDA_ARCH_LIST=...
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for LibTorch's CUDA flags")
endif()
set(CMAKE_CUDA_STANDARD 17)
find_package(Torch REQUIRED)
# TORCH_LIBRARIES carries the CUDA libraries of a CUDA wheel; the include dirs
# come from the imported `torch` target. Torch's own fmt headers live in its
# include dir, so nothing that uses Debian's spdlog/fmt may see them.
