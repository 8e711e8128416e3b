// The open engine (docs/library.md): an objective registered by name runs
// through run_training; the loop calls its hooks in order (prepare, before
// each iteration, micro-batches, after each step, eval, save), restores its
// state on resume, and never touches the parameters it freezes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "anvil/checkpoint/hf_model.h"
#include "io/safetensors.h"
#include "core/tensor_bytes.h"
#include "distributed/env.h"
#include "anvil/models/registry.h"
#include <unordered_set>
#include "anvil/train/sft.h"
#include "anvil/tokenizer/tokenizer.h"
#include "anvil/train/trainer.h"
#include "test_util.h"
#include "distributed/sharding.h"

namespace anvil::train {
namespace {

namespace stdfs = std::filesystem;
using anvil::testing::TempDir;

std::vector<std::string>& events() {
  static std::vector<std::string> e;
  return e;
}

/// SFT with every hook recorded: two optimizer steps per iteration, a
/// counter as its checkpointed state, and (for "frozen_sft") one frozen
/// parameter.
class RecordingObjective final : public Objective {
 public:
  RecordingObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat,
                     bool freeze)
      : inner_(cfg, tok, chat, LmTask::sft), freeze_(freeze) {}

  std::string name() const override { return freeze_ ? "frozen_sft" : "hooked_sft"; }
  void prepare(models::CausalLM& model, const RunContext& ctx) override {
    events().push_back("prepare");
    inner_.prepare(model, ctx);
    if (!freeze_) model.add_head("value", 1);  // a named head, trained below
    for (const auto& p : model.named_parameters()) initial_[p.key()] = p.value().detach().clone();
  }
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override {
    events().push_back("micro-batch");
    auto loss = inner_.loss_sum(model, batch, sums);
    if (freeze_) return loss;
    const auto ids = batch.tensors.at("input_ids").to(model.parameters().front().device());
    const auto values = model.head("value", model.hidden_states(ids, {}).detach());  // (B, T, 1)
    return loss + (values - 1.0).pow(2).mean() * static_cast<double>(batch.num_targets);
  }
  EvalResult evaluate(models::CausalLM& model) override {
    events().push_back("evaluate");
    return inner_.evaluate(model);
  }
  BatchSource& train_source() override { return inner_.train_source(); }

  int64_t steps_per_iteration() const override { return 2; }
  Metrics before_iteration(Engine& engine, int64_t iteration, int64_t step) override {
    (void)engine;
    events().push_back(concat("before_iteration ", iteration, " at step ", step));
    return {{"rollout/score", 0.5 + static_cast<double>(iteration)}};
  }
  void after_step(Engine& engine, int64_t step) override {
    ++counter_;
    events().push_back(concat("after_step ", step));
    if (!freeze_) return;
    // Engine::parameter_units / unit_parameters (plain, and sharded with a frozen unit): every parameter in
    // one unit, each unit's values the masters get_parameters gives.
    std::vector<std::string> seen;
    const auto units = engine.parameter_units();
    for (size_t u = 0; u < units.size(); ++u) {
      const auto values = engine.unit_parameters(u);
      const auto masters = engine.get_parameters(units[u]);
      ASSERT_EQ(values.size(), units[u].size());
      for (size_t j = 0; j < values.size(); ++j)
        EXPECT_TRUE(values[j].to(at::kFloat).equal(masters.at(units[u][j]).to(at::kFloat))) << units[u][j];
      seen.insert(seen.end(), units[u].begin(), units[u].end());
    }
    std::vector<std::string> names;
    for (const auto& p : engine.model().named_parameters()) names.push_back(p.key());
    std::sort(seen.begin(), seen.end());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(seen, names);
    auto whole = engine.gathered();  // sharded weights are whole only inside this scope
    for (const auto& p : engine.model().named_parameters())
      if (!trains(p.key())) EXPECT_TRUE(p.value().equal(initial_.at(p.key()))) << p.key() << " moved at " << step;
  }
  nlohmann::json state() const override {
    events().push_back(concat("state ", counter_));
    return {{"counter", counter_}};
  }
  void restore(const nlohmann::json& state) override {
    events().push_back("restore " + state.dump());
    counter_ = state.at("counter").get<int64_t>();
  }
  bool trains(const std::string& name) const override {
    return !(freeze_ && name == "transformer.h.0.attn.c_attn.weight");
  }

