#include "train/objectives/lm_loss.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <limits>
#include <optional>

#include "kernels/cross_entropy.h"

namespace anvil::train {
namespace {

/// The head with its vocabulary padded for the GEMMs.
struct PaddedHead {
  at::Tensor weight, bias;  // (Vp, C), (Vp) or undefined
  int64_t vocab = 0, padded = 0;
};

PaddedHead pad_head(const at::Tensor& weight, const at::Tensor& bias, int64_t pad_to) {
  PaddedHead p;
  p.vocab = weight.size(0);
  const int64_t pad = pad_to > 1 ? (pad_to - p.vocab % pad_to) % pad_to : 0;
  p.padded = p.vocab + pad;
  p.weight = pad ? at::constant_pad_nd(weight, {0, 0, 0, pad}) : weight;
  if (bias.defined()) p.bias = pad ? at::constant_pad_nd(bias, {0, pad}) : bias;
  return p;
}

std::optional<at::Tensor> optional_bias(const at::Tensor& bias) {
  return bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
}

/// A chunk's logits h W^T + b (n, Vp), in the hidden states' dtype.
at::Tensor head_logits(const at::Tensor& h, const PaddedHead& head) {
  return head.bias.defined() ? at::addmm(head.bias, h, head.weight.t()) : at::mm(h, head.weight.t());
}

int64_t resolved_pad(const at::Tensor& hidden, const FusedLossOptions& o) {
  if (o.pad_to > 0) return o.pad_to;
  return hidden.is_cuda() ? 64 : 1;
}

/// One chunk: the summed loss of rows with a target and, when `grad` is given,
/// d loss / d logits (n, Vp) in the logits' dtype (zero rows where no target),
/// written over the logits (kernels/cross_entropy: one CUDA kernel per chunk).
at::Tensor chunk_loss(const at::Tensor& h, const PaddedHead& head, const at::Tensor& y, int64_t ignore_index,
                      at::Tensor* grad) {
  auto logits = head_logits(h, head);
  auto loss = kernels::cross_entropy_rows(logits, y, head.vocab, ignore_index, grad != nullptr).sum();
  if (grad != nullptr) *grad = logits;
  return loss;
}

/// The head's gradients, summed chunk by chunk from each chunk's gradient of
/// its logits (n, Vp): rows of d hidden, and d weight / d bias (in float over
/// several chunks), cut back to the real vocabulary at the end.
struct HeadGradients {
  bool need_h, need_w, need_b, chunks;
  at::ScalarType acc;
  at::Tensor h, w, b;

  HeadGradients(const at::Tensor& hidden, bool nh, bool nw, bool nb, int64_t chunk)
      : need_h(nh),
        need_w(nw),
        need_b(nb),
        chunks(chunk < hidden.size(0)),
        acc(hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat),
        h(nh ? at::empty_like(hidden) : at::Tensor()) {}

