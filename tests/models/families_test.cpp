// Behaviour every family must share, checked on the debug flavor of each
// family the registry holds (configs/models/<family>-debug.yaml): causality,
// KV cache = recompute, left padding = no padding, packed documents = separate
// ones, save/load round trip; sliding windows; and the named flavors' sizes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/checkpoint/hf_model.h"
#include "io/safetensors.h"
#include "anvil/models/registry.h"
#include "models/init.h"
#include "data/collate.h"
#include "kernels/dispatch.h"
#include "models/layers.h"
#include "test_util.h"

namespace anvil::models {
namespace {

std::shared_ptr<CausalLM> build_flavor(const std::string& flavor, int64_t vocab,
                                       const std::vector<std::string>& overrides = {}) {
  const auto src = anvil::testing::source_dir();
  auto all = overrides;
  all.push_back("output_dir=unused");
  auto cfg = config::load_config({src + "/configs/quickstart.yaml", src + "/configs/models/" + flavor + ".yaml"}, all);
  auto mc = cfg.model;
  if (mc.vocab_size == 0) mc.vocab_size = vocab;
  auto model = family_by_name(mc.family).from_config(mc);
  model->eval();
  return model;
}

int64_t count_parameters(const CausalLM& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

/// The parameters of a flavor too large to build here (7 B floats are 29 GB):
/// the count is affine in the vocabulary and in the number of blocks (every
/// block of a flavor has the same shape), so the models built with 1 or 2
/// blocks and 1 or 2 vocabulary rows give it for the flavor's own sizes.
/// A mixture of experts is built with 1 or 2 experts per block too (a block's
/// count is affine in its experts).
int64_t count_parameters_by_extension(const std::string& flavor) {
  const auto src = anvil::testing::source_dir();
  const auto m = config::load_config({src + "/configs/quickstart.yaml", src + "/configs/models/" + flavor + ".yaml"},
                                     {"output_dir=unused"})
                     .model;
  const auto& e = m.keys.get<models::ExpertKeys>();
  const bool moe = e.num_experts > 0;
  const auto count = [&](int64_t vocab, int64_t layers, int64_t experts) {
    std::vector<std::string> o{"model.vocab_size=" + std::to_string(vocab),
                               "model.num_hidden_layers=" + std::to_string(layers)};
    if (moe) o.push_back("model.num_experts=" + std::to_string(experts)), o.push_back("model.num_experts_per_tok=1");
    SkipInitGuard counting;  // shapes are all a count needs
    return count_parameters(*build_flavor(flavor, 0, o));
  };
  const auto base = count(1, 1, 1), per_block = count(1, 2, 1) - base, per_row = count(2, 1, 1) - base;
  // Each expert of each block (with its router row).
  const auto per_expert = moe ? count(1, 1, 2) - base : 0;
  const auto experts = moe ? e.num_experts - 1 : 0;
  return base + (m.num_hidden_layers - 1) * per_block + (m.vocab_size - 1) * per_row +
         m.num_hidden_layers * experts * per_expert;
}

class Family : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    at::manual_seed(7);
    model_ = build_flavor(GetParam(), 61);
  }
  std::shared_ptr<CausalLM> model_;
  torch::NoGradGuard no_grad_;
};

TEST_P(Family, FutureTokensDoNotChangeThePast) {
  auto a = at::randint(61, {2, 12}, at::kLong);
  auto b = a.clone();
  b.narrow(1, 7, 5).random_(61);
  auto la = model_->forward(a), lb = model_->forward(b);
  EXPECT_TRUE(at::allclose(la.narrow(1, 0, 7), lb.narrow(1, 0, 7), 0, 1e-6));
  EXPECT_FALSE(at::allclose(la.narrow(1, 7, 5), lb.narrow(1, 7, 5), 0, 1e-3));
}

TEST_P(Family, KVCacheMatchesFullRecompute) {
  auto ids = at::randint(61, {2, 12}, at::kLong);
  auto full = model_->forward(ids);
  KVCache cache;
  auto first = model_->forward(ids.narrow(1, 0, 5), &cache);  // prefill
  auto chunk = model_->forward(ids.narrow(1, 5, 3), &cache);  // several tokens with a past
  std::vector<at::Tensor> parts = {first, chunk};
  for (int64_t t = 8; t < 12; ++t) parts.push_back(model_->forward(ids.narrow(1, t, 1), &cache));
  EXPECT_EQ(cache.length, 12);
  EXPECT_LE((at::cat(parts, 1) - full).abs().max().item<double>(), 1e-5);
}

TEST_P(Family, LeftPaddedRowsMatchUnpaddedOnes) {
  // Row 0 has 9 real tokens, row 1 has 5 after 4 pads: with positions and a
  // mask, row 1's logits must equal those of the 5 tokens alone.
  auto ids = at::randint(61, {2, 9}, at::kLong);
  auto valid = at::ones({2, 9}, at::kBool);
  valid[1].narrow(0, 0, 4).fill_(false);
  ForwardArgs args;
  args.position_ids = (valid.to(at::kLong).cumsum(1) - 1).clamp_min(0);
  args.attention_mask = (at::ones({9, 9}, at::kBool).tril() & valid.view({2, 1, 1, 9})) | at::eye(9, at::kBool);
  auto padded = model_->forward(ids, args);
  auto alone = model_->forward(ids[1].narrow(0, 4, 5).unsqueeze(0));
  auto row0 = model_->forward(ids[0].unsqueeze(0));
  EXPECT_LE((padded[1].narrow(0, 4, 5) - alone[0]).abs().max().item<double>(), 1e-5);
  EXPECT_LE((padded[0] - row0[0]).abs().max().item<double>(), 1e-5);
}

TEST_P(Family, PackedDocumentsMatchSeparateOnes) {
  // Documents of 7 and 5 tokens in one row: positions restart at each
  // document and attention stays inside it (windows included), so each
  // document's logits are its own forward's.
  auto ids = at::randint(61, {1, 12}, at::kLong);
  auto doc = at::cat({at::zeros({7}, at::kLong), at::ones({5}, at::kLong)}).unsqueeze(0);
  // Given as their mask, and as documents (each attention layer builds the mask, or on CUDA runs flash).
  ForwardArgs masked, documents;
  masked.position_ids = documents.position_ids =
      at::cat({at::arange(7, at::kLong), at::arange(5, at::kLong)}).unsqueeze(0);
  masked.attention_mask = layers::document_causal_mask(doc);
  documents.documents.doc_ids = doc;
  auto first = model_->forward(ids.narrow(1, 0, 7)), second = model_->forward(ids.narrow(1, 7, 5));
  for (const auto* args : {&masked, &documents}) {
    auto packed = model_->forward(ids, *args);
    EXPECT_LE((packed.narrow(1, 0, 7) - first).abs().max().item<double>(), 1e-5);
    EXPECT_LE((packed.narrow(1, 7, 5) - second).abs().max().item<double>(), 1e-5);
  }
}

TEST_P(Family, FusedKernelsEqualTheAtenComposition) {
  // train.fused_kernels on (the default) and off: the same logits and gradients, bit for bit, on the CPU.
  torch::AutoGradMode grad(true);
  auto ids = at::randint(61, {2, 9}, at::kLong);
  const auto run = [&](bool fused) {
    kernels::set_fused_ops(fused);
    model_->zero_grad();
    auto logits = model_->forward(ids);
    (logits * logits.detach().sin()).sum().backward();
    std::vector<at::Tensor> out{logits.detach()};
    for (const auto& p : model_->parameters())
      if (p.grad().defined()) out.push_back(p.grad().clone());
    return out;
  };
  const auto aten = run(false), fused = run(true);
  ASSERT_EQ(aten.size(), fused.size());
  for (size_t i = 0; i < aten.size(); ++i) EXPECT_TRUE(at::equal(aten[i], fused[i])) << "tensor " << i;
}

// The sliding window reaches no further back than its width: a token more
// than `window` positions back does not change the logits, one inside does.
TEST(SlidingWindow, TokensOutsideTheWindowAreNotSeen) {
  at::manual_seed(3);
  torch::NoGradGuard no_grad;
  for (const std::string flavor : {"mistral-debug", "phi3-debug"}) {
    SCOPED_TRACE(flavor);
    auto model = build_flavor(flavor, 61);
    const auto w = model->hf_config()["sliding_window"].get<int64_t>();
    auto a = at::randint(61, {1, 12}, at::kLong);
    auto b = a.clone();
    b[0][0] = (a[0][0].item<int64_t>() + 1) % 61;  // only token 0 differs
    auto la = model->forward(a), lb = model->forward(b);
    // Two layers: token 0 reaches position p through a chain of at most two windows.
    const int64_t reach = 2 * (w - 1);
    EXPECT_TRUE(at::equal(la.narrow(1, reach + 1, 11 - reach), lb.narrow(1, reach + 1, 11 - reach)));
    EXPECT_FALSE(at::allclose(la.narrow(1, 1, 1), lb.narrow(1, 1, 1), 0, 1e-6));
  }
}

TEST_P(Family, SavedFolderReloadsIdentically) {
  anvil::testing::TempDir dir;
  model_->special_tokens = {1, 2, 3};
  checkpoint::save_model_dir(dir.path(), *model_, nullptr);
  auto back = checkpoint::load_model_dir(dir.path());
  back->eval();
  EXPECT_EQ(back->family(), model_->family());
  EXPECT_EQ(back->special_tokens.eos, 2);
  auto ids = at::randint(61, {2, 10}, at::kLong);
  EXPECT_TRUE(at::equal(back->forward(ids), model_->forward(ids)));
}

INSTANTIATE_TEST_SUITE_P(DebugFlavors, Family, ::testing::ValuesIn(anvil::testing::debug_flavors()),
                         [](const auto& info) { return anvil::testing::flavor_test_name(info.param); });

TEST(Flavors, EveryNamedFlavorIsAValidConfig) {
  const auto src = anvil::testing::source_dir();
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(src + "/configs/models")) {
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(config::load_config({src + "/configs/quickstart.yaml", e.path().string()}, {"output_dir=x"}));
    ++n;
  }
  EXPECT_GE(n, 6);
}

