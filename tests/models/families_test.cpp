// Behaviour every family must share, checked on each debug flavor in
// configs/models/: causality, KV cache = recompute, left padding = no
// padding, save/load round trip; and the named flavors' sizes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <filesystem>

#include "anvil/config/config.h"
#include "anvil/io/hf_model.h"
#include "anvil/io/safetensors.h"
#include "anvil/models/registry.h"
#include "test_util.h"

namespace anvil::models {
namespace {

std::shared_ptr<CausalLM> build_flavor(const std::string& flavor, int64_t vocab) {
  const auto src = anvil::testing::source_dir();
  auto cfg = config::load_config({src + "/configs/quickstart.yaml", src + "/configs/models/" + flavor + ".yaml"},
                                 {"output_dir=unused"});
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

TEST_P(Family, SavedFolderReloadsIdentically) {
  anvil::testing::TempDir dir;
  model_->special_tokens = {1, 2, 3};
  io::save_model_dir(dir.path(), *model_, nullptr);
  auto back = io::load_model_dir(dir.path());
  back->eval();
  EXPECT_EQ(back->family(), model_->family());
  EXPECT_EQ(back->special_tokens.eos, 2);
  auto ids = at::randint(61, {2, 10}, at::kLong);
  EXPECT_TRUE(at::equal(back->forward(ids), model_->forward(ids)));
}

INSTANTIATE_TEST_SUITE_P(DebugFlavors, Family,
                         ::testing::Values("gpt2-debug", "llama-debug", "qwen2-debug", "qwen3-debug", "pythia-debug",
                                           "opt-debug"),
                         [](const auto& info) {
                           auto n = info.param;
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n;
                         });

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
  EXPECT_EQ(count_parameters(*build_flavor("gpt2-124m", 0)), 124439808);
  EXPECT_EQ(count_parameters(*build_flavor("pythia-160m", 0)), 162322944);
  // OPT's tied head; opt-350m's 512-wide embeddings, project_in / project_out, post-LN (no final LayerNorm).
  EXPECT_EQ(count_parameters(*build_flavor("opt-125m", 0)), 125239296);
  EXPECT_EQ(count_parameters(*build_flavor("opt-350m", 0)), 331196416);
}

}  // namespace
}  // namespace anvil::models

namespace anvil::models {
namespace {

std::string load_error(const std::string& config_json) {
  anvil::testing::TempDir dir;
  anvil::testing::write_text(dir / "config.json", config_json);
  try {
    io::load_model_dir(dir.path());
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
  io::save_model_dir(dir.path(), *model, nullptr);
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
      io::load_model_dir(dir.path());
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

TEST(HfImport, QwenSlidingWindowIsRefused) {
  const std::string qwen2 = R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 2, "num_attention_heads": 2)";
  EXPECT_EQ(load_error(qwen2 + R"(, "use_sliding_window": true, "sliding_window": 4})"),
            "config.json: use_sliding_window: sliding-window attention is not supported; only full attention (false)");
  EXPECT_EQ(load_error(qwen2 + R"(, "layer_types": ["full_attention", "sliding_attention"]})"),
            "config.json: layer_types: layer type \"sliding_attention\" is not supported; only \"full_attention\"");
}

TEST(HfImport, UnsupportedConfigsNameTheFileAndKey) {
  EXPECT_EQ(load_error(R"({"model_type": "mamba"})"),
            "config.json: model_type \"mamba\" is not supported; supported: gpt2, llama, qwen2, qwen3, gpt_neox, opt");
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
            "config.json: rope_parameters.rope_type: \"yarn\" is not supported; supported: default, llama3");
  EXPECT_EQ(load_error(llama + R"(, "num_key_value_heads": 3})"),
            "config.json: num_key_value_heads: 3 must divide num_attention_heads 2");
  EXPECT_EQ(load_error(llama + R"(, "hidden_act": "xielu"})"), "config.json: hidden_act: \"xielu\" is not supported");
  EXPECT_EQ(load_error(R"({"model_type": "gpt_neox", "vocab_size": 10, "hidden_size": 8})"),
            "config.json: intermediate_size: required GPT-NeoX field is missing");
  EXPECT_EQ(load_error(R"({"model_type": "gpt_neox", "vocab_size": 10, "hidden_size": "8"})"),
            "config.json: hidden_size: expected an integer, got \"8\"");
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
