#pragma once
// The CPU pass of AdamW with bfloat16 moments (optimizer.state_dtype:
// bfloat16; optim::adamw_step_low_precision_state drives it): plain float32
// arithmetic over raw arrays, compiled on its own with -fno-math-errno so
// that its loop, square root included, vectorizes, for AVX-512, AVX2 and
// plain x86-64 (function multiversioning). No LibTorch header.

#include <cstdint>

namespace anvil::optim {

struct LowPrecisionAdamW {
  float decay;  // lr * weight_decay
  float beta1, beta2, eps;
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  uint32_t seed_lo, seed_hi;    // the stochastic rounding's draw
  /// Elements [first, last): p -= decay p; m = m + (1 - b1)(g - m);
  /// v = b2 v + (1 - b2) g^2; p -= step_size m / (sqrt(v) / bc2 + eps) (torch's
  /// fused AdamW in float32), then m and v (bfloat16 bit patterns) stored
  /// with stochastic rounding from a hash of (element index, seed).
  void run(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t first, int64_t last) const;
};

}  // namespace anvil::optim
