#include "optim/low_precision_adamw.h"

#include <cmath>
#include <cstring>

namespace anvil::optim {
namespace {

/// `x` to bfloat16 bits, its magnitude rounded up where the dropped 16 bits plus `noise` (16 bits) carry, so the
/// expectation is x. Branch-free for the vectorizer; a non-finite x is truncated (inf stays inf).
inline uint16_t round_stochastically(float x, uint32_t noise) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t finite = static_cast<uint32_t>((bits & 0x7F800000u) != 0x7F800000u);
  return static_cast<uint16_t>((bits + (noise & 0xFFFFu) * finite) >> 16);
}

/// A 32-bit integer hash (Chris Wellons' lowbias32): the rounding's random bits are a pure function of the
/// element's position and the seed, so they depend neither on the thread count nor on the split into threads.
inline uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

inline float from_bf16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f = 0;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

// Compiled three times on x86-64, for AVX-512, AVX2 and any x86-64, the loader picking the widest this CPU runs
// (GCC's function multiversioning), as ATen compiles its CPU kernels per instruction set.
#if defined(__x86_64__) && defined(__GNUC__)
#define ANVIL_PER_ISA __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ANVIL_PER_ISA
#endif
ANVIL_PER_ISA void LowPrecisionAdamW::run(float* p, const float* g, uint16_t* m, uint16_t* v, int64_t first,
                                          int64_t last) const {
  for (int64_t i = first; i < last; ++i) {
    const float gi = g[i], m0 = from_bf16(m[i]), v0 = from_bf16(v[i]);
    const float param = p[i] - decay * p[i];
    const float mi = m0 + (1 - beta1) * (gi - m0);
    const float vi = beta2 * v0 + (1 - beta2) * gi * gi;
    p[i] = param - step_size * mi / (std::sqrt(vi) / bias_correction2_sqrt + eps);
    const uint32_t bits = hash32(static_cast<uint32_t>(i) ^ seed_lo) ^ seed_hi;  // low half: m, high half: v
    m[i] = round_stochastically(mi, bits);
    v[i] = round_stochastically(vi, bits >> 16);
  }
}

}  // namespace anvil::optim
