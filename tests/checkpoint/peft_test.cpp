// LoRA adapters (models/lora.h) and PEFT adapter folders (checkpoint/peft.h): PEFT
// loads ours and we load PEFT's with equal logits, a merged export gives the
// adapted logits in plain transformers (tests/parity/peft_parity.py), on every
// family; adapters start as the identity, can be switched off, and bad names
// and folders are errors that say what was expected.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "anvil/checkpoint/hf_model.h"
#include "checkpoint/peft.h"
#include "models/lora.h"
#include "anvil/models/registry.h"
#include "test_util.h"

namespace anvil::models {
namespace {

namespace stdfs = std::filesystem;
using anvil::testing::TempDir;

std::shared_ptr<CausalLM> build_flavor(const std::string& flavor) {
  const auto src = anvil::testing::source_dir();
  auto cfg = config::load_config({src + "/configs/quickstart.yaml", src + "/configs/models/" + flavor + ".yaml"},
                                 {"output_dir=unused"});
  auto mc = cfg.model;
  mc.vocab_size = 61;
  auto model = family_by_name(mc.family).from_config(mc);
  model->eval();
  return model;
}

/// Gives every adapter random B (PEFT starts B at zero, which would hide a wrong layout).
void randomize_adapters(CausalLM& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters())
    if (p.key().find(".lora_B.") != std::string::npos) p.value().normal_(0, 0.2);
}

TEST(Lora, StartsAsTheBaseModelAndSwitchesOff) {
  at::manual_seed(3);
  auto model = build_flavor("llama-debug");
  const auto ids = at::randint(61, {2, 9}, at::kLong);
  torch::NoGradGuard no_grad;
  const auto before = model->forward(ids);
  LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  const auto targets = add_lora(*model, o);
  EXPECT_EQ(targets, (std::vector<std::string>{"q_proj", "v_proj"}));  // PEFT's default for LLaMA
  EXPECT_TRUE(at::equal(model->forward(ids), before)) << "B = 0: the adapted model starts as the base";
  randomize_adapters(*model);
  const auto adapted = model->forward(ids);
  EXPECT_GT((adapted - before).abs().max().item<double>(), 1e-3);
  {
    LoraDisabled off(*model);
    EXPECT_TRUE(at::equal(model->forward(ids), before));
  }
  EXPECT_TRUE(at::equal(model->forward(ids), adapted));
  const auto opts = lora_options(*model);
  EXPECT_EQ(opts.r, 4);
  EXPECT_DOUBLE_EQ(opts.alpha, 8);
  int64_t adapters = 0;
  for (const auto& p : model->named_parameters()) adapters += is_lora_parameter(p.key());
  EXPECT_EQ(adapters, 2 * 2 * model->num_layers());  // A and B on q and v in every block
  merge_lora(*model);
  EXPECT_FALSE(has_lora(*model));
  EXPECT_LE((model->forward(ids) - adapted).abs().max().item<double>(), 1e-5);
}

TEST(Lora, UnknownTargetNamesTheLayersTheModelHas) {
  auto model = build_flavor("gpt2-debug");
  LoraOptions o;
  o.target_modules = {"q_proj"};
  try {
    add_lora(*model, o);
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("lora.target_modules: \"q_proj\""), std::string::npos) << what;
    EXPECT_NE(what.find("c_attn, c_fc, c_proj"), std::string::npos) << what;
  }
  EXPECT_FALSE(has_lora(*model));
}