TEST(Flavors, PublishedParameterCounts) {
  // As reported for the released checkpoints (tied GPT-2 head; Pythia's untied embed_out).
  // GPT-2 built whole, which also checks the extension below against a full build.
  {
    SkipInitGuard counting;
    EXPECT_EQ(count_parameters(*build_flavor("gpt2-124m", 0)), 124439808);
  }
  EXPECT_EQ(count_parameters_by_extension("gpt2-124m"), 124439808);
  EXPECT_EQ(count_parameters_by_extension("pythia-160m"), 162322944);
  // OPT's tied head; opt-350m's 512-wide embeddings, project_in / project_out, post-LN (no final LayerNorm).
  EXPECT_EQ(count_parameters_by_extension("opt-125m"), 125239296);
  EXPECT_EQ(count_parameters_by_extension("opt-350m"), 331196416);
  // Qwen2.5, Qwen3-0.6B, Gemma-2-2B and Gemma-3-1B (tied heads), Mistral-7B-v0.1 and Phi-3-mini (untied), as
  // their model cards give them.
  // Built with 1 or 2 blocks and vocabulary rows, extended to the flavor's sizes.
  EXPECT_EQ(count_parameters_by_extension("qwen2.5-0.5b"), 494032768);
  EXPECT_EQ(count_parameters_by_extension("qwen2.5-1.5b"), 1543714304);
  EXPECT_EQ(count_parameters_by_extension("qwen3-0.6b"), 596049920);
  EXPECT_EQ(count_parameters_by_extension("mistral-7b"), 7241732096);
  EXPECT_EQ(count_parameters_by_extension("phi3-mini"), 3821079552);
  EXPECT_EQ(count_parameters_by_extension("gemma2-2b"), 2614341888);
  EXPECT_EQ(count_parameters_by_extension("gemma3-1b"), 999885952);
  // Mixtral-8x7B (46.7 B) and Qwen3-30B-A3B (30.5 B), every parameter of every expert.
  EXPECT_EQ(count_parameters_by_extension("mixtral-8x7b"), 46702792704);
  EXPECT_EQ(count_parameters_by_extension("qwen3-30b-a3b"), 30532122624);
}

