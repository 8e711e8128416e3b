#pragma once
// Plain types shared by the kernels' launch headers (kernels/*_launch.h), so
// that each .cu compiles with nvcc alone, without LibTorch's headers.

namespace anvil::kernels::cuda {

/// The element types the kernels read and write.
enum class Dtype { kFloat, kHalf, kBFloat16 };

}  // namespace anvil::kernels::cuda
