#include "kernels/dispatch.h"

namespace anvil::kernels {

bool cuda_kernels_built() {
#if ANVIL_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

}  // namespace anvil::kernels
