// The model section builds a model through the family's own config.json key
// list (the registry writes the section as a config.json under the family's
// names): every shared key a family reads and every key of its own reaches
// the model it builds, and the folder that model saves builds it again.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "anvil/models/registry.h"

namespace anvil::models {
namespace {

config::ModelConfig tiny(const std::string& family) {
  config::ModelConfig mc;
  mc.family = family;
  mc.vocab_size = 50, mc.hidden_size = 32, mc.num_hidden_layers = 2, mc.num_attention_heads = 4,
  mc.max_position_embeddings = 16;
  return mc;
}

/// A change of each model-section key to a value no family takes by default.
struct Change {
  const char* key;
  std::function<void(config::ModelConfig&, const nlohmann::json& built)> apply;
};

std::vector<Change> changes() {
  using MC = config::ModelConfig;
  using J = nlohmann::json;
  return {
      {"model.vocab_size", [](MC& c, const J&) { c.vocab_size = 60; }},
      {"model.max_position_embeddings", [](MC& c, const J&) { c.max_position_embeddings = 24; }},
      {"model.hidden_size", [](MC& c, const J&) { c.hidden_size = 48; }},
      {"model.num_hidden_layers", [](MC& c, const J&) { c.num_hidden_layers = 3; }},
      {"model.num_attention_heads", [](MC& c, const J&) { c.num_attention_heads = 2; }},
      {"model.num_key_value_heads", [](MC& c, const J&) { c.keys.get<AttentionKeys>().num_key_value_heads = 2; }},
      {"model.head_dim", [](MC& c, const J&) { c.keys.get<AttentionKeys>().head_dim = 16; }},
      {"model.intermediate_size", [](MC& c, const J&) { c.intermediate_size = 40; }},
      {"model.hidden_act",
       [](MC& c, const J& built) {
         // The one of two activations the built model does not have.
         const auto act =
             built.value("hidden_act", built.value("activation_function", built.value("hidden_activation", "")));
         c.hidden_act = act == "relu" ? "silu" : "relu";
       }},
      {"model.dropout", [](MC& c, const J&) { c.dropout = 0.125; }},
      {"model.layer_norm_eps", [](MC& c, const J&) { c.keys.get<NormKeys>().layer_norm_eps = 1e-3; }},
      {"model.initializer_range", [](MC& c, const J&) { c.initializer_range = 0.05; }},
      {"model.tie_word_embeddings",
       [](MC& c, const J& built) {
         c.tie_word_embeddings = built.value("tie_word_embeddings", true) ? config::Tied::kFalse : config::Tied::kTrue;
       }},
      {"model.attention_bias", [](MC& c, const J&) { c.keys.get<AttentionKeys>().attention_bias = true; }},
      {"model.sliding_window", [](MC& c, const J&) { c.keys.get<AttentionKeys>().sliding_window = 8; }},
      {"model.rope_theta", [](MC& c, const J&) { c.keys.get<RotaryKeys>().rope_theta = 5000; }},
      {"model.rope_scaling.type",
       [](MC& c, const J&) {
         auto& scaling = c.keys.get<RotaryKeys>().rope_scaling;
         scaling.type = RopeScaling::kLlama3;
         scaling.original_max_position_embeddings = 8;
       }},
      {"model.partial_rotary_factor", [](MC& c, const J&) { c.keys.get<RotaryKeys>().partial_rotary_factor = 0.5; }},
      {"model.num_experts", [](MC& c, const J&) { c.keys.get<ExpertKeys>().num_experts = 4; }},
      {"model.num_experts_per_tok", [](MC& c, const J&) { c.keys.get<ExpertKeys>().num_experts_per_tok = 1; }},
      {"model.moe_intermediate_size", [](MC& c, const J&) { c.keys.get<ExpertKeys>().moe_intermediate_size = 24; }},
      {"model.router_aux_loss_coef", [](MC& c, const J&) { c.keys.get<ExpertKeys>().router_aux_loss_coef = 0.25; }},
  };
}

/// Whether `family` reads `key`: a key no family lists among those only some read is every family's.
bool reads(const config::FamilyKeys& family, const std::string& key) {
  std::set<std::string> partial;
  for (const auto& f : config::model_families()) partial.insert(f.reads.begin(), f.reads.end());
  return !partial.count(key) || std::find(family.reads.begin(), family.reads.end(), key) != family.reads.end();
}

/// Whether the family's own checks of the section refuse `mc` (GPT-2's untied head).
bool refused(const config::FamilyKeys& family, const config::ModelConfig& mc) {
  bool failed = false;
  if (family.check) family.check(mc, config::Checks([&](const std::string&, const std::string&) { failed = true; }));
  return failed;
}

TEST(ModelSection, EveryKeyAFamilyReadsReachesTheModelItBuilds) {
  size_t checked = 0;
  const auto built_here = family_names();  // the config layer may hold a test's families too, keys only
  for (const auto& family : config::model_families()) {
    if (!std::count(built_here.begin(), built_here.end(), family.name)) continue;
    SCOPED_TRACE(family.name);
    const auto& builder = family_by_name(family.name);
    const auto base = builder.from_config(tiny(family.name))->hf_config();
    for (const auto& change : changes()) {
      if (!reads(family, change.key)) continue;
      SCOPED_TRACE(change.key);
      auto mc = tiny(family.name);
      change.apply(mc, base);
      if (refused(family, mc)) continue;
      const auto built = builder.from_config(mc)->hf_config();
      EXPECT_NE(built, base) << "the key does not reach " << family.name << "'s model";
      // The folder the model saves builds the same model again.
      EXPECT_EQ(family_by_hf_model_type(built.at("model_type").get<std::string>(), "test")
                    .from_hf_config(built, "test")
                    ->hf_config(),
                built);
      ++checked;
    }
  }
  EXPECT_GE(checked, 180u);  // 14 families, 10 to 17 keys each
}

/// Changes field `target` of a section (the n-th the visit lists) to a value none of them has by default:
/// a bool flipped, a number raised; names the key it changed.
class ChangeOneField : public config::FieldVisitor {
 public:
  explicit ChangeOneField(size_t target) : target_(target) {}
  std::string changed;
  void field(const char* key, bool& x, const char*, const config::Rule&) override {
    if (mine(key)) x = !x;
  }
  void field(const char* key, int64_t& x, const char*, const config::Rule&) override {
    if (mine(key)) x += 16;
  }
  void field(const char* key, double& x, const char*, const config::Rule&) override {
    if (mine(key)) x = x / 2 + 0.25;
  }
  void field(const char* key, std::string&, const char*, const config::Rule&) override { skip(key); }
  void field(const char* key, std::vector<double>&, const char*, const config::Rule&) override { skip(key); }
  void field(const char* key, std::vector<int64_t>&, const char*, const config::Rule&) override { skip(key); }
  void field(const char* key, std::vector<std::string>&, const char*, const config::Rule&) override { skip(key); }
  void section(const char* key, const config::SectionRef&, const char*) override { skip(key); }
  void list(const char* key, const config::ListRef&, const char*) override { skip(key); }