// A model built to be loaded skips every random draw, the families' and the
// layers' alike: the same parameters and shapes, and the random stream after
// it is the one right after the seed (so what is drawn next, a LoRA adapter
// or a dropout mask, does not depend on the model's size or on whether it was
// built whole or deferred); the guard nests and restores. Loading under it is
// what Family.SavedFolderReloadsIdentically and the HfParity tests exercise
// (checkpoint::load_model_dir).
TEST(Flavors, SkipInitGuardBuildsTheSameParametersWithoutTheDraws) {
  EXPECT_FALSE(init_skipped());
  std::map<std::string, std::vector<int64_t>> drawn, skipped;
  at::manual_seed(1);
  for (const auto& p : build_flavor("llama-debug", 61)->named_parameters()) drawn[p.key()] = p.value().sizes().vec();
  const auto after_drawing = at::rand({4});
  std::shared_ptr<CausalLM> m;
  at::manual_seed(1);
  {
    SkipInitGuard outer;
    {
      SkipInitGuard inner;
      EXPECT_TRUE(init_skipped());
    }
    EXPECT_TRUE(init_skipped());
    m = build_flavor("llama-debug", 61);
  }
  EXPECT_FALSE(init_skipped());
  const auto after_skipping = at::rand({4});
  at::manual_seed(1);
  EXPECT_TRUE(at::equal(after_skipping, at::rand({4})));  // nothing was drawn
  EXPECT_FALSE(at::equal(after_skipping, after_drawing));
  for (const auto& p : m->named_parameters()) skipped[p.key()] = p.value().sizes().vec();
  EXPECT_EQ(drawn, skipped);
}

// layers::Dense, Embedding and LayerNorm stand in for LibTorch's Linear,
// Embedding and LayerNorm so a model can be built without storage; from the
// same seed they draw the same values in the same order, and compute the same.
TEST(Layers, DenseEmbeddingAndLayerNormDrawAndComputeAsLibTorchsModules) {
  at::manual_seed(5);
  torch::nn::Linear lin(torch::nn::LinearOptions(7, 5));
  torch::nn::Linear lin_nb(torch::nn::LinearOptions(3, 4).bias(false));
  torch::nn::Embedding emb(torch::nn::EmbeddingOptions(11, 6).padding_idx(2));
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({6}).eps(1e-3));
  const auto next = at::rand({3});
  at::manual_seed(5);
  layers::Dense dense(torch::nn::LinearOptions(7, 5));
  layers::Linear dense_nb(torch::nn::LinearOptions(3, 4).bias(false));
  layers::Embedding our_emb(torch::nn::EmbeddingOptions(11, 6).padding_idx(2));
  layers::LayerNorm our_ln(torch::nn::LayerNormOptions({6}).eps(1e-3));
  EXPECT_TRUE(at::equal(next, at::rand({3})));
  EXPECT_TRUE(at::equal(lin->weight, dense->weight));
  EXPECT_TRUE(at::equal(lin->bias, dense->bias));
  EXPECT_TRUE(at::equal(lin_nb->weight, dense_nb->weight));
  EXPECT_FALSE(dense_nb->bias.defined());
  EXPECT_EQ(dense_nb->named_parameters().size(), 1u);
  EXPECT_TRUE(at::equal(emb->weight, our_emb->weight));
  EXPECT_TRUE(at::equal(ln->weight, our_ln->weight));
  EXPECT_TRUE(at::equal(ln->bias, our_ln->bias));
  torch::NoGradGuard no_grad;
  const auto x = at::randn({2, 7}), h = at::randn({2, 3, 6});
  const auto ids = at::tensor({0, 2, 10, 5}, at::kLong);
  EXPECT_TRUE(at::equal(lin(x), dense(x)));
  EXPECT_TRUE(at::equal(emb(ids), our_emb(ids)));
  EXPECT_TRUE(at::equal(ln(h), our_ln(h)));
  // Weight decay leaves both LayerNorms out by their module type.
  EXPECT_NE(our_ln->name().find("LayerNorm"), std::string::npos);
}

