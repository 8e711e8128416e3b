#include "models/gpt2/gpt2.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include "anvil/checkpoint/hf_model.h"
#include "anvil/core/error.h"
#include "data/collate.h"
#include "models/layers.h"
#include "anvil/models/registry.h"
#include "test_util.h"

namespace anvil::models::gpt2 {
namespace {

GPT2Options tiny() {
  GPT2Options o;
  o.vocab_size(50).n_positions(16).n_embd(32).n_layer(2).n_head(4).resid_pdrop(0).embd_pdrop(0).attn_pdrop(0);
  return o;
}

TEST(GPT2, ParameterNamesAndShapesAreHuggingFaces) {
  GPT2LMHeadModel m(tiny());
  std::vector<std::pair<std::string, std::vector<int64_t>>> got;
  for (const auto& p : m.named_parameters()) got.emplace_back(p.key(), p.value().sizes().vec());
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {{"transformer.wte.weight", {50, 32}},
                                                                    {"transformer.wpe.weight", {16, 32}}};
  for (int i = 0; i < 2; ++i) {
    const auto h = "transformer.h." + std::to_string(i) + ".";
    want.push_back({h + "ln_1.weight", {32}});
    want.push_back({h + "ln_1.bias", {32}});
    want.push_back({h + "attn.c_attn.weight", {32, 96}});  // Conv1D: (in, out)
    want.push_back({h + "attn.c_attn.bias", {96}});
    want.push_back({h + "attn.c_proj.weight", {32, 32}});
    want.push_back({h + "attn.c_proj.bias", {32}});
    want.push_back({h + "ln_2.weight", {32}});
    want.push_back({h + "ln_2.bias", {32}});
    want.push_back({h + "mlp.c_fc.weight", {32, 128}});
    want.push_back({h + "mlp.c_fc.bias", {128}});
    want.push_back({h + "mlp.c_proj.weight", {128, 32}});
    want.push_back({h + "mlp.c_proj.bias", {32}});
  }
  want.push_back({"transformer.ln_f.weight", {32}});
  want.push_back({"transformer.ln_f.bias", {32}});
  EXPECT_EQ(got, want);
}

TEST(GPT2, LogitsShapeAndTiedHead) {
  GPT2LMHeadModel m(tiny());
  auto ids = at::randint(0, 50, {3, 7}, at::kLong);
  auto logits = m.forward(ids);
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{3, 7, 50}));
  // Tied: the output projection is the token embedding.
  auto h = m.transformer->forward(ids, ForwardArgs{});
  EXPECT_TRUE(at::allclose(logits, at::matmul(h, m.transformer->wte->weight.t()), 1e-5, 1e-5));
}

