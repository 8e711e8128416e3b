// src/kernels/draw.cu compiled by g++ against the host stand-in of the CUDA
// runtime (tests/kernels/emulation/cuda_runtime.h), for the emulated kernels' tests.
#include "kernels/draw.cu"