// A folder opened without reading it (checkpoint::open_model_dir): every
// parameter has its shape and no storage; the source gives any range of any
// parameter as stored, and the model read whole from it computes what the
// loaded one computes.
TEST_P(Family, AnOpenedFolderHoldsNoWeightsAndReadsWhatLoadingReads) {
  anvil::testing::TempDir dir;
  checkpoint::save_model_dir(dir.path(), *model_, nullptr);
  const auto loaded = checkpoint::load_model_dir(dir.path());
  auto opened = checkpoint::open_model_dir(dir.path(), at::kCPU);
  ASSERT_NE(opened->parameter_source, nullptr);
  EXPECT_TRUE(has_deferred(*opened));
  const auto want = loaded->named_parameters();
  int64_t numel = 0;
  for (const auto& p : opened->named_parameters()) {
    EXPECT_TRUE(is_deferred(p.value())) << p.key();
    EXPECT_EQ(p.value().storage().nbytes(), 0u) << p.key();
    EXPECT_EQ(p.value().sizes(), want[p.key()].sizes()) << p.key();
    numel += p.value().numel();
    // A range from the middle, as a rank's shard would cut it.
    const auto n = p.value().numel();
    const auto b = n / 3, count = std::max<int64_t>(1, n / 2 - b);
    EXPECT_TRUE(at::equal(opened->parameter_source->read(p.key(), b, count).to(at::kFloat),
                          want[p.key()].reshape(-1).narrow(0, b, count)))
        << p.key();
  }
  EXPECT_GT(numel, 0);
  materialize_deferred(*opened);
  EXPECT_EQ(opened->parameter_source, nullptr);
  EXPECT_FALSE(has_deferred(*opened));
  opened->eval();
  auto ids = at::randint(61, {2, 10}, at::kLong);
  EXPECT_TRUE(at::equal(opened->forward(ids), model_->forward(ids)));
  // A clone of an opened model is deferred too, and reads the same source.
  auto again = checkpoint::open_model_dir(dir.path(), at::kCPU);
  auto copy = clone_model(*again);
  EXPECT_TRUE(has_deferred(*copy));
  materialize_deferred(*copy);
  copy->eval();
  EXPECT_TRUE(at::equal(copy->forward(ids), model_->forward(ids)));
}

// A sharded run's random initialisation (models/init.h): the model built without storage reads, range by range,
// the very weights the eager build draws from the same seed, and leaves the generator where the eager build does
// (a LoRA adapter or a head drawn next gets the same values). Also with a padding row (pad_token_id).
TEST_P(Family, ADeferredRandomBuildReadsTheWeightsTheEagerBuildDraws) {
  for (const bool pad : {false, true}) {
    auto config = model_->hf_config();
    if (pad) config["pad_token_id"] = 3;
    const auto& family = family_by_hf_model_type(config.at("model_type").get<std::string>(), "test");
    auto build = [&] { return family.from_hf_config(config, "test"); };
    at::manual_seed(11);
    const auto eager = build();
    const auto next = at::rand({4});
    at::manual_seed(11);
    const auto deferred = build_deferred_random(build, at::kCPU);
    ASSERT_NE(deferred, nullptr);
    EXPECT_TRUE(at::equal(at::rand({4}), next)) << "the generator after the build";
    ASSERT_NE(deferred->parameter_source, nullptr);
    const auto want = eager->named_parameters();
    for (const auto& p : deferred->named_parameters()) {
      ASSERT_TRUE(is_deferred(p.value())) << p.key();
      const auto n = p.value().numel();
      const auto b = n / 3, count = std::max<int64_t>(1, n / 2 - b);
      EXPECT_TRUE(
          at::equal(deferred->parameter_source->read(p.key(), b, count), want[p.key()].reshape(-1).narrow(0, b, count)))
          << p.key() << (pad ? " (padding row)" : "");
    }
    materialize_deferred(*deferred);
    for (const auto& p : deferred->named_parameters())
      EXPECT_TRUE(at::equal(p.value(), want[p.key()])) << p.key() << (pad ? " (padding row)" : "");
  }
  // A build that draws into a module of its own (LibTorch's Linear) cannot be replayed: null, the generator
  // untouched, so the eager build that follows draws what it always did.
  at::manual_seed(5);
  const auto first = at::rand({4});
  at::manual_seed(5);
  const auto config = model_->hf_config();
  const auto& family = family_by_hf_model_type(config.at("model_type").get<std::string>(), "test");
  EXPECT_EQ(build_deferred_random(
                [&] {
                  auto m = family.from_hf_config(config, "test");
                  m->add_score_head();
                  return m;
                },
                at::kCPU),
            nullptr);
  EXPECT_TRUE(at::equal(at::rand({4}), first));
}

}  // namespace
}  // namespace anvil::models