TEST(GPT2, InitFollowsGPT2) {
  torch::manual_seed(0);
  GPT2Options o = tiny();
  o.n_embd(256).n_layer(8).vocab_size(1000);
  GPT2LMHeadModel m(o);
  auto params = m.named_parameters();
  EXPECT_NEAR(params["transformer.wte.weight"].std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(params["transformer.h.0.attn.c_proj.weight"].std().item<double>(), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_NEAR(params["transformer.h.0.mlp.c_proj.weight"].std().item<double>(), 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_TRUE(params["transformer.h.0.attn.c_attn.bias"].eq(0).all().item<bool>());
  EXPECT_TRUE(params["transformer.h.0.ln_1.weight"].eq(1).all().item<bool>());
}

TEST(GPT2, CausalityFutureTokensDoNotChangeThePast) {
  GPT2LMHeadModel m(tiny());
  auto a = at::randint(0, 50, {1, 10}, at::kLong);
  auto b = a.clone();
  b.index_put_({0, at::indexing::Slice(6, at::indexing::None)}, 7);
  auto la = m.forward(a), lb = m.forward(b);
  EXPECT_TRUE(at::allclose(la.narrow(1, 0, 6), lb.narrow(1, 0, 6), 1e-6, 1e-6));
}

TEST(GPT2, KVCacheMatchesFullRecompute) {
  GPT2LMHeadModel m(tiny());
  m.eval();
  auto ids = at::randint(0, 50, {2, 12}, at::kLong);
  auto full = m.forward(ids);
  KVCache cache;
  auto first = m.forward(ids.narrow(1, 0, 5), &cache);  // prefill
  auto chunk = m.forward(ids.narrow(1, 5, 3), &cache);  // several tokens with a past
  std::vector<at::Tensor> steps = {first, chunk};
  for (int64_t t = 8; t < 12; ++t) steps.push_back(m.forward(ids.narrow(1, t, 1), &cache));
  EXPECT_EQ(cache.length, 12);
  EXPECT_TRUE(at::allclose(at::cat(steps, 1), full, 1e-5, 1e-5));
}

TEST(GPT2, SavedFolderReloadsIdentically) {
  anvil::testing::TempDir dir;
  auto m = std::make_shared<GPT2LMHeadModel>(tiny());
  checkpoint::save_model_dir(dir.path(), *m, nullptr);
  auto back = checkpoint::load_model_dir(dir.path());
  EXPECT_EQ(back->family(), "gpt2");
  auto ids = at::randint(0, 50, {2, 9}, at::kLong);
  EXPECT_TRUE(at::equal(back->forward(ids), m->forward(ids)));
}

// A folder of PyTorch pickles (pytorch_model.bin) is refused with why and the conversion, not just "no file".
TEST(GPT2, APickleOnlyFolderIsExplained) {
  anvil::testing::TempDir dir;
  auto m = std::make_shared<GPT2LMHeadModel>(tiny());
  checkpoint::save_model_dir(dir.path(), *m, nullptr);
  std::filesystem::rename(dir / "model.safetensors", dir / "pytorch_model.bin");
  try {
    checkpoint::load_model_dir(dir.path());
    FAIL() << "a folder without safetensors loaded";
  } catch (const anvil::CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("only pytorch_model.bin, a PyTorch pickle"), std::string::npos) << what;
    EXPECT_NE(what.find("save_pretrained(DIR, safe_serialization=True)"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace anvil::models::gpt2

namespace anvil::models::layers {
namespace {

TEST(VocabProjection, PaddedGemmEqualsThePlainProductAndItsGradients) {
  // An odd vocabulary padded to a multiple of 64 for the GEMM (what training on CUDA does): the same
  // logits, and the same gradients for the hidden states, the weight and the bias, in float32.
  at::manual_seed(0);
  for (const int64_t V : {50, 257, 64}) {
    SCOPED_TRACE(V);
    const auto h0 = at::randn({3, 5, 24}), w0 = at::randn({V, 24}), b0 = at::randn({V});
    const auto up = at::randn({3, 5, V});
    std::vector<at::Tensor> grads[2], outs;
    for (int64_t pad_to : {1, 64}) {
      auto h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
      const auto y = vocab_projection(h, w, b, pad_to);
      ASSERT_EQ(y.sizes(), (at::IntArrayRef{3, 5, V}));
      (y * up).sum().backward();
      outs.push_back(y.detach());
      grads[pad_to == 64] = {h.grad(), w.grad(), b.grad()};
    }
    // Relative to the largest entry: only the summation order of float32 products may differ.
    auto rel = [](const at::Tensor& a, const at::Tensor& b) {
      return ((a - b).abs().max() / b.abs().max()).item<double>();
    };
    EXPECT_LT(rel(outs[1], outs[0]), 1e-6);
    for (size_t i = 0; i < 3; ++i) EXPECT_LT(rel(grads[1][i], grads[0][i]), 1e-6) << i;
  }
  // On the CPU, and when decoding, lm_head does not pad: its result is at::linear's, bit for bit.
  const auto h = at::randn({2, 24}), w = at::randn({50, 24});
  EXPECT_TRUE(at::equal(lm_head(h, w), at::linear(h, w)));
}

TEST(PackedAttention, DocumentsAttendAsTheirOwnSequences) {
  // Packed rows given as documents (what training on the CPU and float32 CUDA runs: the mask built from
  // the doc ids) against each document of the flattened tokens attended on its own, as flash attention's
  // cumulative lengths (data::document_offsets) cut them: grouped heads, padding, windows, in double.
  at::manual_seed(0);
  const auto doc = at::tensor({0, 0, 0, 1, 1, 1, 1, 2, 2, -1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}, at::kLong).view({2, 10});
  const auto offsets = data::document_offsets(doc);
  ASSERT_TRUE(offsets);
  const int64_t B = 2, T = 10, Hq = 4, Hk = 2, D = 8;
  const auto dbl = at::TensorOptions().dtype(at::kDouble);
  const auto q = at::randn({B, Hq, T, D}, dbl), k = at::randn({B, Hk, T, D}, dbl), v = at::randn({B, Hk, T, D}, dbl);
  ForwardArgs args;
  args.documents.doc_ids = doc;
  args.documents.cu_seqlens = offsets->cu_seqlens;
  args.documents.max_seqlen = offsets->max_seqlen;
  const auto flat = [&](const at::Tensor& x) { return x.transpose(1, 2).reshape({B * T, x.size(1), D}); };
  for (const int64_t window : {0, 2}) {
    SCOPED_TRACE(window);
    AttentionOptions o;
    o.sliding_window = window;
    const auto y = attention(q, k, v, args, 0, o).reshape({B * T, Hq, D});
    const auto cu = offsets->cu_seqlens;
    for (int64_t i = 0; i + 1 < cu.size(0); ++i) {
      const int64_t s = cu[i].item<int64_t>(), n = cu[i + 1].item<int64_t>() - s;
      // (n, H, D) -> (1, H, n, D); keys repeated for the grouped heads; window as in transformers' mask.
      const auto seg = [&](const at::Tensor& x) { return flat(x).narrow(0, s, n).transpose(0, 1).unsqueeze(0); };
      const auto qi = at::arange(n).unsqueeze(1), kj = at::arange(n).unsqueeze(0);
      auto allowed = kj.le(qi);
      if (window > 0) allowed = allowed.logical_and(kj.gt(qi - window));
      const auto ref = at::scaled_dot_product_attention(seg(q), seg(k).repeat_interleave(Hq / Hk, 1),
                                                        seg(v).repeat_interleave(Hq / Hk, 1), allowed);
      EXPECT_LT((y.narrow(0, s, n) - ref[0].transpose(0, 1)).abs().max().item<double>(), 1e-12) << "document " << i;
    }
  }
}

}  // namespace
}  // namespace anvil::models::layers
