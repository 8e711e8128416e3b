#include "models/layers.h"

#include "core/device.h"
#include "core/logging.h"
#include "kernels/dispatch.h"
#include "kernels/layer_norm.h"
#include "kernels/rope.h"
#include "kernels/glu.h"
#include "models/context_parallel.h"
#include "models/init.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <atomic>

#include <cmath>
#include <limits>
#include <optional>

namespace anvil::models {

namespace {
thread_local bool skip_init = false;
thread_local bool deferred = false;
thread_local at::Device deferred_device = at::kCPU;
}  // namespace

SkipInitGuard::SkipInitGuard() : previous_(skip_init) { skip_init = true; }
SkipInitGuard::~SkipInitGuard() { skip_init = previous_; }
bool init_skipped() { return skip_init; }

DeferredInitGuard::DeferredInitGuard(const at::Device& device)
    : previous_(deferred), previous_device_(deferred_device) {
  deferred = true;
  deferred_device = device;
}
DeferredInitGuard::~DeferredInitGuard() {
  deferred = previous_;
  deferred_device = previous_device_;
}

at::Tensor new_parameter_tensor(at::IntArrayRef shape) {
  if (!deferred) return at::empty(shape);
  // Shape and device, no bytes: sharding gives the storage (distributed::ShardedModel swaps storage in and
  // out the same way) or materialize_deferred does.
  auto t = at::empty({0}, at::TensorOptions().dtype(at::kFloat).device(deferred_device));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return t;
}

bool is_deferred(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 &&
         t.storage().nbytes() < static_cast<size_t>(t.storage_offset() + t.numel()) * t.element_size();
}

bool has_deferred(const CausalLM& model) {
  // A sharded model's parameters lack storage too (between gathers), but have no source.
  if (!model.parameter_source) return false;
  for (const auto& p : model.parameters())
    if (is_deferred(p)) return true;
  return false;
}

void materialize_deferred(CausalLM& model) {
  if (!has_deferred(model)) return;
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters()) {
    const auto& p = item.value();
    if (!is_deferred(p)) continue;
    auto* s = p.storage().unsafeGetStorageImpl();
    const auto nbytes = static_cast<size_t>(p.numel()) * p.element_size();
    s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
    s->set_nbytes(nbytes);
    p.view(-1).copy_(model.parameter_source->read(item.key(), 0, p.numel()));
  }
  model.parameter_source.reset();
}

std::pair<at::Tensor, at::Tensor> KVCache::update(size_t layer, const at::Tensor& k, const at::Tensor& v) {
  if (keys.size() <= layer) {
    keys.resize(layer + 1);
    values.resize(layer + 1);
  }
  const int64_t T = k.size(2), need = length + T;
  auto& K = keys[layer];
  auto& V = values[layer];
  if (!K.defined() || K.size(2) < need) {
    // First use, or an unreserved cache outgrowing its buffer: reallocate and copy.
    const int64_t cap = std::max({need, reserve, K.defined() ? 2 * K.size(2) : int64_t{0}});
    auto grown_k = at::empty({k.size(0), k.size(1), cap, k.size(3)}, k.options());
    auto grown_v = at::empty({v.size(0), v.size(1), cap, v.size(3)}, v.options());
    if (K.defined() && length > 0) {
      grown_k.narrow(2, 0, length).copy_(K.narrow(2, 0, length));
      grown_v.narrow(2, 0, length).copy_(V.narrow(2, 0, length));
    }
    K = grown_k;
    V = grown_v;
  }
  if (slots.defined()) {
    TORCH_CHECK(slots.numel() == T, "KVCache: ", slots.numel(), " slots for ", T, " new positions");
    K.index_copy_(2, slots, k.to(K.scalar_type()));
    V.index_copy_(2, slots, v.to(V.scalar_type()));
    return {K, V};
  }
  K.narrow(2, length, T).copy_(k);
  V.narrow(2, length, T).copy_(v);
  return {K.narrow(2, 0, need), V.narrow(2, 0, need)};
}

void KVCache::select_rows(const at::Tensor& index) {
  for (auto& t : keys)
    if (t.defined()) t = t.index_select(0, index);
  for (auto& t : values)
    if (t.defined()) t = t.index_select(0, index);
}