 private:
  LmObjective inner_;
  bool freeze_;
  int64_t counter_ = 0;
  std::map<std::string, at::Tensor> initial_;
};

/// A registered config section: `hooked.bonus`.
struct HookedConfig {
  int64_t bonus = 1;
  void visit(config::FieldVisitor& v) { v.field("bonus", bonus, "A positive number.", config::positive()); }
};

void register_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    config::register_section<HookedConfig>("hooked", "A test section.", "hooked_sft");
    register_objective("hooked_sft", [](const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
                                        const chat::ChatTemplate& chat) {
      return std::make_unique<RecordingObjective>(cfg, tok, chat, false);
    });
    register_objective("frozen_sft", [](const config::RunConfig& cfg, const tokenizer::Tokenizer& tok,
                                        const chat::ChatTemplate& chat) {
      return std::make_unique<RecordingObjective>(cfg, tok, chat, true);
    });
  });
}

config::RunConfig tiny_in(const stdfs::path& dir, const std::string& algorithm, std::vector<std::string> overrides) {
  overrides.push_back("algorithm=" + algorithm);
  overrides.push_back("output_dir=" + (dir / "out").string());
  overrides.push_back("train.eval_every=4");
  overrides.push_back("logging.level=warn");
  overrides.push_back("tokenizer.path=" + anvil::testing::source_dir() + "/data/tokenizer.model");
  overrides.push_back("data.train[0].path=" + anvil::testing::source_dir() + "/data/sft_train.jsonl");
  return config::load_config({(dir / "run.yaml").string()}, overrides);
}

config::RunConfig tiny(const TempDir& dir, const std::string& algorithm, std::vector<std::string> overrides) {
  anvil::testing::write_text(dir / "run.yaml", anvil::testing::tiny_sft_run(6, 2));
  return tiny_in(dir.path(), algorithm, std::move(overrides));
}

TEST(Engine, RegisteredObjectiveRunsWithItsHooksInOrderAndItsStateResumes) {
  TempDir dir;
  EXPECT_THROW(tiny(dir, "hooked_sft", {}), ConfigError);  // not registered yet
  register_once();
  events().clear();
  auto result = run_training(tiny(dir, "hooked_sft", {"train.max_steps=4"}));
  EXPECT_EQ(result.step, 4);
  const std::vector<std::string> first = {"prepare",     "before_iteration 0 at step 0",
                                          "micro-batch", "after_step 1",
                                          "micro-batch", "after_step 2",
                                          "state 2",     "before_iteration 1 at step 2",
                                          "micro-batch", "after_step 3",
                                          "micro-batch", "after_step 4",
                                          "evaluate",    "state 4"};
  EXPECT_EQ(events(), first);

  // Resume from checkpoint-2 with a longer run: state and iteration count come back.
  stdfs::remove_all(dir / "out" / "checkpoint-4");
  events().clear();
  result = run_training(tiny(dir, "hooked_sft", {"train.max_steps=6"}));
  EXPECT_EQ(result.step, 6);
  const std::vector<std::string> resumed = {"prepare",
                                            "restore {\"counter\":2}",
                                            "before_iteration 1 at step 2",
                                            "micro-batch",
                                            "after_step 3",
                                            "micro-batch",
                                            "after_step 4",
                                            "evaluate",
                                            "state 4",
                                            "before_iteration 2 at step 4",
                                            "micro-batch",
                                            "after_step 5",
                                            "micro-batch",
                                            "after_step 6",
                                            "evaluate",
                                            "state 6"};
  EXPECT_EQ(events(), resumed);
  // The iteration's metrics join its first step's line; every step has a line.
  std::ifstream in(dir / "out" / "metrics.jsonl");
  std::string line;
  std::vector<int64_t> steps;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    steps.push_back(j["step"].get<int64_t>());
    EXPECT_EQ(j.contains("rollout/score"), j["step"].get<int64_t>() % 2 == 1) << line;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  const auto state =
      nlohmann::json::parse(anvil::testing::read_text(dir / "out" / "checkpoint-6" / "trainer_state.json"));
  EXPECT_EQ(state["objective"]["counter"], 6);
  EXPECT_EQ(state["iteration"], 3);

  EXPECT_THROW(register_objective("hooked_sft", [](const config::RunConfig&, const tokenizer::Tokenizer&,
                                                   const chat::ChatTemplate&) { return std::unique_ptr<Objective>(); }),
               ConfigError);
  EXPECT_THROW(register_objective("Bad Name", [](const config::RunConfig&, const tokenizer::Tokenizer&,
                                                 const chat::ChatTemplate&) { return std::unique_ptr<Objective>(); }),
               ConfigError);
}