  /// Rows [s, s + n) with inputs `x` (n, C) and logit gradient `g` (n, Vp).
  void add(int64_t s, int64_t n, const at::Tensor& x, const at::Tensor& g, const PaddedHead& head) {
    if (need_h) {
      auto rows = h.narrow(0, s, n);
      at::mm_out(rows, g, head.weight);
    }
    if (need_w) {
      auto part = at::mm(g.t(), x);
      if (!w.defined())
        w = chunks ? part.to(acc) : part;
      else
        w.add_(part);
    }
    if (need_b) {
      auto part = g.sum(0, false, acc);
      b = b.defined() ? b.add_(part) : part;
    }
  }
  /// {d hidden, d weight, d bias}, in the parameters' dtypes (zeros where no chunk ran).
  std::array<at::Tensor, 3> finish(const at::Tensor& weight, const at::Tensor& bias, const PaddedHead& head) {
    if (need_w) w = w.defined() ? w.narrow(0, 0, head.vocab).to(weight.scalar_type()) : at::zeros_like(weight);
    if (need_b) b = b.defined() ? b.narrow(0, 0, head.vocab).to(bias.scalar_type()) : at::zeros_like(bias);
    return {h, w, b};
  }
};

struct FusedLinearCrossEntropy : public torch::autograd::Function<FusedLinearCrossEntropy> {
  // The bias travels as an optional: autograd takes no undefined tensor as an input.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const std::optional<at::Tensor>& maybe_bias, const at::Tensor& targets, int64_t chunk,
                            int64_t pad_to, int64_t ignore_index, bool need_h, bool need_w, bool need_b) {
    const auto bias = maybe_bias.value_or(at::Tensor());
    const auto head = pad_head(weight, bias, pad_to);
    const int64_t N = hidden.size(0);
    const auto acc = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    HeadGradients grads(hidden, need_h, need_w, need_b, chunk);
    at::Tensor total = at::zeros({}, hidden.options().dtype(acc));
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const auto h = hidden.narrow(0, s, n);
      at::Tensor g;
      total.add_(chunk_loss(h, head, targets.narrow(0, s, n), ignore_index, &g));
      grads.add(s, n, h, g, head);
    }
    const auto [gh, gw, gb] = grads.finish(weight, bias, head);
    ctx->saved_data["gh"] = gh;
    ctx->saved_data["gw"] = gw;
    ctx->saved_data["gb"] = gb;
    return total;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto& go = grad_out.at(0);
    auto scaled = [&](const char* key) {
      auto t = ctx->saved_data[key].toTensor();
      return t.defined() ? t * go.to(t.scalar_type()) : t;
    };
    return {scaled("gh"), scaled("gw"), scaled("gb"), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

/// A chunk's float log-softmax of (h W^T + b) / temperature over the real vocabulary (padding at -inf).
at::Tensor chunk_log_softmax(const at::Tensor& h, const PaddedHead& head, double temperature) {
  auto logits = head_logits(h, head);
  if (head.padded > head.vocab)
    logits.narrow(1, head.vocab, head.padded - head.vocab).fill_(-std::numeric_limits<double>::infinity());
  const auto dtype = logits.scalar_type();
  const auto acc = dtype == at::kDouble ? at::kDouble : at::kFloat;
  if (temperature == 1.0 && dtype == at::kHalf && logits.is_cuda()) return at::_log_softmax(logits, 1, true);
  auto scaled = logits.to(acc);
  if (temperature != 1.0) scaled.div_(temperature);
  return at::_log_softmax(scaled, 1, false);
}

struct FusedLinearLogprobs : public torch::autograd::Function<FusedLinearLogprobs> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const std::optional<at::Tensor>& maybe_bias, const at::Tensor& targets, double temperature,
                            int64_t chunk, int64_t pad_to, int64_t ignore_index, at::Tensor* entropy,
                            at::Tensor* top1) {
    const auto bias = maybe_bias.value_or(at::Tensor());
    const auto head = pad_head(weight, bias, pad_to);
    const int64_t N = hidden.size(0);
    const auto acc = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    auto out = at::zeros({N}, hidden.options().dtype(acc));
    if (entropy != nullptr) *entropy = at::zeros({N}, hidden.options().dtype(acc));
    if (top1 != nullptr) *top1 = at::zeros({N}, hidden.options().dtype(at::kBool));
    const auto valid = targets.ne(ignore_index);
    const auto safe = targets.masked_fill(valid.logical_not(), 0);
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      if (temperature == 1.0 && entropy == nullptr && top1 == nullptr) {  // log p[y] = -(the row's cross-entropy)
        auto logits = head_logits(hidden.narrow(0, s, n), head);
        out.narrow(0, s, n).copy_(
            kernels::cross_entropy_rows(logits, targets.narrow(0, s, n), head.vocab, ignore_index, false).neg());
        continue;
      }
      const auto logp = chunk_log_softmax(hidden.narrow(0, s, n), head, temperature);
      out.narrow(0, s, n).copy_(logp.gather(1, safe.narrow(0, s, n).unsqueeze(1)).squeeze(1));
      if (entropy != nullptr) {
        // -sum p log p, with 0 log 0 = 0 on the padding.
        const auto p = logp.exp();
        entropy->narrow(0, s, n).copy_(-(p * logp.masked_fill(p.eq(0), 0)).sum(1));
      }
      // The padding's columns are -inf, so the argmax is a real token's.
      if (top1 != nullptr) top1->narrow(0, s, n).copy_(logp.argmax(1).eq(targets.narrow(0, s, n)));
    }
    out.masked_fill_(valid.logical_not(), 0);
    if (top1 != nullptr) top1->masked_fill_(valid.logical_not(), false);
    ctx->save_for_backward({hidden, weight, bias, targets});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["pad_to"] = pad_to;
    ctx->saved_data["ignore_index"] = ignore_index;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &bias = saved[2], &targets = saved[3];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    const bool need_h = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1),
               need_b = bias.defined() && ctx->needs_input_grad(2);
    const auto head = pad_head(weight, bias, ctx->saved_data["pad_to"].toInt());
    const int64_t N = hidden.size(0);
    const auto acc = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const auto valid = targets.ne(ignore_index);
    const auto safe = targets.masked_fill(valid.logical_not(), 0).unsqueeze(1);
    // d logp / d logits = (onehot - softmax) / temperature, scaled by each row's incoming gradient.
    const auto g = grad_out.at(0).to(acc).masked_fill(valid.logical_not(), 0) / temperature;
    HeadGradients grads(hidden, need_h, need_w, need_b, chunk);
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const auto h = hidden.narrow(0, s, n);
      if (temperature == 1.0) {  // -(softmax - onehot) x g, written over the chunk's logits by one kernel
        auto logits = head_logits(h, head);
        kernels::cross_entropy_rows(logits, targets.narrow(0, s, n), head.vocab, ignore_index, true,
                                    g.narrow(0, s, n).neg());
        grads.add(s, n, h, logits, head);
        continue;
      }
      const auto logp = chunk_log_softmax(h, head, temperature);
      auto go = at::zeros_like(logp);
      go.scatter_(1, safe.narrow(0, s, n), g.narrow(0, s, n).unsqueeze(1));
      auto gl = at::_log_softmax_backward_data(go, logp, 1, acc);  // temperature != 1: float logits
      if (gl.scalar_type() != hidden.scalar_type()) gl = gl.to(hidden.scalar_type());
      grads.add(s, n, h, gl, head);
    }
    const auto [gh, gw, gb] = grads.finish(weight, bias, head);
    return {gh,           gw,           gb,           at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fused_linear_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                 const at::Tensor& targets, double temperature, const FusedLossOptions& o,
                                 at::Tensor* entropy, at::Tensor* top1) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "fused_linear_logprobs: hidden (N, C) and weight (V, C) expected, got ", hidden.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0),
              "fused_linear_logprobs: one target per row expected");
  TORCH_CHECK(temperature > 0, "fused_linear_logprobs: temperature must be positive");
  const auto h = hidden.contiguous();
  const int64_t pad_to = resolved_pad(h, o);
  const int64_t chunk = fused_loss_chunk_rows(h.size(0), weight.size(0) + pad_to, o);
  at::Tensor ent, best;
  auto out = FusedLinearLogprobs::apply(h, weight, optional_bias(bias), targets, temperature, chunk, pad_to,
                                        o.ignore_index, entropy ? &ent : nullptr, top1 ? &best : nullptr);
  if (entropy != nullptr) *entropy = ent;
  if (top1 != nullptr) *top1 = best;
  return out;
}

