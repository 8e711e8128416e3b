#include "generation/sampling.h"

#include <ATen/ATen.h>

#include <cmath>

#include "kernels/draw.h"

namespace anvil::generation {

at::Tensor apply_penalties(const at::Tensor& scores_in, const at::Tensor& seen, const at::Tensor& counts,
                           const WarpOptions& o) {
  auto scores = scores_in;
  if (o.repetition_penalty != 1.0 && seen.defined()) {
    // transformers' RepetitionPenaltyLogitsProcessor: every token of the prompt and the output so far.
    auto penalised = at::where(scores < 0, scores * o.repetition_penalty, scores / o.repetition_penalty);
    scores = at::where(seen, penalised, scores);
  }
  if ((o.presence_penalty != 0.0 || o.frequency_penalty != 0.0) && counts.defined()) {
    auto minus = counts * o.frequency_penalty;
    if (o.presence_penalty != 0.0) minus = minus + (counts > 0).to(scores.scalar_type()) * o.presence_penalty;
    scores = scores - minus;
  }
  return scores;
}

at::Tensor warp(const at::Tensor& scores_in, const WarpOptions& o) {
  auto scores = scores_in;
  const auto V = scores.size(-1);
  if (o.temperature != 1.0) scores = scores / o.temperature;
  if (o.top_k > 0 && o.top_k < V) {
    auto kth = std::get<0>(scores.topk(o.top_k, -1)).narrow(-1, o.top_k - 1, 1);  // (B, 1)
    scores = scores.masked_fill(scores < kth, -INFINITY);
  }
  if (o.top_p < 1.0) {
    // Ascending: drop the tokens whose cumulative mass stays within 1 - top_p; the likeliest always stays.
    auto [sorted, idx] = scores.sort(/*dim=*/-1, /*descending=*/false);
    auto drop_sorted = sorted.softmax(-1).cumsum(-1) <= (1.0 - o.top_p);
    drop_sorted.narrow(-1, V - 1, 1).fill_(false);
    scores = scores.masked_fill(drop_sorted.scatter(-1, idx, drop_sorted), -INFINITY);
  }
  if (o.min_p > 0.0) {
    // Tokens less likely than min_p times the likeliest; the likeliest itself always stays.
    auto probs = scores.softmax(-1);
    auto drop = probs < probs.amax(-1, /*keepdim=*/true) * o.min_p;
    drop.scatter_(-1, probs.argmax(-1, /*keepdim=*/true), false);
    scores = scores.masked_fill(drop, -INFINITY);
  }
  return scores;
}

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int64_t as_signed(uint64_t x) {
  int64_t out;
  static_assert(sizeof out == sizeof x);
  __builtin_memcpy(&out, &x, sizeof out);
  return out;
}

/// x >> s as an unsigned 64-bit shift, on int64 tensors (ATen shifts signed values arithmetically).
at::Tensor shr(const at::Tensor& x, int s) {
  return at::bitwise_and(at::bitwise_right_shift(x, s), as_signed((uint64_t{1} << (64 - s)) - 1));
}

/// mix64 elementwise on int64 tensors; multiplication wraps modulo 2^64 on every backend.
at::Tensor mix(at::Tensor z) {
  z = at::bitwise_xor(z, shr(z, 30)).mul(as_signed(0xBF58476D1CE4E5B9ull));
  z = at::bitwise_xor(z, shr(z, 27)).mul(as_signed(0x94D049BB133111EBull));
  return at::bitwise_xor(z, shr(z, 31));
}

}  // namespace

uint64_t row_key(uint64_t seed) { return mix64(seed + kGolden); }

at::Tensor counter_uniform(const at::Tensor& keys, const at::Tensor& step, int64_t vocab) {
  TORCH_CHECK(keys.dim() == 1 && keys.scalar_type() == at::kLong, "counter_uniform: keys must be (B) int64");
  TORCH_CHECK(step.dim() == 0 && step.scalar_type() == at::kLong, "counter_uniform: step must be a 0-dim int64");
  // One stream per (row, step), then one value per vocabulary index.
  auto base = mix(keys + step.mul(as_signed(kGolden)));                                          // (B)
  auto cols = mix(at::arange(vocab, keys.options()).mul(as_signed(0xD1B54A32D192ED03ull)) + 1);  // (V)
  auto z = mix(at::bitwise_xor(base.unsqueeze(1), cols.unsqueeze(0)));                           // (B, V)
  // The top 52 bits, centred in their interval: exactly representable, never 0 or 1.
  return (shr(z, 12).to(at::kDouble) + 0.5) * std::ldexp(1.0, -52);
}

at::Tensor draw(const at::Tensor& scores, const at::Tensor& keys, const at::Tensor& step) {
  TORCH_CHECK(scores.dim() == 2 && keys.size(0) == scores.size(0), "draw: scores must be (B, V) with B keys");
  // Inverse CDF: one uniform per row against the cumulative probabilities (kernels/draw: one kernel on CUDA).
  return kernels::inverse_cdf_draw(scores, counter_uniform(keys, step, 1).squeeze(1));
}

bool is_greedy(const SamplingOptions& opt) { return opt.greedy || opt.temperature <= 0; }

bool wants_penalties(const SamplingOptions& opt) {
  return opt.repetition_penalty != 1.0 || opt.presence_penalty != 0.0 || opt.frequency_penalty != 0.0;
}

at::Tensor final_scores(const at::Tensor& scores, const SamplingOptions& opt) {
  return is_greedy(opt) ? scores : warp(scores, opt);
}

at::Tensor choose(const at::Tensor& final, const SamplingOptions& opt, const at::Tensor& keys, const at::Tensor& step) {
  return is_greedy(opt) ? final.argmax(-1) : draw(final, keys, step);
}

}  // namespace anvil::generation