namespace anvil::models {
namespace {

std::string load_error(const std::string& config_json) {
  anvil::testing::TempDir dir;
  anvil::testing::write_text(dir / "config.json", config_json);
  try {
    checkpoint::load_model_dir(dir.path());
  } catch (const std::exception& e) {
    return std::string(e.what()).substr(dir.path().string().size() + 1);  // drop the temp folder
  }
  return "no error";
}

// A folder whose weights lack one parameter: the error names the parameter
// and the files that should have held it (model.safetensors, or the shards
// model.safetensors.index.json lists).
TEST(HfImport, AMissingTensorNamesTheWeightFiles) {
  auto cfg = config::load_config({anvil::testing::source_dir() + "/configs/quickstart.yaml",
                                  anvil::testing::source_dir() + "/configs/models/llama-debug.yaml"},
                                 {"output_dir=unused"});
  cfg.model.vocab_size = 61;
  auto model = family_by_name(cfg.model.family).from_config(cfg.model);
  anvil::testing::TempDir dir;
  checkpoint::save_model_dir(dir.path(), *model, nullptr);
  io::TensorMap all;
  {
    io::SafetensorsFile f(dir / "model.safetensors");
    for (const auto& n : f.names()) all[n] = f.get(n);
  }
  const std::string gone = "model.layers.0.mlp.up_proj.weight";
  ASSERT_TRUE(all.count(gone));
  all.erase(gone);
  const auto error = [&] {
    try {
      checkpoint::load_model_dir(dir.path());
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  io::save_safetensors(dir / "model.safetensors", all);
  EXPECT_EQ(error(), dir.path().string() + ": parameter \"" + gone +
                         "\" is missing from the weights: model.safetensors has no such tensor");
  // Two shards and an index that lists neither for it.
  std::filesystem::remove(dir / "model.safetensors");
  io::TensorMap first, second;
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [n, t] : all) {
    const bool one = first.size() <= second.size();
    (one ? first : second)[n] = t;
    map[n] = one ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  io::save_safetensors(dir / "model-00001-of-00002.safetensors", first);
  io::save_safetensors(dir / "model-00002-of-00002.safetensors", second);
  anvil::testing::write_text(dir / "model.safetensors.index.json", nlohmann::json({{"weight_map", map}}).dump());
  EXPECT_EQ(error(), dir.path().string() + ": parameter \"" + gone +
                         "\" is missing from the weights: none of the 2 files that model.safetensors.index.json lists "
                         "(model-00001-of-00002.safetensors, model-00002-of-00002.safetensors) holds it");
}

/// The config.json the model loaded from `config_json` writes back.
nlohmann::json reloaded_config(const std::string& config_json) {
  const auto j = nlohmann::json::parse(config_json);
  const auto& family = family_by_hf_model_type(j.at("model_type").get<std::string>(), "config.json");
  return family.from_hf_config(j, "config.json")->hf_config();
}

// Sliding windows as transformers reads them: Qwen's only with
// use_sliding_window (on the layers layer_types or max_window_layers name),
// Mistral's 4096 when the key is missing and none when null, Phi-3's none
// unless set; unknown layer types and LongRoPE factors of the wrong length
// name the key.
TEST(HfImport, SlidingWindowsAndLongRopeAreReadAsTransformersReadsThem) {
  const std::string qwen2 = R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 3, "num_attention_heads": 2)";
  auto j = reloaded_config(qwen2 + R"(, "use_sliding_window": true, "sliding_window": 4, "max_window_layers": 1})");
  EXPECT_EQ(j["sliding_window"], 4);
  EXPECT_EQ(j["layer_types"], nlohmann::json({"full_attention", "sliding_attention", "sliding_attention"}));
  j = reloaded_config(qwen2 + R"(, "use_sliding_window": false, "sliding_window": 4,
      "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention"]})");
  EXPECT_EQ(j["use_sliding_window"], false);
  EXPECT_TRUE(j["sliding_window"].is_null());
  EXPECT_EQ(load_error(qwen2 + R"(, "use_sliding_window": true, "layer_types": ["full_attention", "chunked_attention",
      "full_attention"]})"),
            "config.json: layer_types: layer type \"chunked_attention\" is not supported; expected "
            "\"full_attention\" or \"sliding_attention\"");
  EXPECT_EQ(load_error(qwen2 + R"(, "use_sliding_window": true, "layer_types": ["full_attention"]})"),
            "config.json: layer_types: expected a list of 3 layer types, got [\"full_attention\"]");
  const std::string mistral = R"({"model_type": "mistral", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2)";
  EXPECT_EQ(reloaded_config(mistral + "}")["sliding_window"], 4096);
  EXPECT_TRUE(reloaded_config(mistral + R"(, "sliding_window": null})")["sliding_window"].is_null());
  EXPECT_EQ(load_error(mistral + R"(, "sliding_window": 0})"),
            "config.json: sliding_window: expected an integer >= 1, got 0");
  const std::string phi3 = R"({"model_type": "phi3", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64,
      "original_max_position_embeddings": 16)";
  EXPECT_TRUE(reloaded_config(phi3 + "}")["sliding_window"].is_null());
  j = reloaded_config(phi3 + R"(, "rope_scaling": {"type": "su", "short_factor": [1, 1], "long_factor": [2, 3]}})");
  EXPECT_EQ(j["rope_parameters"]["rope_type"], "longrope");
  EXPECT_NEAR(j["rope_parameters"]["attention_factor"].get<double>(), std::sqrt(1 + std::log(4.0) / std::log(16.0)),
              1e-12);
  EXPECT_EQ(load_error(phi3 + R"(, "rope_scaling": {"type": "longrope", "short_factor": [1], "long_factor": [2, 3]}})"),
            "config.json: rope_scaling.short_factor: expected 2 numbers (rotary dims / 2), got 1");
}

TEST(HfImport, UnsupportedConfigsNameTheFileAndKey) {
  EXPECT_EQ(load_error(R"({"model_type": "mamba"})"),
            "config.json: model_type \"mamba\" is not supported; supported: gpt2, llama, qwen2, qwen3, mistral, phi3, "
            "mixtral, qwen3_moe, gemma2, gemma3_text, gpt_neox, opt");
  const std::string opt = R"({"model_type": "opt", "vocab_size": 10, "hidden_size": 8, "ffn_dim": 16,
      "num_hidden_layers": 1, "num_attention_heads": 2)";
  EXPECT_EQ(load_error(opt + R"(, "activation_function": "quick_gelu"})"),
            "config.json: activation_function: \"quick_gelu\" is not supported");
  EXPECT_EQ(load_error(opt + R"(, "num_attention_heads": 3})"),
            "config.json: num_attention_heads: 3 does not divide hidden_size 8");
  EXPECT_EQ(load_error(opt + R"(, "pad_token_id": 10})"), "config.json: pad_token_id: 10 is not below vocab_size 10");
  const std::string llama = R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 2)";
  EXPECT_EQ(load_error(llama + R"(, "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0}})"),
            "config.json: rope_parameters.rope_type: \"yarn\" is not supported; supported: default, llama3, longrope");
  EXPECT_EQ(load_error(llama + R"(, "num_key_value_heads": 3})"),
            "config.json: num_key_value_heads: 3 must divide num_attention_heads 2");
  EXPECT_EQ(load_error(llama + R"(, "hidden_act": "xielu"})"), "config.json: hidden_act: \"xielu\" is not supported");
  EXPECT_EQ(load_error(R"({"model_type": "gpt_neox", "vocab_size": 10, "hidden_size": 8})"),
            "config.json: intermediate_size: required GPT-NeoX field is missing");
  EXPECT_EQ(load_error(R"({"model_type": "gpt_neox", "vocab_size": 10, "hidden_size": "8"})"),
            "config.json: hidden_size: expected an integer, got \"8\"");
}

