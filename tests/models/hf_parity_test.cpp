// Parity with Hugging Face transformers itself: tests/parity/make_hf_references.py
// builds random-init models with transformers and records their logits, loss
// gradients and greedy generations; we load the same folders and must agree.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "anvil/generation/generate.h"
#include "anvil/checkpoint/hf_model.h"
#include "io/safetensors.h"
#include "anvil/train/sft.h"
#include "test_util.h"

namespace anvil::models {
namespace {

constexpr double kTol = 1e-4;

double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

void check_family(const std::string& family) {
  // Every family's references, made once per ctest run by the ParityReferences.Transformers fixture
  // (tests/CMakeLists.txt); a test run alone makes its family's.
  const anvil::testing::ReferenceFolder dir("ANVIL_HF_REFERENCES", "make_hf_references.py", family);
  ASSERT_TRUE(dir.ok()) << dir.log();
  nlohmann::json index = nlohmann::json::array();
  for (const auto& entry : nlohmann::json::parse(fs::read_file(dir / "index.json")))
    if (entry["family"] == family) index.push_back(entry);
  ASSERT_GE(index.size(), 2u) << "expected several " << family << " configs";
  for (const auto& entry : index) {
    const auto name = entry["name"].get<std::string>();
    SCOPED_TRACE(name);
    const auto model_dir = dir / name;
    auto model = checkpoint::load_model_dir(model_dir);
    ASSERT_EQ(model->family(), family);
    model->eval();
    io::SafetensorsFile ref(model_dir / "reference.safetensors");

    // Logits and the loss; a mixture of experts trained with output_router_logits adds the load-balancing
    // loss, whose gradient reaches the routers through the layers' outputs.
    const auto ids = ref.get("ids");
    const bool aux = ref.contains("aux_loss");
    EXPECT_EQ(aux, model->router_aux_loss_coef > 0) << "output_router_logits sets the loss weight";
    if (aux) model->begin_router_stats();
    auto logits = model->forward(ids);
    const auto ref_logits = ref.get("logits");
    ASSERT_EQ(logits.sizes(), ref_logits.sizes());
    EXPECT_LE(max_abs(logits - ref_logits), kTol) << "logits";
    const auto targets = ids.size(0) * (ids.size(1) - 1);
    auto loss = train::causal_lm_loss_sum(logits, ids) / static_cast<double>(targets);
    double total = loss.item<double>();
    if (aux) {
      const double weight = model->router_aux_loss_coef;
      const auto a = model->take_aux_loss(weight);
      ASSERT_TRUE(a.defined());
      EXPECT_NEAR(a.item<double>(), ref.get("aux_loss").item<double>(), kTol) << "aux_loss";
      total += weight * a.item<double>();
      // Padding (the attention_mask's zeros) takes no part: transformers' load_balancing_loss_func.
      model->begin_router_stats();
      models::ForwardArgs padded;
      padded.token_mask = ref.get("aux_mask").ne(0);
      (void)model->forward(ids, padded);
      const auto m = model->take_aux_loss(weight);
      ASSERT_TRUE(m.defined());
      EXPECT_NEAR(m.item<double>(), ref.get("aux_loss_masked").item<double>(), kTol) << "aux_loss with padding";
      EXPECT_GT(std::abs(m.item<double>() - a.item<double>()), 10 * kTol) << "the mask made no difference";
    }
    EXPECT_NEAR(total, ref.get("loss").item<double>(), kTol);

    // Gradients of that loss w.r.t. every parameter, relative to the largest entry.
    model->zero_grad();
    loss.backward();
    std::map<std::string, at::Tensor> params;
    for (const auto& p : model->named_parameters()) params.emplace(p.key(), p.value());
    size_t compared = 0;
    for (const auto& key : ref.names()) {
      if (key.rfind("grad.", 0) != 0) continue;
      const auto ours_name = model->checkpoint_key(key.substr(5));
      ASSERT_TRUE(params.count(ours_name)) << key;
      const auto& g = params.at(ours_name).grad();
      ASSERT_TRUE(g.defined()) << ours_name;
      const auto r = ref.get(key);
      // Relative to the largest entry, with a floor of 1e-4: without a rotary
      // embedding after it (OPT), the key bias's gradient is 0 in exact
      // arithmetic (a shift of every score of a query), so both sides are
      // round-off of ~1e-9 there, while real gradients here are >= 1e-3.
      const double rel = max_abs(g - r) / std::max(max_abs(r), 1e-4);
      EXPECT_LE(rel, kTol) << "gradient of " << ours_name;
      ++compared;
    }
    EXPECT_EQ(compared, params.size()) << "every parameter's gradient is compared";

    // Greedy generation token for token: all prompts in one left-padded batch,
    // and one at a time.
    const auto gen = nlohmann::json::parse(fs::read_file(model_dir / "generate.json"));
    const auto prompts = gen["prompts"].get<std::vector<std::vector<int64_t>>>();
    const auto expected = gen["outputs"].get<std::vector<std::vector<int64_t>>>();
    generation::SamplingOptions opt;
    opt.max_new_tokens = gen["max_new_tokens"].get<int64_t>();
    // LongRoPE's factors depend on the batch's furthest position (transformers' rule), so a batch is
    // compared only where the reference says the batch does not change the result.
    if (!gen.value("batch_dependent", false))
      EXPECT_EQ(generation::generate(*model, prompts, opt), expected) << "batched";
    opt.batch_size = 1;
    EXPECT_EQ(generation::generate(*model, prompts, opt), expected) << "one prompt at a time";
  }
}

TEST(HfParity, Gpt2LogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("gpt2"); }
TEST(HfParity, LlamaLogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("llama"); }
TEST(HfParity, Qwen2LogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("qwen2"); }
TEST(HfParity, Qwen3LogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("qwen3"); }
TEST(HfParity, MistralLogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("mistral"); }
TEST(HfParity, Phi3LogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("phi3"); }
TEST(HfParity, Gemma2LogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("gemma2"); }
TEST(HfParity, Gemma3LogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("gemma3_text"); }
TEST(HfParity, MixtralLogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("mixtral"); }
TEST(HfParity, Qwen3MoeLogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("qwen3_moe"); }
TEST(HfParity, NeoXLogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("neox"); }
TEST(HfParity, OptLogitsGradientsAndGreedyGenerationMatchTransformers) { check_family("opt"); }

}  // namespace
}  // namespace anvil::models