// The built-in LM objective takes its task from whoever holds it, not from
// the run's algorithm name: under hooked_sft it reads SFT rows as sft's task
// and refuses them as pretrain's, naming the run's own algorithm.
TEST(Engine, LmObjectiveTakesItsTaskFromItsOwnerNotTheAlgorithmName) {
  register_once();
  TempDir dir;
  auto cfg = tiny(dir, "hooked_sft", {});
  cfg.data.max_length = 32;  // the trainer's setup resolves these two from the model and tokenizer
  cfg.data.template_name = "plain";
  const auto tok = tokenizer::load_tokenizer("auto", cfg.tokenizer.path);
  const auto& plain = chat::ChatTemplate::get("plain");
  LmObjective sft(cfg, *tok, plain, LmTask::sft);
  EXPECT_EQ(sft.name(), "hooked_sft");
  try {
    LmObjective pretrain(cfg, *tok, plain, LmTask::pretrain);
    ADD_FAILURE() << "pretrain's task accepted a JSONL file of SFT samples";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.train[0].path: algorithm hooked_sft reads token shards"),
              std::string::npos)
        << e.what();
  }
}

// The run's chat format reaches an objective as the object its factory gets,
// not as a name looked up again: a template that counts its calls renders
// every SFT sample and gives the end of turn, while cfg.data.template names
// another format that this tokenizer could not render (chatml's markers are
// not single tokens of it).
class CountingTemplate final : public chat::ChatTemplate {
 public:
  CountingTemplate() : chat::ChatTemplate("counting") {}
  chat::TokenizedChat encode(const tokenizer::Tokenizer& tok, const std::vector<chat::Message>& messages,
                             bool train_on_prompt, const std::string& tools) const override {
    ++encoded;
    return plain().encode(tok, messages, train_on_prompt, tools);
  }
  std::vector<int64_t> encode_prompt(const tokenizer::Tokenizer& tok, const std::vector<chat::Message>& messages,
                                     const std::string& tools) const override {
    return plain().encode_prompt(tok, messages, tools);
  }
  std::vector<int64_t> encode_reply(const tokenizer::Tokenizer& tok, const std::string& content) const override {
    return plain().encode_reply(tok, content);
  }
  int64_t end_of_turn_id(const tokenizer::Tokenizer& tok) const override {
    ++stops;
    return plain().end_of_turn_id(tok);
  }
  std::string jinja(const tokenizer::Tokenizer& tok) const override { return plain().jinja(tok); }
  mutable int64_t encoded = 0, stops = 0;

 private:
  static const chat::ChatTemplate& plain() { return chat::ChatTemplate::get("plain"); }
};

TEST(Engine, AnObjectiveRendersWithTheChatFormatItIsGiven) {
  register_once();
  TempDir dir;
  auto cfg = tiny(dir, "hooked_sft", {});
  cfg.data.max_length = 32;
  cfg.data.template_name = "chatml";
  const auto tok = tokenizer::load_tokenizer("auto", cfg.tokenizer.path);
  EXPECT_THROW((void)chat::ChatTemplate::get("chatml").end_of_turn_id(*tok), Error);
  CountingTemplate counting;
  LmObjective sft(cfg, *tok, counting, LmTask::sft);
  EXPECT_GT(counting.encoded, 0);
  EXPECT_EQ(counting.stops, 1);  // looked up once, at construction
}