TEST(Lora, BadAdapterConfigsNameFileAndKey) {
  TempDir dir;
  auto write = [&](const nlohmann::json& j) { std::ofstream(dir / "adapter_config.json") << j.dump(); };
  const nlohmann::json ok = {{"peft_type", "LORA"}, {"r", 4}, {"lora_alpha", 8}, {"target_modules", {"c_attn"}}};
  write(ok);
  EXPECT_EQ(checkpoint::read_peft_config(dir.path()).r, 4);
  auto expect_error = [&](nlohmann::json j, const std::string& needle) {
    write(j);
    try {
      checkpoint::read_peft_config(dir.path());
      ADD_FAILURE() << "expected an error for " << j.dump();
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("adapter_config.json"), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  };
  auto j = ok;
  j["peft_type"] = "IA3";
  expect_error(j, "peft_type");
  j = ok;
  j["use_dora"] = true;
  expect_error(j, "use_dora");
  j = ok;
  j["target_modules"] = ".*attn.*";
  expect_error(j, "target_modules");
  j = ok;
  j["target_parameters"] = {"gate_up_proj", "down_proj"};  // PEFT's all-linear on a transformers 5 MoE
  expect_error(j, "target_parameters");
  j = ok;
  j.erase("r");
  expect_error(j, "r is missing");
}

// The families' adapters in PEFT and PEFT's in Anvil, and merged exports.
TEST(Lora, PeftLoadsOursAndWeLoadPeftsWithEqualLogits) {
  TempDir dir;
  nlohmann::json cases = nlohmann::json::array();
  const std::vector<std::pair<std::string, std::vector<std::string>>> flavors = {
      {"gpt2-debug", {"c_attn", "c_proj"}},
      {"llama-debug", {"all-linear"}},
      {"neox-debug", {"query_key_value", "dense_4h_to_h"}},
      {"opt-debug", {"q_proj", "v_proj", "fc1"}},
      {"qwen2-debug", {"q_proj", "k_proj", "v_proj", "o_proj"}},
      {"qwen3-debug", {"all-linear"}},
      {"mistral-debug", {"q_proj", "v_proj", "down_proj"}},
      {"phi3-debug", {"qkv_proj", "gate_up_proj", "o_proj"}},
      {"gemma2-debug", {"q_proj", "v_proj", "up_proj"}},
      {"gemma3_text-debug", {"all-linear"}},
      {"mixtral-debug", {"q_proj", "k_proj", "v_proj", "o_proj"}},
      {"qwen3_moe-debug", {"q_proj", "v_proj", "o_proj"}}};
  // Every family of the registry has its case.
  for (const auto& f : anvil::testing::debug_flavors())
    EXPECT_TRUE(std::any_of(flavors.begin(), flavors.end(), [&](const auto& c) { return c.first == f; })) << f;
  for (const auto& [flavor, targets] : flavors) {
    at::manual_seed(11);
    auto model = build_flavor(flavor);
    const auto base = dir / (flavor + "-base"), adapter = dir / (flavor + "-adapter"),
               merged = dir / (flavor + "-merged");
    stdfs::create_directories(base);
    checkpoint::save_model_dir(base, *model, nullptr);
    LoraOptions o;
    o.r = 4;
    o.alpha = 16;
    o.dropout = 0.1;
    o.target_modules = targets;
    o.base_model = base.string();
    add_lora(*model, o);
    randomize_adapters(*model);
    stdfs::create_directories(adapter);
    checkpoint::save_model_dir(adapter, *model, nullptr);
    EXPECT_TRUE(stdfs::exists(adapter / "adapter_model.safetensors"));
    EXPECT_FALSE(stdfs::exists(adapter / "model.safetensors")) << "the base stays where it is";
    EXPECT_FALSE(stdfs::exists(adapter / "config.json")) << "transformers would look for the weights here";
    EXPECT_TRUE(stdfs::exists(adapter / checkpoint::kAdapterModelConfig));
    std::string out;
    ASSERT_EQ(anvil::testing::run(anvil::testing::cli_bin() + " export --merge-lora --checkpoint " + adapter.string() +
                                      " --output " + merged.string() + " 2>&1",
                                  &out),
              0)
        << out;
    // PEFT's own targets for its adapter: the default names per family.
    cases.push_back({{"base", base.string()},
                     {"adapter", adapter.string()},
                     {"merged", merged.string()},
                     {"targets", targets[0] == "all-linear" ? nlohmann::json("all-linear") : nlohmann::json(targets)}});
  }
  std::ofstream(dir / "cases.json") << cases.dump();
  std::string out;
  const auto cmd = anvil::testing::python_bin() + " " + anvil::testing::source_dir() + "/tests/parity/peft_parity.py " +
                   anvil::testing::cli_bin() + " " + dir.path().string() + " " + (dir / "cases.json").string() +
                   " 2>&1";
  ASSERT_EQ(anvil::testing::run(cmd, &out), 0) << out;
  EXPECT_NE(out.find("peft parity OK"), std::string::npos) << out;
}

TEST(Lora, ExportWithoutMergeSaysHow) {
  TempDir dir;
  auto model = build_flavor("gpt2-debug");
  const auto base = dir / "base", adapter = dir / "adapter";
  stdfs::create_directories(base);
  checkpoint::save_model_dir(base, *model, nullptr);
  LoraOptions o;
  o.r = 2;
  o.base_model = base.string();
  add_lora(*model, o);
  stdfs::create_directories(adapter);
  checkpoint::save_model_dir(adapter, *model, nullptr);
  std::string out;
  EXPECT_NE(anvil::testing::run(anvil::testing::cli_bin() + " export --checkpoint " + adapter.string() + " --output " +
                                    (dir / "x").string() + " 2>&1",
                                &out),
            0);
  EXPECT_NE(out.find("--merge-lora"), std::string::npos) << out;
  // A missing base is named, with the way to give it.
  stdfs::rename(base, dir / "moved");
  EXPECT_NE(anvil::testing::run(anvil::testing::cli_bin() + " export --merge-lora --checkpoint " + adapter.string() +
                                    " --output " + (dir / "y").string() + " 2>&1",
                                &out),
            0);
  EXPECT_NE(out.find("--base"), std::string::npos) << out;
  EXPECT_EQ(
      anvil::testing::run(anvil::testing::cli_bin() + " export --merge-lora --checkpoint " + adapter.string() +
                              " --base " + (dir / "moved").string() + " --output " + (dir / "y").string() + " 2>&1",
                          &out),
      0)
      << out;
}

}  // namespace
}  // namespace anvil::models