 private:
  bool mine(const char* key) {
    if (seen_++ != target_) return false;
    changed = key;
    return true;
  }
  void skip(const char* key) {
    if (mine(key)) ADD_FAILURE() << key << ": a family's own key of a kind this test cannot change";
  }
  size_t target_, seen_ = 0;
};

TEST(ModelSection, EveryOwnKeyOfAFamilyReachesTheModelItBuilds) {
  size_t checked = 0;
  const auto built_here = family_names();
  for (const auto& family : config::model_families()) {
    if (!family.own_keys || !std::count(built_here.begin(), built_here.end(), family.name)) continue;
    SCOPED_TRACE(family.name);
    const auto& builder = family_by_name(family.name);
    const auto base = builder.from_config(tiny(family.name))->hf_config();
    for (size_t i = 0;; ++i) {
      auto mc = tiny(family.name);
      ChangeOneField change(i);
      mc.keys.at(family.name).visit(change);
      if (change.changed.empty()) break;  // past the last key
      SCOPED_TRACE(change.changed);
      const auto built = builder.from_config(mc)->hf_config();
      EXPECT_NE(built, base) << "the key does not reach " << family.name << "'s model";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6u);  // OPT's do_layer_norm_before, word_embed_proj_dim, enable_bias, two LayerNorm keys;
                           // NeoX's use_parallel_residual
}

/// The names of a struct's keys (a section by its own name).
class KeyNames : public config::FieldVisitor {
 public:
  std::vector<std::string> names;
  void field(const char* k, bool&, const char*, const config::Rule&) override { names.emplace_back(k); }
  void field(const char* k, int64_t&, const char*, const config::Rule&) override { names.emplace_back(k); }
  void field(const char* k, double&, const char*, const config::Rule&) override { names.emplace_back(k); }
  void field(const char* k, std::string&, const char*, const config::Rule&) override { names.emplace_back(k); }
  void field(const char* k, std::vector<double>&, const char*, const config::Rule&) override { names.emplace_back(k); }
  void field(const char* k, std::vector<int64_t>&, const char*, const config::Rule&) override { names.emplace_back(k); }
  void field(const char* k, std::vector<std::string>&, const char*, const config::Rule&) override {
    names.emplace_back(k);
  }
  void section(const char* k, const config::SectionRef&, const char*) override { names.emplace_back(k); }
  void list(const char* k, const config::ListRef&, const char*) override { names.emplace_back(k); }
};

// The test above changes the keys its list names: every key of every registered group (models/registry.h) is there,
// so a key added to a group must reach a model too.
TEST(ModelSection, EveryKeyOfAKeyGroupIsChangedAbove) {
  std::set<std::string> listed;
  for (const auto& c : changes()) listed.insert(c.key);
  size_t keys = 0;
  config::ModelConfig mc;
  for (const auto& g : config::model_key_groups()) {
    if (g.name.rfind("unread_keys_", 0) == 0) continue;  // a config test's group, registered with no model
    KeyNames k;
    mc.keys.at(g.name).visit(k);
    for (const auto& name : k.names) {
      const auto key = "model." + name;
      EXPECT_TRUE(listed.count(key) || listed.count(key + ".type")) << key << " of group " << g.name;
      ++keys;
    }
  }
  EXPECT_EQ(keys, 12u);  // norm 1, attention 4, rotary 3 (rope_scaling as one), experts 4
}

TEST(ModelSection, AShapeErrorOfTheSectionIsAConfigError) {
  auto mc = tiny("mixtral");
  mc.keys.get<ExpertKeys>().num_experts = 2;
  mc.keys.get<ExpertKeys>().num_experts_per_tok = 3;
  try {
    family_by_name("mixtral").from_config(mc);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "model.num_experts_per_tok: 3 exceeds model.num_experts 2");
  }
  // One the family's config.json reader finds names the section and the key as config.json has it.
  mc = tiny("neox");
  mc.keys.get<RotaryKeys>().partial_rotary_factor = 0.2;  // of 8 dims per head: 1
  try {
    family_by_name("neox").from_config(mc);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "model section (read as a config.json): partial_rotary_factor: gives an odd rotary dimension 1");
  }
}

}  // namespace
}  // namespace anvil::models