// A value a family cannot change (its visit_hf's `only` keys) is refused by name, and written as it is.
TEST(HfImport, KeysWithOneSupportedValueAreRefusedByName) {
  const std::string gpt2 = R"({"model_type": "gpt2", "vocab_size": 10, "n_embd": 8, "n_layer": 1, "n_head": 2)";
  EXPECT_EQ(load_error(gpt2 + R"(, "activation_function": "relu"})"),
            "config.json: activation_function: only gelu_new is supported, got \"relu\"");
  EXPECT_EQ(load_error(gpt2 + R"(, "tie_word_embeddings": false})"),
            "config.json: tie_word_embeddings: untied GPT-2 heads are not supported");
  EXPECT_EQ(load_error(gpt2 + R"(, "scale_attn_weights": false})"),
            "config.json: scale_attn_weights: GPT-2 without the 1/sqrt(head_dim) attention scale is not supported");
  EXPECT_EQ(load_error(gpt2 + R"(, "reorder_and_upcast_attn": true})"),
            "config.json: reorder_and_upcast_attn: not supported");
  EXPECT_EQ(load_error(R"({"model_type": "gpt_neox", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 2, "attention_bias": false})"),
            "config.json: attention_bias: GPT-NeoX without attention biases is not supported");
}

// Reading and writing go through one list per family: every key a folder's config.json sets is read back from
// the folder Anvil writes, for a value other than transformers' default.
TEST(HfImport, ConfigJsonKeysReadAreTheKeysWritten) {
  const nlohmann::json given = {{"model_type", "qwen3_moe"},
                                {"vocab_size", 12},
                                {"hidden_size", 16},
                                {"intermediate_size", 24},
                                {"num_hidden_layers", 2},
                                {"num_attention_heads", 4},
                                {"num_key_value_heads", 2},
                                {"head_dim", 8},
                                {"max_position_embeddings", 40},
                                {"rms_norm_eps", 1e-5},
                                {"attention_bias", true},
                                {"tie_word_embeddings", true},
                                {"hidden_act", "gelu"},
                                {"attention_dropout", 0.25},
                                {"initializer_range", 0.03},
                                {"num_local_experts", 3},
                                {"num_experts_per_tok", 2},
                                {"router_aux_loss_coef", 0.5},
                                {"output_router_logits", true},
                                {"moe_intermediate_size", 6},
                                {"norm_topk_prob", true},
                                {"decoder_sparse_step", 2}};
  const auto written =
      family_by_hf_model_type("qwen3_moe", "config.json").from_hf_config(given, "config.json")->hf_config();
  for (const auto& [key, value] : given.items()) {
    // transformers 5's num_local_experts is read; the Hub's num_experts is written.
    const auto name = key == "num_local_experts" ? std::string("num_experts") : key;
    ASSERT_TRUE(written.contains(name)) << name;
    EXPECT_EQ(written[name], value) << name;
  }
}

// Damaged numbers stop at the file and key, never deep in torch
// ("Trying to create tensor with negative dimension").
TEST(HfImport, OutOfRangeNumbersNameTheFileAndKey) {
  const std::string gpt2 = R"({"model_type": "gpt2", "vocab_size": 10, "n_embd": 8, "n_layer": 1, "n_head": 2)";
  EXPECT_EQ(load_error(R"({"model_type": "gpt2", "vocab_size": 10, "n_embd": -64, "n_layer": 1, "n_head": 2})"),
            "config.json: n_embd: expected an integer >= 1, got -64");
  EXPECT_EQ(load_error(R"({"model_type": "gpt2", "vocab_size": 0, "n_embd": 8, "n_layer": 1, "n_head": 2})"),
            "config.json: vocab_size: expected an integer >= 1, got 0");
  EXPECT_EQ(load_error(gpt2 + R"(, "n_inner": -1})"), "config.json: n_inner: expected an integer >= 0, got -1");
  EXPECT_EQ(load_error(gpt2 + R"(, "n_positions": 0})"), "config.json: n_positions: expected an integer >= 1, got 0");
  EXPECT_EQ(load_error(gpt2 + R"(, "attn_pdrop": 1.5})"),
            "config.json: attn_pdrop: expected a probability in [0, 1), got 1.5");
  EXPECT_EQ(load_error(gpt2 + R"(, "layer_norm_epsilon": 0.0})"),
            "config.json: layer_norm_epsilon: expected a number > 0, got 0.0");
  EXPECT_EQ(load_error(gpt2 + R"(, "initializer_range": -0.02})"),
            "config.json: initializer_range: expected a number >= 0, got -0.02");
  const std::string llama = R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 2)";
  EXPECT_EQ(load_error(llama + R"(, "num_key_value_heads": -2})"),
            "config.json: num_key_value_heads: expected an integer >= 1, got -2");
  EXPECT_EQ(load_error(llama + R"(, "rope_theta": -1.0})"), "config.json: rope_theta: expected a number > 0, got -1.0");
  EXPECT_EQ(load_error(R"({"model_type": "gpt_neox", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 2, "hidden_dropout": -0.1})"),
            "config.json: hidden_dropout: expected a probability in [0, 1), got -0.1");
}

}  // namespace
}  // namespace anvil::models