namespace layers {

RMSNormImpl::RMSNormImpl(const RMSNormOptions& o) : options(o) {
  weight = register_parameter("weight", new_parameter_tensor({o.dim()}));
  if (!init_skipped()) weight.detach().fill_(1.0);
}

at::Tensor new_parameter(at::IntArrayRef shape) { return new_parameter_tensor(shape); }

// The draws of torch::nn::Linear, Embedding and LayerNorm (torch/csrc/api/src/nn/modules), in their order,
// so a model built from a seed has the weights it had with LibTorch's modules (Layers.*MatchLibTorch).
DenseImpl::DenseImpl(const torch::nn::LinearOptions& o) : options(o) {
  weight = register_parameter("weight", new_parameter({o.out_features(), o.in_features()}));
  if (o.bias()) bias = register_parameter("bias", new_parameter({o.out_features()}));
  if (init_skipped()) {
    // kaiming_uniform_ with a = sqrt(5) draws uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)), as the bias does.
    const double bound = o.in_features() > 0 ? 1.0 / std::sqrt(static_cast<double>(o.in_features())) : 0.0;
    note_skipped_draw({weight.numel(), false, -bound, bound});
    if (bias.defined()) note_skipped_draw({bias.numel(), false, -bound, bound});
    return;
  }
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const auto fan_in = static_cast<double>(o.in_features());
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(fan_in) : 0.0;
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

EmbeddingImpl::EmbeddingImpl(const torch::nn::EmbeddingOptions& o) : options(o) {
  if (auto pad = options.padding_idx()) {
    TORCH_CHECK(*pad < o.num_embeddings() && *pad >= -o.num_embeddings(), "Embedding: padding_idx ", *pad, " outside ",
                o.num_embeddings(), " rows");
    if (*pad < 0) options.padding_idx(o.num_embeddings() + *pad);
  }
  weight = register_parameter("weight", new_parameter({o.num_embeddings(), o.embedding_dim()}));
  if (init_skipped()) {
    note_skipped_draw({weight.numel(), true, 0.0, 1.0});
    return;
  }
  torch::nn::init::normal_(weight);
  if (const auto pad = options.padding_idx()) {
    at::NoGradGuard no_grad;
    weight[*pad].fill_(0);
  }
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) {
  TORCH_CHECK(!options.max_norm(), "layers::Embedding: max_norm is not supported");
  if (!vocab_group_)
    return at::embedding(weight, ids, options.padding_idx().value_or(-1), options.scale_grad_by_freq(),
                         options.sparse());
  const int64_t rows = weight.size(0), pad = options.padding_idx().value_or(-1) - first_row_;
  const auto local = ids - first_row_;
  const auto mine = (local >= 0) & (local < rows);
  const auto e = at::embedding(weight, local.masked_fill(mine.logical_not(), 0), pad >= 0 && pad < rows ? pad : -1,
                               options.scale_grad_by_freq(), options.sparse());
  return vocab_group_->reduce(e * mine.unsqueeze(-1).to(e.scalar_type()));
}

LayerNormImpl::LayerNormImpl(const torch::nn::LayerNormOptions& o) : options(o) {
  if (!o.elementwise_affine()) return;
  weight = register_parameter("weight", new_parameter(o.normalized_shape()));
  bias = register_parameter("bias", new_parameter(o.normalized_shape()));
  if (init_skipped()) return;
  at::NoGradGuard no_grad;
  weight.fill_(1.0);
  bias.zero_();
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  return at::layer_norm(x, options.normalized_shape(), weight_for_forward(), bias_for_forward(), options.eps());
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const auto w = parallel_weight(weight);
  if (x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat)
    return at::rms_norm(x, {options.dim()}, w, options.eps());  // one fused kernel
  // HF: normalise in float32, cast back, then scale in the input dtype.
  auto h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + options.eps());
  return w * h.to(x.scalar_type());
}

at::Tensor rope_inv_freq(const RopeOptions& o, bool long_context) {
  TORCH_CHECK(o.rotary_dim() % 2 == 0 && o.rotary_dim() <= o.head_dim(), "rotary_dim ", o.rotary_dim(),
              " must be even and at most head_dim ", o.head_dim());
  // As HF: base ** (arange(0, dim, 2) / dim), in float32.
  auto exponent = at::arange(0, o.rotary_dim(), 2, at::kLong).to(at::kFloat) / static_cast<double>(o.rotary_dim());
  if (o.type() == "longrope") {
    // Phi-3 (HF _compute_longrope_parameters): 1 / (ext_factors * base ** exponent).
    const auto& f = long_context ? o.long_factor() : o.short_factor();
    TORCH_CHECK(static_cast<int64_t>(f.size()) == o.rotary_dim() / 2, "longrope: ", long_context ? "long" : "short",
                "_factor has ", f.size(), " entries, expected rotary_dim / 2 = ", o.rotary_dim() / 2);
    auto ext = at::tensor(f, at::kDouble).to(at::kFloat);
    return 1.0 / (ext * at::pow(o.theta(), exponent));
  }
  auto inv_freq = 1.0 / at::pow(o.theta(), exponent);
  if (o.type() == "default") return inv_freq;
  if (o.type() == "linear") return inv_freq / o.factor();  // HF _compute_linear_scaling_rope_parameters
  TORCH_CHECK(o.type() == "llama3", "unsupported rope type ", o.type());
  // LLaMA 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth
  // blend in between (HF _compute_llama3_parameters).
  const double old_len = static_cast<double>(o.original_max_positions());
  const double low_wavelen = old_len / o.low_freq_factor();
  const double high_wavelen = old_len / o.high_freq_factor();
  auto wavelen = 2 * M_PI / inv_freq;
  auto scaled = at::where(wavelen > low_wavelen, inv_freq / o.factor(), inv_freq);
  auto smooth = (old_len / wavelen - o.low_freq_factor()) / (o.high_freq_factor() - o.low_freq_factor());
  auto smoothed = (1 - smooth) * scaled / o.factor() + smooth * scaled;
  auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, const at::Tensor& position_ids,
                                               at::ScalarType dtype, double scale) {
  auto freqs = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq;  // (B, T, R/2)
  auto emb = at::cat({freqs, freqs}, -1).unsqueeze(1);                // (B, 1, T, R)
  if (scale == 1.0) return {emb.cos().to(dtype), emb.sin().to(dtype)};
  return {(emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return kernels::fused_ops() ? kernels::rope(x, cos, sin) : kernels::rope_forward_reference(x, cos, sin);
}

bool is_supported_activation(const std::string& name) {
  return name == "gelu" || name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "silu" || name == "swish" ||
         name == "relu";
}

at::Tensor activation(const at::Tensor& x, const std::string& name) {
  if (name == "silu" || name == "swish") return at::silu(x);
  if (name == "gelu") return at::gelu(x);
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  if (name == "relu") return at::relu(x);
  TORCH_CHECK(false, "unsupported activation ", name);
}

at::Tensor layer_norm(const LayerNorm& ln, const at::Tensor& x) {
  const auto& shape = ln->options.normalized_shape();
  const auto w = ln->weight_for_forward(), b = ln->bias_for_forward();
  if (!kernels::fused_ops() || !w.defined() || shape.size() != 1)
    return at::layer_norm(x, shape, w, b, ln->options.eps());  // the module's forward
  return kernels::layer_norm(x, w, b, ln->options.eps());
}

at::Tensor run_block(const ForwardArgs& args, size_t layer, const at::Tensor& x, const BlockFn& block) {
  const auto run = [&](const at::Tensor& in, const BlockFn& f) {
    return args.block_runner && *args.block_runner ? (*args.block_runner)(layer, in, f) : f(in);
  };
  const auto& split = args.sequence;
  if (!split.group) return run(x, block);
  const int64_t length = split.length;
  // The scope is entered inside the block function, so a recomputation in backward runs in one too.
  const BlockFn scoped = [block, length](const at::Tensor& in) {
    SequenceScope scope(length);
    return block(in);
  };
  auto y = run(layer == 0 ? split.group->scatter_sequence(x, length) : x, scoped);
  return static_cast<int64_t>(layer) + 1 == split.blocks ? split.group->gather_sequence(y, length) : y;
}

at::Tensor gated_activation(const at::Tensor& gate, const at::Tensor& up, const std::string& name) {
  if (kernels::fused_ops())
    if (const auto act = kernels::glu_activation(name)) return kernels::glu(gate, up, *act);
  return activation(gate, name) * up;
}

at::Tensor vocab_projection(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                            int64_t pad_to) {
  const int64_t V = weight.size(0);
  const int64_t pad = pad_to > 1 ? (pad_to - V % pad_to) % pad_to : 0;
  if (pad == 0) return at::linear(hidden, weight, bias);
  auto w = at::constant_pad_nd(weight, {0, 0, 0, pad});  // (V + pad, C): zero rows, differentiable
  auto b = bias.defined() ? at::constant_pad_nd(bias, {0, pad}) : at::Tensor();
  return at::linear(hidden, w, b).narrow(-1, 0, V);
}

at::Tensor lm_head(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias) {
  const bool pays = hidden.is_cuda() && at::GradMode::is_enabled();
  return vocab_projection(hidden, weight, bias, pays ? 64 : 1);
}

at::Tensor positions(const ForwardArgs& args, int64_t batch, int64_t seq, const at::Device& device) {
  if (args.position_ids.defined()) {
    TORCH_CHECK(args.position_ids.size(0) == batch && args.position_ids.size(1) == seq,
                "position_ids must be (B, T) = (", batch, ", ", seq, ")");
    return args.position_ids;
  }
  const int64_t past = args.cache ? args.cache->length : 0;
  // (1, T): broadcasts over the batch, so embeddings and rotary tables are computed once.
  return at::arange(past, past + seq, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0);
}

at::Tensor document_causal_mask(const at::Tensor& doc_ids, const at::Tensor& query_slots) {
  const auto T = doc_ids.size(1);
  if (!query_slots.defined()) {
    auto same = doc_ids.unsqueeze(2).eq(doc_ids.unsqueeze(1));                  // (B, T, T)
    auto causal = at::ones({T, T}, doc_ids.options().dtype(at::kBool)).tril();  // (T, T)
    return same.logical_and(causal).unsqueeze(1);                               // (B, 1, T, T)
  }
  const auto slots = query_slots.to(doc_ids.device());
  const auto same = doc_ids.index_select(1, slots).unsqueeze(2).eq(doc_ids.unsqueeze(1));  // (B, T_q, T)
  const auto causal = at::arange(T, slots.options()).unsqueeze(0) <= slots.unsqueeze(1);   // (T_q, T)
  return same.logical_and(causal).unsqueeze(1);                                            // (B, 1, T_q, T)
}

namespace {

std::optional<at::Tensor> packed_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const PackedDocuments& docs, const AttentionOptions& o) {
  static std::atomic<bool> refused{false};
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3);
  const auto dtype = q.scalar_type();
  // Flash attention's limits: 16-bit inputs, head size a multiple of 8 up to 256, no soft-capping.
  // Not yet run on a GPU: only when asked (train.unverified_cuda, core/device.h).
  if (!q.is_cuda() || !unverified_cuda_allowed() || (dtype != at::kHalf && dtype != at::kBFloat16) || D % 8 != 0 ||
      D > 256 || o.softcap > 0 || !docs.cu_seqlens.defined() || refused.load())
    return std::nullopt;
  // (B, H, T, D) -> (B * T, H, D): the rows' tokens end to end, as cu_seqlens counts them.
  const auto flat = [&](const at::Tensor& x) { return x.transpose(1, 2).reshape({B * T, x.size(1), D}); };
  const auto scale = o.scale > 0 ? std::optional<double>(o.scale) : std::nullopt;
  // transformers' window (key j seen by query i when i - W < j <= i) is flash's left window W - 1.
  const auto left = o.sliding_window > 0 ? std::optional<int64_t>(o.sliding_window - 1) : std::nullopt;
  const auto right = o.sliding_window > 0 ? std::optional<int64_t>(0) : std::nullopt;
  try {
    auto y = std::get<0>(at::_flash_attention_forward(
        flat(q), flat(k), flat(v), docs.cu_seqlens, docs.cu_seqlens, docs.max_seqlen, docs.max_seqlen, o.dropout,
        /*is_causal=*/true, /*return_debug_mask=*/false, scale, left, right));
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) log::info("packed rows: flash attention over the documents' cumulative lengths, no mask");
    return y.reshape({B, T, Hq * D});
  } catch (const c10::Error& e) {
    // A GPU older than Ampere, or a LibTorch built without flash attention: the mask for the rest of the run.
    if (!refused.exchange(true))
      log::warn("packed rows: flash attention refused (", e.what_without_backtrace(),
                "); attending through the block-diagonal mask instead, which is slower");
    return std::nullopt;
  }
}

}  // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, const ForwardArgs& args,
                     size_t layer, const AttentionOptions& o) {
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3);
  TORCH_CHECK(Hq % k_new.size(1) == 0, "key/value heads must divide query heads");
  at::Tensor given_mask = args.attention_mask;
  // Context parallelism: this rank's queries over the whole row's keys and values, masked by row slots.
  const auto* share = args.context.get();
  TORCH_CHECK(!share || !args.cache, "attention: context parallelism runs whole rows, without a KV cache");
  if (args.documents.defined() && !args.cache && !given_mask.defined() && !share) {
    if (auto y = packed_flash_attention(q, k_new, v_new, args.documents, o)) return *y;
    given_mask = document_causal_mask(args.documents.doc_ids);
  }
  if (share && share->ring()) {  // keys and values pass around the group (dist.context_parallel_mode: ring)
    TORCH_CHECK(o.dropout == 0, "attention: ring attention has no attention dropout");
    const auto y = share->ring_attention(q, k_new, v_new, given_mask, o.sliding_window, o.scale, o.softcap);
    return y.transpose(1, 2).reshape({B, T, Hq * D});
  }
  at::Tensor k = share ? share->gather(k_new) : k_new, v = share ? share->gather(v_new) : v_new;
  const int64_t past = args.cache ? args.cache->length : 0;
  if (args.cache) std::tie(k, v) = args.cache->update(layer, k_new, v_new);
  const bool gqa = k.size(1) != Hq;
  const int64_t S = k.size(2);
  const auto idx = q.options().dtype(at::kLong);
  // Query slot i: past + i, or the cache's slot when the positions live on the device.
  const auto query_slots = [&] {
    if (share) return share->slots().unsqueeze(1);
    return (args.cache && args.cache->slots.defined() ? args.cache->slots.to(at::kLong) : at::arange(T, idx) + past)
        .unsqueeze(1);
  };
  // Which key slots each query sees: `mask` (true = may attend), or plain causal when `causal`.
  at::Tensor mask;
  bool causal = false;
  if (o.sliding_window > 0 && S > o.sliding_window) {
    // The window binds: slots are positions within a left-padded row or a packed document.
    const auto qi = query_slots();
    const auto kj = at::arange(S, idx).unsqueeze(0);
    auto band = (kj <= qi).logical_and(kj > qi - o.sliding_window);  // (T, S)
    mask = given_mask.defined() ? given_mask.logical_and(band) : band;
  } else if (given_mask.defined()) {
    mask = given_mask;
  } else if (!share && (past == 0 || T == 1)) {
    causal = past == 0 && T > 1;  // one new token sees everything cached
  } else {
    mask = at::arange(S, idx).unsqueeze(0) <= query_slots();  // query i (past + i) sees keys 0 .. past + i
  }
  const double scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(D));
  at::Tensor y;
  if (o.softcap > 0) {
    // transformers' eager attention with soft-capping (Gemma 2): SDPA has no cap.
    const auto rep = Hq / k.size(1);
    const auto kk = rep > 1 ? k.repeat_interleave(rep, 1) : k, vv = rep > 1 ? v.repeat_interleave(rep, 1) : v;
    auto scores = at::matmul(q, kk.transpose(-2, -1)) * scale;
    scores = at::tanh(scores / o.softcap) * o.softcap;
    if (causal) mask = at::ones({T, S}, idx.dtype(at::kBool)).tril();
    if (mask.defined()) scores = scores.masked_fill(mask.logical_not(), std::numeric_limits<float>::lowest());
    auto probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    if (o.dropout > 0) probs = at::dropout(probs, o.dropout, true);
    y = at::matmul(probs, vv);
  } else {
    const auto s = o.scale > 0 ? std::optional<double>(o.scale) : std::nullopt;
    const auto m = mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
    y = at::scaled_dot_product_attention(q, k, v, m, o.dropout, causal, s, gqa);
  }
  return y.transpose(1, 2).reshape({B, T, Hq * D});  // (B, T, Hq * D)
}

}  // namespace layers
}  // namespace anvil::models