TEST(Engine, HeadsAreSavedBesideTheHfFolderAndRestoredOnResume) {
  register_once();
  TempDir a, b;
  ASSERT_EQ(run_training(tiny(a, "hooked_sft", {"train.max_steps=4"})).step, 4);
  const auto ckpt = a / "out" / "checkpoint-4";
  // Beside the HF files: heads.safetensors + heads.json; model.safetensors has none.
  io::SafetensorsFile heads(ckpt / "heads.safetensors");
  auto names = heads.names();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"heads.value.bias", "heads.value.weight"}));
  for (const auto& n : io::SafetensorsFile(ckpt / "model.safetensors").names())
    EXPECT_NE(n.rfind("heads.", 0), 0u) << n;
  EXPECT_EQ(nlohmann::json::parse(anvil::testing::read_text(ckpt / "heads.json"))["heads"]["value"]["out_features"], 1);
  // The head trained, and load_model_dir brings it back.
  io::SafetensorsFile early(a / "out" / "checkpoint-2" / "heads.safetensors");
  EXPECT_FALSE(early.get("heads.value.weight").equal(heads.get("heads.value.weight")));
  auto loaded = checkpoint::load_model_dir(ckpt);
  ASSERT_TRUE(loaded->has_head("value"));
  EXPECT_TRUE(loaded->named_parameters()["heads.value.weight"].equal(heads.get("heads.value.weight")));

  // Resumed from checkpoint-2, the head continues exactly as in the straight run.
  stdfs::create_directories(b / "out");
  stdfs::copy(a / "out" / "checkpoint-2", b / "out" / "checkpoint-2", stdfs::copy_options::recursive);
  ASSERT_EQ(run_training(tiny(b, "hooked_sft", {"train.max_steps=4"})).step, 4);
  io::SafetensorsFile resumed(b / "out" / "checkpoint-4" / "heads.safetensors");
  EXPECT_TRUE(resumed.get("heads.value.weight").equal(heads.get("heads.value.weight")));
  EXPECT_TRUE(resumed.get("heads.value.bias").equal(heads.get("heads.value.bias")));

  // transformers loads the checkpoint as is, with the logits Anvil gives.
  std::string out;
  ASSERT_EQ(anvil::testing::run(anvil::testing::python_bin() + " " + anvil::testing::source_dir() +
                                    "/tests/parity/logits_in_transformers.py " + anvil::testing::cli_bin() + " " +
                                    a.path().string() + " " + ckpt.string() + " 2>&1",
                                &out),
            0)
      << out;
  EXPECT_NE(out.find("transformers parity OK"), std::string::npos) << out;
}

TEST(Engine, FrozenParametersAreNeitherUpdatedNorDecayed) {
  TempDir dir;
  register_once();
  // Weight decay would shrink a frozen weight that the optimizer held.
  auto result = run_training(tiny(dir, "frozen_sft", {"optimizer.weight_decay=0.5", "train.max_steps=4"}));
  ASSERT_EQ(result.step, 4);
  // The checkpoints hold the untouched weight; the others trained.
  io::SafetensorsFile start(dir / "out" / "checkpoint-2" / "model.safetensors");
  io::SafetensorsFile end(dir / "out" / "checkpoint-4" / "model.safetensors");
  EXPECT_TRUE(start.get("transformer.h.0.attn.c_attn.weight").equal(end.get("transformer.h.0.attn.c_attn.weight")));
  EXPECT_FALSE(start.get("transformer.h.0.mlp.c_fc.weight").equal(end.get("transformer.h.0.mlp.c_fc.weight")));

  // The sharded engine (full_shard on one rank here): the frozen weight is
  // the same initial value as on the plain path, at every checkpoint.
  TempDir dir2;
  ASSERT_EQ(run_training(tiny(dir2, "frozen_sft",
                              {"optimizer.weight_decay=0.5", "train.max_steps=4", "dist.sharding=full_shard",
                               "dist.consolidated_checkpoints=true"}))
                .step,
            4);
  io::SafetensorsFile sharded(dir2 / "out" / "checkpoint-4" / "model.safetensors");
  EXPECT_TRUE(sharded.get("transformer.h.0.attn.c_attn.weight").equal(start.get("transformer.h.0.attn.c_attn.weight")));
  EXPECT_FALSE(sharded.get("transformer.h.0.mlp.c_fc.weight").equal(start.get("transformer.h.0.mlp.c_fc.weight")));
}