// Mixtures of experts beyond transformers' parity (hf_parity_test.cpp): the
// load-balancing loss's gradient through activation checkpointing, and
// at::_grouped_mm against the per-expert loop.
#include "anvil/train/sft.h"
#include "models/activation_checkpointing.h"
#include "models/moe.h"
#include "train/objectives/lm_data.h"
#include "train/objectives/kto/kto.h"
#include "train/objectives/preference/preference_data.h"
#include "data/datasets.h"

namespace anvil::models {
namespace {

struct AuxRun {
  double aux = 0;
  std::map<std::string, at::Tensor> grads;
};

AuxRun aux_run(const std::string& flavor, bool checkpointing, double weight) {
  at::manual_seed(11);
  auto model = build_flavor(flavor, 61);
  if (checkpointing)
    model->set_block_runner(
        [](size_t, const at::Tensor& x, const BlockFn& block) { return checkpoint_block(block, x); });
  auto ids = at::randint(61, {3, 10}, at::kLong);
  model->begin_router_stats();
  auto logits = model->forward(ids);
  auto loss = at::cross_entropy_loss(logits.narrow(1, 0, 9).reshape({-1, 61}), ids.narrow(1, 1, 9).reshape(-1));
  auto aux = model->take_aux_loss(weight);
  loss.backward();
  AuxRun r;
  r.aux = aux.item<double>();
  for (const auto& p : model->named_parameters()) r.grads.emplace(p.key(), p.value().grad().clone());
  return r;
}

TEST(MixtureOfExperts, AuxLossGradientReachesTheRoutersThroughActivationCheckpointing) {
  for (const std::string flavor : {"mixtral-debug", "qwen3_moe-debug"}) {
    SCOPED_TRACE(flavor);
    const auto plain = aux_run(flavor, false, 0.5), ckpt = aux_run(flavor, true, 0.5), none = aux_run(flavor, false, 0);
    // Balanced routing gives k = 2 (E * sum_e (k / E) (1 / E)); the init's near-uniform router is near it.
    EXPECT_GT(plain.aux, 1.5);
    EXPECT_LT(plain.aux, 4.0);
    EXPECT_DOUBLE_EQ(plain.aux, ckpt.aux);
    size_t routers = 0;
    for (const auto& [name, g] : plain.grads) {
      EXPECT_TRUE(at::allclose(g, ckpt.grads.at(name), 1e-5, 1e-7)) << name;
      if (name.ends_with(".gate.weight")) {
        ++routers;
        // The loss's weight shows in the routers' gradients (and only there and upstream).
        EXPECT_GT((g - none.grads.at(name)).abs().max().item<double>(), 1e-4) << name;
      }
      if (name.find("lm_head") != std::string::npos || name == "model.norm.weight")
        EXPECT_TRUE(at::allclose(g, none.grads.at(name), 0, 1e-7)) << name;
    }
    EXPECT_EQ(routers, 2u);
  }
}

TEST(MixtureOfExperts, GroupedMatmulMatchesThePerExpertLoop) {
  at::manual_seed(3);
  moe::MoeOptions o;
  o.hidden_size(64).intermediate_size(48).num_experts(6).top_k(2);
  moe::SparseMoeBlock loop(o), grouped(o);
  {
    at::NoGradGuard no_grad;
    auto src = loop->named_parameters();
    for (auto& p : loop->parameters()) p.normal_(0, 0.3);
    for (auto& p : grouped->named_parameters()) p.value().copy_(src[p.key()]);
  }
  loop->compute = moe::ExpertCompute::kLoop;
  grouped->compute = moe::ExpertCompute::kGrouped;
  auto x = at::randn({2, 9, 64});
  auto xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
  auto ya = loop->forward(xa, {}), yb = grouped->forward(xb, {});
  EXPECT_TRUE(at::allclose(ya, yb, 1e-5, 1e-5));
  const auto g = at::randn_like(ya);
  ya.backward(g);
  yb.backward(g);
  EXPECT_TRUE(at::allclose(xa.grad(), xb.grad(), 1e-5, 1e-5));
  auto pa = loop->named_parameters(), pb = grouped->named_parameters();
  for (const auto& p : pa) EXPECT_TRUE(at::allclose(p.value().grad(), pb[p.key()].grad(), 1e-5, 1e-5)) << p.key();
}

// An SFT batch's padding (right padding of unpacked rows, the tail of packed
// ones) takes no part in the load-balancing loss: its statistics equal those
// of each sample run alone, as transformers' attention_mask leaves it out.
TEST(MixtureOfExperts, SftBatchesLeaveTheirPaddingOutOfTheLoadBalancingLoss) {
  at::manual_seed(5);
  auto model = build_flavor("qwen3_moe-debug", 61);
  std::vector<data::LmSample> samples(3);
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto n = std::vector<int64_t>{10, 6, 3}[i];
    const auto ids = at::randint(61, {n}, at::kLong);
    samples[i].input_ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n);
    samples[i].labels = samples[i].input_ids;
  }
  std::vector<const data::LmSample*> all;
  for (const auto& s : samples) all.push_back(&s);

  model->begin_router_stats();
  for (const auto& s : samples) (void)model->forward(at::tensor(s.input_ids).unsqueeze(0));
  const double alone = model->take_aux_loss(1.0).item<double>();

  auto aux_of = [&](const train::Batch& b) {
    model->begin_router_stats();
    (void)train::lm_batch_loss_sum(*model, b);
    return model->take_aux_loss(1.0).item<double>();
  };
  const double unpacked = aux_of(train::to_batch(data::collate_unpacked(all, 0)));
  const double packed = aux_of(train::to_batch(data::collate_packed({{all[0]}, {all[1], all[2]}}, 10, 0)));
  EXPECT_NEAR(unpacked, alone, 1e-5);
  EXPECT_NEAR(packed, alone, 1e-5);