at::Tensor next_token_targets(const at::Tensor& labels, int64_t ignore_index) {
  const auto B = labels.size(0), T = labels.size(1);
  return at::cat({labels.narrow(1, 1, T - 1), at::full({B, 1}, ignore_index, labels.options())}, 1);
}

int64_t fused_loss_chunk_rows(int64_t rows, int64_t vocab, const FusedLossOptions& o) {
  if (o.chunk > 0) return o.chunk;
  const int64_t fit = std::max<int64_t>(1, o.auto_chunk_bytes / (std::max<int64_t>(vocab, 1) * 4));
  if (rows <= fit) return std::max<int64_t>(rows, 1);
  const int64_t pieces = (rows + fit - 1) / fit;  // as few chunks as fit, of equal size
  return (rows + pieces - 1) / pieces;
}

at::Tensor fused_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                      const at::Tensor& targets, const FusedLossOptions& o) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "fused_linear_cross_entropy: hidden (N, C) and weight (V, C) expected, got ", hidden.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0),
              "fused_linear_cross_entropy: one target per row expected");
  const auto h = hidden.contiguous();
  const int64_t pad_to = resolved_pad(h, o);
  const int64_t chunk = fused_loss_chunk_rows(h.size(0), weight.size(0) + pad_to, o);
  const bool grad = at::GradMode::is_enabled();
  const bool need_h = grad && h.requires_grad(), need_w = grad && weight.requires_grad(),
             need_b = grad && bias.defined() && bias.requires_grad();
  if (!need_h && !need_w && !need_b) {  // evaluation: the loss alone, chunk by chunk
    const auto head = pad_head(weight, bias, pad_to);
    auto total = at::zeros({}, h.options().dtype(h.scalar_type() == at::kDouble ? at::kDouble : at::kFloat));
    for (int64_t s = 0; s < h.size(0); s += chunk) {
      const int64_t n = std::min(chunk, h.size(0) - s);
      total.add_(chunk_loss(h.narrow(0, s, n), head, targets.narrow(0, s, n), o.ignore_index, nullptr));
    }
    return total;
  }
  return FusedLinearCrossEntropy::apply(h, weight, optional_bias(bias), targets, chunk, pad_to, o.ignore_index, need_h,
                                        need_w, need_b);
}

}  // namespace anvil::train
