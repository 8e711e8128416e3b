#include "kernels/draw.h"

#include <ATen/ATen.h>

#include "anvil/core/error.h"

#if ANVIL_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/draw_launch.h"
#include "kernels/fallback.h"
#endif

namespace anvil::kernels {

at::Tensor inverse_cdf_draw_reference(const at::Tensor& scores, const at::Tensor& uniforms) {
  TORCH_CHECK(scores.dim() == 2 && uniforms.dim() == 1 && uniforms.size(0) == scores.size(0),
              "inverse_cdf_draw: scores (B, V) and uniforms (B) expected");
  // Float64 sums, so that the last tokens' bins are not lost to rounding; a removed token's bin is empty.
  const auto cdf = scores.softmax(-1, at::kFloat).to(at::kDouble).cumsum(-1);  // (B, V)
  const auto target =
      uniforms.to(cdf.device(), at::kDouble).unsqueeze(1) * cdf.narrow(1, cdf.size(1) - 1, 1);  // (B, 1)
  return at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).squeeze(1).clamp_max(scores.size(1) - 1);
}

at::Tensor inverse_cdf_draw(const at::Tensor& scores, const at::Tensor& uniforms) {
#if ANVIL_WITH_CUDA_KERNELS
  static std::atomic<bool> off{false};
  if (!off.load() && scores.is_cuda() && scores.dim() == 2 && scores.scalar_type() == at::kFloat &&
      uniforms.dim() == 1 && uniforms.size(0) == scores.size(0) && scores.size(1) > 0) {
    const c10::cuda::CUDAGuard guard(scores.device());
    const auto x = scores.contiguous();
    const auto u = uniforms.to(scores.device(), at::kDouble).contiguous();
    auto out = at::empty({scores.size(0)}, scores.options().dtype(at::kLong));
    const int rc = cuda::inverse_cdf_draw(x.data_ptr<float>(), x.size(0), x.size(1), u.data_ptr<double>(),
                                          out.data_ptr<int64_t>(), c10::cuda::getCurrentCUDAStream().stream());
    if (rc == 0) return out;
    if (!detail::no_code_for_this_gpu(rc, "inverse_cdf_draw", off))
      throw Error(concat("inverse_cdf_draw: the CUDA kernel failed to launch (cudaError ", rc, ")"));
  }
#endif
  return inverse_cdf_draw_reference(scores, uniforms);
}

}  // namespace anvil::kernels