  // The padded ids without a mask count 11 padding tokens, which moves the figure.
  model->begin_router_stats();
  (void)model->forward(train::to_batch(data::collate_unpacked(all, 0)).tensors.at("input_ids"));
  EXPECT_GT(std::abs(model->take_aux_loss(1.0).item<double>() - alone), 1e-4);
}

// DPO's rows (prompt + chosen, prompt + rejected, right-padded) likewise, as
// TRL's concatenated forward passes its attention mask.
TEST(MixtureOfExperts, PreferenceRowsLeaveTheirPaddingOutOfTheLoadBalancingLoss) {
  at::manual_seed(6);
  auto model = build_flavor("mixtral-debug", 61);
  model->eval();  // no router jitter
  auto ids = [](int64_t n) {
    const auto t = at::randint(61, {n}, at::kLong);
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
  };
  data::PreferenceSample a, b;
  a.prompt_ids = ids(4), a.replies = {ids(6), ids(2)};
  b.prompt_ids = ids(3), b.replies = {ids(1), ids(5)};
  model->begin_router_stats();
  for (const auto* e : {&a, &b})
    for (const auto& r : e->replies) {
      auto row = e->prompt_ids;
      row.insert(row.end(), r.begin(), r.end());
      (void)model->forward(at::tensor(row).unsqueeze(0));
    }
  const double alone = model->take_aux_loss(1.0).item<double>();
  const auto batch = train::collate_preferences({&a, &b}, {{0, 0}, {0, 1}}, 0);
  for (const bool fused : {true, false}) {
    model->begin_router_stats();
    (void)train::model_sequence_logps(*model, batch.tensors.at("input_ids"), batch.tensors.at("labels"), fused,
                                      batch.tensors.at("attention_mask"));
    EXPECT_NEAR(model->take_aux_loss(1.0).item<double>(), alone, 1e-5) << "fused " << fused;
  }
}

// KTO's policy rows (prompt + completion, right-padded): TRL passes the
// completion's attention mask to the forward whose aux_loss it adds.
TEST(MixtureOfExperts, KtoRowsCarryTheirPaddingMask) {
  at::manual_seed(7);
  auto model = build_flavor("qwen3_moe-debug", 61);
  auto ids = [](int64_t n) {
    const auto t = at::randint(61, {n}, at::kLong);
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
  };
  train::KtoSample a, b;
  a.prompt_ids = ids(5), a.completion_ids = ids(4);
  b.prompt_ids = ids(2), b.completion_ids = ids(2), b.desirable = false;
  const auto batch = train::collate_kto({&a, &b}, 0, 0);
  const auto mask = batch.tensors.at("attention_mask");
  ASSERT_EQ(mask.sizes(), batch.tensors.at("input_ids").sizes());
  // Rows: a, b, then a's prompt with b's completion and b's with a's.
  EXPECT_TRUE(at::equal(mask.sum(1), at::tensor({9, 4, 7, 6}, at::kLong))) << mask.sum(1);
  model->begin_router_stats();
  for (const auto* e : {&a, &b}) {
    auto row = e->prompt_ids;
    row.insert(row.end(), e->completion_ids.begin(), e->completion_ids.end());
    (void)model->forward(at::tensor(row).unsqueeze(0));
  }
  const double alone = model->take_aux_loss(1.0).item<double>();
  model->begin_router_stats();
  (void)train::model_sequence_logps(*model, batch.tensors.at("input_ids").narrow(0, 0, 2),
                                    batch.tensors.at("labels").narrow(0, 0, 2), true, mask.narrow(0, 0, 2));
  EXPECT_NEAR(model->take_aux_loss(1.0).item<double>(), alone, 1e-5);
}

TEST(HfImport, MixtureOfExpertsConfigErrorsNameTheKey) {
  const std::string mixtral = R"({"model_type": "mixtral", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 2, "num_attention_heads": 2)";
  EXPECT_EQ(load_error(mixtral + R"(, "num_local_experts": 2, "num_experts_per_tok": 3})"),
            "config.json: num_experts_per_tok: 3 exceeds the 2 experts");
  const std::string qwen = R"({"model_type": "qwen3_moe", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 2, "num_attention_heads": 2, "num_experts": 4, "num_experts_per_tok": 2)";
  EXPECT_EQ(load_error(qwen + R"(, "mlp_only_layers": [5]})"),
            "config.json: mlp_only_layers: expected layer indices in [0, 2), got [5]");
  // transformers 5 writes num_local_experts for Qwen3-MoE; the Hub's folders say num_experts.
  anvil::testing::TempDir dir;
  anvil::testing::write_text(dir / "config.json", R"({"model_type": "qwen3_moe", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_local_experts": 3,
      "num_experts_per_tok": 1, "moe_intermediate_size": 4, "mlp_only_layers": [0]})");
  const auto config = nlohmann::json::parse(anvil::testing::read_text(dir / "config.json"));
  auto m = family_by_hf_model_type("qwen3_moe", "config.json").from_hf_config(config, "config.json");
  EXPECT_EQ(m->num_experts(), 3);
  EXPECT_EQ(m->router_aux_loss_coef, 0.0) << "no output_router_logits: transformers adds no load-balancing loss";
  const auto params = m->named_parameters();
  EXPECT_TRUE(params.contains("model.layers.0.mlp.gate_proj.weight")) << "layer 0 is dense";
  EXPECT_TRUE(params.contains("model.layers.1.mlp.experts.2.up_proj.weight"));
  EXPECT_EQ(params["model.layers.1.mlp.experts.2.up_proj.weight"].size(0), 4);
}

}  // namespace
}  // namespace anvil::models
