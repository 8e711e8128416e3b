// The open engine (docs/library.md): an objective registered by name runs
// through run_training; the loop calls its hooks in order (prepare, before
// each iteration, micro-batches, after each step, eval, save), restores its
// state on resume, and never touches the parameters it freezes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "anvil/io/safetensors.h"
#include "anvil/train/sft.h"
#include "anvil/train/trainer.h"
#include "test_util.h"

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
  RecordingObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, bool freeze)
      : inner_(sft_config(cfg), tok), freeze_(freeze) {}

  std::string name() const override { return freeze_ ? "frozen_sft" : "hooked_sft"; }
  void prepare(models::CausalLM& model, const RunContext& ctx) override {
    events().push_back("prepare");
    inner_.prepare(model, ctx);
    for (const auto& p : model.named_parameters()) initial_[p.key()] = p.value().detach().clone();
  }
  at::Tensor loss_sum(models::CausalLM& model, const Batch& batch, Sums& sums) override {
    events().push_back("micro-batch");
    return inner_.loss_sum(model, batch, sums);
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
  static config::RunConfig sft_config(config::RunConfig cfg) {
    cfg.algorithm = "sft";
    return cfg;
  }
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
    config::register_section<HookedConfig>("hooked", "A test section.");
    register_objective("hooked_sft", [](const config::RunConfig& cfg, const tokenizer::Tokenizer& tok) {
      return std::make_unique<RecordingObjective>(cfg, tok, false);
    });
    register_objective("frozen_sft", [](const config::RunConfig& cfg, const tokenizer::Tokenizer& tok) {
      return std::make_unique<RecordingObjective>(cfg, tok, true);
    });
  });
}

config::RunConfig tiny(const TempDir& dir, const std::string& algorithm, std::vector<std::string> overrides) {
  anvil::testing::write_text(dir / "run.yaml", anvil::testing::tiny_sft_run(6, 2));
  overrides.push_back("algorithm=" + algorithm);
  overrides.push_back("output_dir=" + (dir / "out").string());
  overrides.push_back("train.eval_every=4");
  overrides.push_back("logging.level=warn");
  overrides.push_back("tokenizer.path=" + anvil::testing::source_dir() + "/data/tokenizer.model");
  overrides.push_back("data.train[0].path=" + anvil::testing::source_dir() + "/data/sft_train.jsonl");
  return config::load_config({(dir / "run.yaml").string()}, overrides);
}

TEST(Engine, RegisteredObjectiveRunsWithItsHooksInOrderAndItsStateResumes) {
  TempDir dir;
  EXPECT_THROW(tiny(dir, "hooked_sft", {}), ConfigError);  // not registered yet
  register_once();
  events().clear();
  auto result = run_training(tiny(dir, "hooked_sft", {"train.max_steps=4"}));
  EXPECT_EQ(result.step, 4);
  const std::vector<std::string> first = {
      "prepare",
      "before_iteration 0 at step 0", "micro-batch", "after_step 1", "micro-batch", "after_step 2", "state 2",
      "before_iteration 1 at step 2", "micro-batch", "after_step 3", "micro-batch", "after_step 4", "evaluate",
      "state 4"};
  EXPECT_EQ(events(), first);

  // Resume from checkpoint-2 with a longer run: state and iteration count come back.
  stdfs::remove_all(dir / "out" / "checkpoint-4");
  events().clear();
  result = run_training(tiny(dir, "hooked_sft", {"train.max_steps=6"}));
  EXPECT_EQ(result.step, 6);
  const std::vector<std::string> resumed = {
      "prepare", "restore {\"counter\":2}",
      "before_iteration 1 at step 2", "micro-batch", "after_step 3", "micro-batch", "after_step 4", "evaluate",
      "state 4",
      "before_iteration 2 at step 4", "micro-batch", "after_step 5", "micro-batch", "after_step 6", "evaluate",
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
  const auto state = nlohmann::json::parse(anvil::testing::read_text(dir / "out" / "checkpoint-6" / "trainer_state.json"));
  EXPECT_EQ(state["objective"]["counter"], 6);
  EXPECT_EQ(state["iteration"], 3);

  EXPECT_THROW(register_objective("hooked_sft", [](const config::RunConfig&, const tokenizer::Tokenizer&) {
                 return std::unique_ptr<Objective>();
               }),
               ConfigError);
  EXPECT_THROW(register_objective("Bad Name", [](const config::RunConfig&, const tokenizer::Tokenizer&) {
                 return std::unique_ptr<Objective>();
               }),
               ConfigError);
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

  // The sharded engine refuses frozen parameters rather than decaying them.
  TempDir dir2;
  try {
    run_training(tiny(dir2, "frozen_sft", {"dist.sharding=full_shard", "train.max_steps=2"}));
    ADD_FAILURE() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("freezes parameter \"transformer.h.0.attn.c_attn.weight\", which the "
                                         "sharded engine does not support yet"),
              std::string::npos)
        << e.what();
  }
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