// Two ranks under mpirun, each running this test binary in-process (the
// child branch below), full_shard with the frozen parameter split across
// the ranks' shards.
TEST(Engine, FrozenParametersStayOnTwoShardedRanks) {
  register_once();
  if (const char* out = std::getenv("ANVIL_ENGINE_TEST_DIR")) {  // a rank
    const auto r =
        run_training(tiny_in(out, "frozen_sft",
                             {"optimizer.weight_decay=0.5", "train.max_steps=4", "dist.sharding=full_shard",
                              "dist.consolidated_checkpoints=true", "train.threads=1", "train.grad_accum_steps=2"}));
    EXPECT_EQ(r.step, 4);
    return;
  }
  TempDir dir;
  anvil::testing::write_text(dir / "run.yaml", anvil::testing::tiny_sft_run(6, 2));
  std::string log;
  const auto self = stdfs::read_symlink("/proc/self/exe").string();
  ASSERT_EQ(anvil::testing::run("ANVIL_ENGINE_TEST_DIR=" + dir.path().string() +
                                    " mpirun --allow-run-as-root --oversubscribe --bind-to none -x "
                                    "ANVIL_ENGINE_TEST_DIR -np 2 " +
                                    self + " --gtest_filter=Engine.FrozenParametersStayOnTwoShardedRanks 2>&1",
                                &log),
            0)
      << log;
  const auto meta = nlohmann::json::parse(anvil::testing::read_text(dir / "out" / "checkpoint-4" / "sharding.json"));
  EXPECT_EQ(meta["world_size"], 2) << log;
  // The HF folders of two ranks: a file per unit, read through their index.
  EXPECT_TRUE(stdfs::exists(dir / "out" / "checkpoint-4" / "model.safetensors.index.json"));
  const auto start = checkpoint::load_model_dir(dir / "out" / "checkpoint-2")->named_parameters();
  const auto end = checkpoint::load_model_dir(dir / "out" / "checkpoint-4")->named_parameters();
  EXPECT_TRUE(start["transformer.h.0.attn.c_attn.weight"].equal(end["transformer.h.0.attn.c_attn.weight"]));
  EXPECT_FALSE(start["transformer.h.0.mlp.c_fc.weight"].equal(end["transformer.h.0.mlp.c_fc.weight"]));
}

// A frozen model (a reference, a reward model) held under full_shard on two
// ranks: each rank keeps about half of its blocks, the forward gives the
// whole model's logits (also inside gathered(), and with ranks running
// different work there), and nothing about it trains.
TEST(Engine, FrozenModelsAreShardedLikeThePolicy) {
  const bool rank = std::getenv("ANVIL_FROZEN_TEST") != nullptr;
  if (!rank) {
    std::string log;
    const auto self = stdfs::read_symlink("/proc/self/exe").string();
    ASSERT_EQ(anvil::testing::run("ANVIL_FROZEN_TEST=1 mpirun --allow-run-as-root --oversubscribe --bind-to none -x "
                                  "ANVIL_FROZEN_TEST -np 2 " +
                                      self + " --gtest_filter=Engine.FrozenModelsAreShardedLikeThePolicy 2>&1",
                                  &log),
              0)
        << log;
    return;
  }
  at::set_num_threads(1);
  config::ModelConfig mc;
  mc.family = "llama", mc.vocab_size = 64, mc.hidden_size = 32, mc.num_hidden_layers = 4, mc.num_attention_heads = 4;
  mc.max_position_embeddings = 32;
  torch::manual_seed(11);
  auto model = models::family_by_name("llama").from_config(mc);
  auto whole_copy = models::clone_model(*model);
  whole_copy->eval();
  const auto ids = at::randint(64, {3, 9}, at::kLong);
  const auto expected = whole_copy->forward(ids).detach();
  std::unordered_set<const void*> seen;
  const auto whole_bytes = storage_bytes(whole_copy->parameters(), seen);

  RunContext ctx;
  ctx.comm = distributed::make_communicator(distributed::discover_from_environment(), at::kCPU, {});
  ASSERT_EQ(ctx.comm->world_size(), 2);
  distributed::ShardingOptions so;
  so.strategy = distributed::Sharding::FullShard;
  ctx.sharding = std::make_shared<const distributed::ShardingOptions>(so);
  EXPECT_TRUE(ctx.full_shard());
  auto frozen = ctx.freeze(model);
  ASSERT_TRUE(frozen.sharded());
  // Blocks are half on each rank; the root unit (embeddings, norm, LM head) stays whole.
  int64_t block_bytes = 0;
  for (const auto& p : whole_copy->named_parameters())
    if (p.key().rfind("model.layers.", 0) == 0) block_bytes += p.value().numel() * 4;
  EXPECT_LE(frozen.parameter_bytes(), whole_bytes - block_bytes / 2 + 1024) << whole_bytes << " " << block_bytes;
  EXPECT_LT(frozen.parameter_bytes(), whole_bytes);
  for (const auto& p : frozen->parameters()) EXPECT_FALSE(p.requires_grad());
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(at::allclose(frozen->forward(ids), expected, 1e-5, 1e-6));
  }
  // Even under grad mode (a loss that reads it) it builds no graph.
  EXPECT_FALSE(frozen->forward(ids).requires_grad());
  {
    auto whole = frozen.gathered();
    EXPECT_GE(frozen.parameter_bytes(), whole_bytes);
    torch::NoGradGuard no_grad;
    // Uneven work per rank is safe while gathered: rank 1 runs two forwards.
    for (int64_t k = 0; k <= ctx.comm->rank(); ++k)
      EXPECT_TRUE(at::allclose(frozen->forward(ids), expected, 1e-5, 1e-6));
  }
  EXPECT_LT(frozen.parameter_bytes(), whole_bytes);  // released again
  ctx.comm->barrier("end of the frozen-model test");
}

TEST(Engine, RegisteredSectionsLoadPrintAndAreChecked) {
  register_once();
  TempDir dir;
  const auto cfg = tiny(dir, "hooked_sft", {"hooked.bonus=7"});
  EXPECT_EQ(cfg.extensions.get<HookedConfig>("hooked").bonus, 7);
  const auto copy = cfg;  // a deep copy
  EXPECT_NE(&copy.extensions.get<HookedConfig>("hooked"), &cfg.extensions.get<HookedConfig>("hooked"));
  EXPECT_EQ(copy.extensions.get<HookedConfig>("hooked").bonus, 7);
  EXPECT_NE(config::to_yaml(cfg).find("hooked:\n  bonus: 7\n"), std::string::npos) << config::to_yaml(cfg);
  EXPECT_NE(config::reference_markdown().find("| `hooked.bonus` | an integer | `1` | a positive number | A positive "
                                              "number. |"),
            std::string::npos);
  try {
    tiny(dir, "hooked_sft", {"hooked.bonus=0", "hooked.bonsu=2"});
    ADD_FAILURE() << "expected an error";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("hooked.bonus: expected a positive number, got \"0\""), std::string::npos) << what;
    EXPECT_NE(what.find("hooked.bonsu: unknown key; did you mean hooked.bonus?"), std::string::npos) << what;
  }
  EXPECT_THROW(config::register_section<HookedConfig>("hooked", ""), ConfigError);
  EXPECT_THROW(config::register_section<HookedConfig>("model", ""), ConfigError);
  EXPECT_THROW(cfg.extensions.get<int>("hooked"), std::out_of_range);
}

}  // namespace
}  // namespace anvil::train
