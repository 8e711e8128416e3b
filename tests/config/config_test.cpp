#include "anvil/config/config.h"

#include <gtest/gtest.h>

#include "anvil/core/error.h"
#include "anvil/models/registry.h"
#include "anvil/train/preference.h"
#include "test_util.h"

namespace anvil::config {
namespace {

using anvil::testing::TempDir;
using anvil::testing::write_text;

std::string base_yaml() {
  const auto src = anvil::testing::source_dir();
  return "output_dir: /tmp/x\ntokenizer:\n  path: " + src +
         "/data/tokenizer.model\ndata:\n  train:\n    - path: " + src +
         "/data/sft_train.jsonl\ntrain:\n  max_steps: 10\n";
}

std::string error_of(const std::vector<std::string>& files, const std::vector<std::string>& overrides) {
  try {
    load_config(files, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = (dir_ / "base.yaml").string();
    write_text(base_, base_yaml());
  }
  std::string write(const std::string& name, const std::string& text) {
    auto p = (dir_ / name).string();
    write_text(p, text);
    return p;
  }
  TempDir dir_;
  std::string base_;
};

TEST_F(ConfigTest, LoadsTypedValuesWithDefaults) {
  auto c = load_config({base_}, {});
  EXPECT_EQ(c.output_dir, "/tmp/x");
  EXPECT_EQ(c.train.max_steps, 10);
  EXPECT_EQ(c.train.micro_batch_size, 8);  // default
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.9, 0.999}));
}

TEST_F(ConfigTest, LaterFilesAndOverridesWin) {
  auto second = write("b.yaml", "train:\n  max_steps: 20\n  seed: 7\n");
  auto c = load_config({base_, second}, {"train.seed=9", "optimizer.betas=[0.8, 0.95]"});
  EXPECT_EQ(c.train.max_steps, 20);
  EXPECT_EQ(c.train.seed, 9);
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.8, 0.95}));
}

TEST_F(ConfigTest, WrongTypeNamesFileLineKeyAndExpectation) {
  auto bad = write("bad.yaml", "optimizer:\n  lr: fast\n");
  EXPECT_EQ(error_of({base_, bad}, {}), bad + ":2: optimizer.lr: expected a number, got \"fast\"");
}

TEST_F(ConfigTest, OutOfRangeValue) {
  auto bad = write("bad.yaml", "train:\n  micro_batch_size: 0\n");
  EXPECT_EQ(error_of({base_, bad}, {}),
            bad + ":2: train.micro_batch_size: expected a positive number, or auto, got \"0\"");
  EXPECT_EQ(error_of({base_}, {"optimizer.lr=-1"}),
            "command line (optimizer.lr=-1): optimizer.lr: expected a positive number, got \"-1\"");
}

TEST_F(ConfigTest, UnknownKeySuggestsTheClosestKnownOne) {
  auto bad = write("bad.yaml", "# comment\ntrain:\n  max_step: 5\n");
  EXPECT_EQ(error_of({base_, bad}, {}), bad + ":3: train.max_step: unknown key; did you mean train.max_steps?");
  EXPECT_EQ(error_of({base_}, {"bogus.key=1"}), "command line (bogus.key=1): bogus.key: unknown key");
}

// A tab in the indentation: yaml-cpp says "illegal map value" or the like; the
// error also names the line with the tab.
TEST_F(ConfigTest, ATabInTheIndentationIsNamed) {
  const auto bad = write("tab.yaml", "train:\n  max_steps: 5\n\tmicro_batch_size: 4\n");
  const auto e = error_of({base_, bad}, {});
  EXPECT_EQ(e.rfind(bad + ":", 0), 0u) << e;
  EXPECT_NE(e.find("invalid YAML"), std::string::npos) << e;
  EXPECT_NE(e.find("(line 3 indents with a tab; YAML indents with spaces only)"), std::string::npos) << e;
}

// TRL / transformers argument names, in their section or another, point at our key.
TEST_F(ConfigTest, TrlAndTransformersNamesSuggestOurKey) {
  const auto bad = write("trl.yaml",
                         "optimizer:\n  learning_rate: 1.0e-4\ntrain:\n  batch_size: 8\n"
                         "  gradient_accumulation_steps: 2\n");
  EXPECT_EQ(error_of({base_, bad}, {}),
            "3 errors in the config:\n"
            "  " +
                bad +
                ":2: optimizer.learning_rate: unknown key; did you mean optimizer.lr? (learning_rate is the "
                "TRL / transformers name)\n"
                "  " +
                bad +
                ":4: train.batch_size: unknown key; did you mean train.micro_batch_size? (batch_size is the "
                "TRL / transformers name)\n"
                "  " +
                bad +
                ":5: train.gradient_accumulation_steps: unknown key; did you mean train.grad_accum_steps? "
                "(gradient_accumulation_steps is the TRL / transformers name)");
  EXPECT_EQ(error_of({base_}, {"lora.lora_alpha=32"}),
            "command line (lora.lora_alpha=32): lora.lora_alpha: unknown key; did you mean lora.alpha? (lora_alpha is "
            "the TRL / transformers name)");
  EXPECT_EQ(error_of({base_}, {"train.max_grad_norm=1"}),
            "command line (train.max_grad_norm=1): train.max_grad_norm: unknown key; did you mean train.grad_clip? "
            "(max_grad_norm is the TRL / transformers name)");
}

// Suggestions stay in the key's section, and an algorithm's own TRL names
// are read there: GRPOConfig's beta, loss_type and epsilon_high under ppo;
// transformers' bf16 anywhere.
TEST_F(ConfigTest, SuggestionsStayInTheKeysSectionAndReadItsTrlNames) {
  const auto ppo = [&](const std::string& kv) { return error_of({base_}, {"algorithm=ppo", kv}); };
  const auto trl = [](const std::string& kv, const std::string& ours) {
    const auto key = kv.substr(0, kv.find('='));
    return "command line (" + kv + "): " + key + ": unknown key; did you mean " + ours + "? (" +
           key.substr(key.rfind('.') + 1) + " is the TRL / transformers name)";
  };
  EXPECT_EQ(ppo("ppo.beta=0.04"), trl("ppo.beta=0.04", "ppo.kl_coef"));
  EXPECT_EQ(ppo("ppo.loss_type=dr_grpo"), trl("ppo.loss_type=dr_grpo", "ppo.loss_aggregation"));
  EXPECT_EQ(ppo("ppo.epsilon_high=0.28"), trl("ppo.epsilon_high=0.28", "ppo.cliprange_high"));
  EXPECT_EQ(error_of({base_}, {"train.bf16=true"}), trl("train.bf16=true", "dist.param_dtype=bfloat16"));
  EXPECT_EQ(error_of({base_}, {"optimizer.epsilon=1e-6"}), trl("optimizer.epsilon=1e-6", "optimizer.eps"));
  // Outside every algorithm's section, an algorithm's TRL name still points at its key.
  EXPECT_EQ(error_of({base_}, {"train.num_generations=8"}), trl("train.num_generations=8", "ppo.samples_per_prompt"));
  // Another algorithm's key one letter away is not offered, nor ppo's name for another algorithm's key.
  const auto kto = error_of({base_}, {"algorithm=kto", "kto.label_smoothing=0.1"});
  EXPECT_NE(kto.find("kto.label_smoothing: unknown key"), std::string::npos) << kto;
  EXPECT_EQ(kto.find("dpo.label_smoothing"), std::string::npos) << kto;
  const auto kto_trl = error_of({base_}, {"algorithm=kto", "kto.epsilon_high=0.28"});
  EXPECT_NE(kto_trl.find("kto.epsilon_high: unknown key"), std::string::npos) << kto_trl;
  EXPECT_EQ(kto_trl.find("ppo.cliprange_high"), std::string::npos) << kto_trl;
  // Typos still find their key, within the section or, misspelt, the section's.
  EXPECT_EQ(ppo("ppo.kl_cof=0.1"), "command line (ppo.kl_cof=0.1): ppo.kl_cof: unknown key; did you mean ppo.kl_coef?");
  EXPECT_EQ(error_of({base_}, {"trian.max_steps=5"}),
            "command line (trian.max_steps=5): trian.max_steps: unknown key; did you mean train.max_steps?");
}

TEST_F(ConfigTest, ChoiceAndListValues) {
  EXPECT_EQ(error_of({base_}, {"schedule.decay=exp"}),
            "command line (schedule.decay=exp): schedule.decay: expected one of cosine, linear, constant, got \"exp\"");
  EXPECT_EQ(error_of({base_}, {"optimizer.betas=0.9"}),
            "command line (optimizer.betas=0.9): optimizer.betas: expected a list of numbers, got \"0.9\"");
  EXPECT_EQ(error_of({base_}, {"optimizer.betas=[0.9, 1.5]"}),
            "command line (optimizer.betas=[0.9, 1.5]): optimizer.betas: expected a number in [0, 1), got a list");
}

TEST_F(ConfigTest, MissingRequiredKey) {
  auto f = write("noout.yaml", "output_dir: null\n");
  EXPECT_EQ(
      error_of({base_, f}, {}),
      base_ + " + " + f +
          ": output_dir: required key is missing; expected a string (set it in a config file or as output_dir=...)");
  // A required number has no default to fall back on (found by fuzzing: a
  // config without train.max_steps loaded as max_steps 0); every key missing is named at once.
  auto nosteps = write("nosteps.yaml", "output_dir: x\n");
  EXPECT_EQ(error_of({nosteps}, {}),
            "3 errors in the config:\n  " + nosteps +
                ": train.max_steps: required key is missing; expected a positive integer (set it in a config file or "
                "as train.max_steps=...), or train.num_train_epochs\n  " +
                nosteps +
                ": tokenizer.path: required key is missing; expected a tokenizer file (or set model.from)\n  " +
                nosteps + ": data.train: required key is missing; expected a list of datasets (- path: train.jsonl)");
}

TEST_F(ConfigTest, KeysMustBePlainNames) {
  // YAML allows a list or a map as a key; a config does not (found by fuzzing).
  auto bad = write("complex.yaml", "train:\n  ? [max_steps, seed]\n  : 3\n");
  EXPECT_EQ(error_of({base_, bad}, {}), bad + ":2: train: expected a plain key name, got a list");
}

TEST_F(ConfigTest, CrossFieldChecksNameTheKey) {
  auto bad = write("bad.yaml", "model:\n  hidden_size: 100\n  num_attention_heads: 3\n");
  EXPECT_EQ(error_of({base_, bad}, {}),
            bad + ":3: model.num_attention_heads: expected a divisor of model.hidden_size (100), got 3");
  EXPECT_EQ(error_of({base_}, {"train.device=tpu"}),
            "command line (train.device=tpu): train.device: expected cpu, cuda or cuda:N, got \"tpu\"");
}

TEST_F(ConfigTest, ShapeKeysConflictWithModelFrom) {
  const auto from = dir_.path().string();
  auto f = write("from.yaml", "model:\n  from: " + from + "\n  hidden_size: 64\n");
  EXPECT_EQ(error_of({base_, f}, {}),
            f +
                ":3: model.hidden_size: cannot be set together with model.from (the model's shape and dropout come "
                "from " +
                from + "/config.json)");
}

TEST_F(ConfigTest, ModelFromLaterInTheChainReplacesEarlierShapeKeys) {
  // A base config with a shape, then a checkpoint to start from: the
  // checkpoint's config.json decides the shape.
  auto shaped = write("shaped.yaml", "model:\n  hidden_size: 64\n  num_attention_heads: 4\n  dropout: 0.1\n");
  const auto from = dir_.path().string();
  auto c = load_config({base_, shaped}, {"model.from=" + from});
  EXPECT_EQ(c.model.from, from);
  EXPECT_EQ(c.model.hidden_size, RunConfig{}.model.hidden_size);
  EXPECT_EQ(c.model.dropout, RunConfig{}.model.dropout);
  // Set after model.from, a shape key still conflicts.
  EXPECT_NE(
      error_of({base_}, {"model.from=" + from, "model.dropout=0.2"}).find("cannot be set together with model.from"),
      std::string::npos);
}

TEST_F(ConfigTest, RenamedKeysAreReadByTheirOldNamesWithAWarning) {
  // Model keys took Hugging Face's names (model.num_layers is model.num_hidden_layers); a config written
  // before says the old ones, read as the new ones until kOldNamesUntil.
  auto old = write("old.yaml",
                   "model:\n  family: neox\n  num_layers: 3\n  num_heads: 2\n  rotary_pct: 0.5\n"
                   "  parallel_residual: false\n  tie_embeddings: \"true\"\n  activation: relu\n");
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  auto c = load_config({base_, old}, {});
  const auto log = ::testing::internal::GetCapturedStdout() + ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(c.model.num_hidden_layers, 3);
  EXPECT_EQ(c.model.num_attention_heads, 2);
  EXPECT_EQ(c.model.keys.get<models::RotaryKeys>().partial_rotary_factor, 0.5);
  // NeoX's own key, read by the model it builds.
  auto neox = c.model;
  neox.vocab_size = 64;  // the tokenizer's, in a run
  EXPECT_FALSE(models::family_by_name("neox").from_config(neox)->hf_config().at("use_parallel_residual"));
  EXPECT_EQ(c.model.tie_word_embeddings, Tied::kTrue);
  EXPECT_EQ(c.model.hidden_act, "relu");
  EXPECT_NE(log.find(old +
                     ":3: model.num_layers is now model.num_hidden_layers (Hugging Face's name); the old "
                     "name is read until " +
                     std::string(kOldNamesUntil)),
            std::string::npos)
      << log;
  // A family's own keys too (OPT's, by OPTConfig's names).
  c = load_config({base_}, {"model.family=opt", "model.pre_layer_norm=false", "model.embed_proj_dim=16"});
  const auto printed = to_yaml(c);
  EXPECT_NE(printed.find("do_layer_norm_before: false"), std::string::npos) << printed;
  EXPECT_NE(printed.find("word_embed_proj_dim: 16"), std::string::npos) << printed;
  EXPECT_EQ(printed.find("pre_layer_norm"), std::string::npos) << printed;
  // Both names: in two sources the later wins, as for any key; in one source it is an error.
  auto both = write("both.yaml", "model:\n  num_layers: 3\n  num_hidden_layers: 5\n");
  EXPECT_EQ(error_of({base_, both}, {}),
            both + ":2: model.num_layers: is the old name of model.num_hidden_layers, which " + both +
                ":3 sets too; keep model.num_hidden_layers only");
  EXPECT_EQ(load_config({base_, old}, {"model.num_hidden_layers=7"}).model.num_hidden_layers, 7);
  auto renamed = write("new.yaml", "model:\n  num_hidden_layers: 5\n");
  EXPECT_EQ(load_config({base_, renamed}, {"model.num_layers=7"}).model.num_hidden_layers, 7);
  EXPECT_EQ(load_config({base_, old, renamed}, {}).model.num_hidden_layers, 5);
  // An old name's value is checked under the new name, at the old name's line.
  auto bad = write("bad.yaml", "model:\n  num_layers: 0\n");
  EXPECT_EQ(error_of({base_, bad}, {}), bad + ":2: model.num_hidden_layers: expected a positive number, got \"0\"");
  // A checkpoint saved before the rename resumes: the same value under the old name is no change.
  auto saved = to_yaml(c = load_config({base_, old}, {}));
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"num_hidden_layers:", "num_layers:"}, {"partial_rotary_factor:", "rotary_pct:"}})
    saved.replace(saved.find(from), from.size(), to);
  EXPECT_TRUE(config_changes(saved, to_yaml(c)).empty());
  c.model.num_hidden_layers = 4;
  const auto changes = config_changes(saved, to_yaml(c));
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].key, "model.num_hidden_layers");
  // The reference names the old names.
  EXPECT_NE(reference_markdown().find("old name num_layers read until " + std::string(kOldNamesUntil)),
            std::string::npos);
}

TEST_F(ConfigTest, ConfigJsonNamesOfOtherFamiliesSuggestOurKey) {
  EXPECT_EQ(error_of({base_}, {"model.n_layer=2"}),
            "command line (model.n_layer=2): model.n_layer: unknown key; did you mean model.num_hidden_layers? "
            "(n_layer is GPT-2's config.json name)");
  EXPECT_EQ(error_of({base_}, {"model.rms_norm_eps=1e-6"}),
            "command line (model.rms_norm_eps=1e-6): model.rms_norm_eps: unknown key; did you mean "
            "model.layer_norm_eps? (rms_norm_eps is LLaMA's config.json name)");
  EXPECT_EQ(error_of({base_}, {"model.num_local_experts=4"}),
            "command line (model.num_local_experts=4): model.num_local_experts: unknown key; did you mean "
            "model.num_experts? (num_local_experts is Mixtral's config.json name)");
  // The names the model section is written under for the families' readers (config/hf_names.h).
  EXPECT_EQ(error_of({base_}, {"model.resid_pdrop=0.1"}),
            "command line (model.resid_pdrop=0.1): model.resid_pdrop: unknown key; did you mean model.dropout? "
            "(resid_pdrop is GPT-2's and Phi-3's config.json name)");
}

TEST_F(ConfigTest, NullRemovesAKeyAnEarlierSourceSet) {
  auto shaped = write("shaped.yaml", "model:\n  hidden_size: 64\n  num_attention_heads: 4\n");
  auto c = load_config({base_, shaped}, {"model.hidden_size=null"});
  EXPECT_EQ(c.model.hidden_size, RunConfig{}.model.hidden_size);
  EXPECT_EQ(c.model.num_attention_heads, 4);
  // Inside a map override too.
  c = load_config({base_, shaped}, {"model={num_attention_heads: null}"});
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.num_attention_heads, RunConfig{}.model.num_attention_heads);
  auto unset = write("unset.yaml", "model:\n  num_attention_heads: ~\n");
  c = load_config({base_, shaped, unset}, {});
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.num_attention_heads, RunConfig{}.model.num_attention_heads);
}

TEST_F(ConfigTest, ListItemsAreOverriddenInPlaceWithTheNamesErrorsUse) {
  const auto src = anvil::testing::source_dir();
  auto two = write("two.yaml", "data:\n  train:\n    - path: " + src + "/data/sft_train.jsonl\n      weight: 1\n" +
                                   "    - path: " + src + "/data/sft_add_train.jsonl\n      weight: 0.5\n");
  auto c = load_config({base_, two}, {"data.train[1].weight=2", "data.train[0].path=" + src + "/data/sft_eval.jsonl"});
  ASSERT_EQ(c.data.train.size(), 2u);
  EXPECT_EQ(c.data.train[0].path, src + "/data/sft_eval.jsonl");
  EXPECT_EQ(c.data.train[0].weight, 1.0);
  EXPECT_EQ(c.data.train[1].weight, 2.0);
  EXPECT_EQ(error_of({base_, two}, {"data.train[2].weight=1"}),
            "command line (data.train[2].weight=1): data.train[2]: data.train has 2 items (indices from 0)");
  EXPECT_EQ(error_of({base_, two}, {"data.eval[0].path=x"}),
            "command line (data.eval[0].path=x): data.eval: no list to index (set data.eval in a config file first)");
  EXPECT_EQ(error_of({base_, two}, {"data.train[1].wieght=1"}),
            "command line (data.train[1].wieght=1): data.train[1].wieght: unknown key; did you mean "
            "data.train[1].weight?");
}

TEST_F(ConfigTest, TokenizerPathTakesAFolder) {
  auto c = load_config({base_}, {"tokenizer.path=" + anvil::testing::source_dir() + "/data"});
  EXPECT_EQ(c.tokenizer.path, anvil::testing::source_dir() + "/data");
}

TEST_F(ConfigTest, EveryErrorOfALoadIsReportedTogether) {
  auto bad = write("bad.yaml", "train:\n  max_step: 3\n  micro_batch: 2\noptimizer:\n  lr: -1\n");
  EXPECT_EQ(error_of({base_, bad}, {"schedule.decay=exp"}),
            "4 errors in the config:\n"
            "  " +
                bad +
                ":2: train.max_step: unknown key; did you mean train.max_steps?\n"
                "  " +
                bad +
                ":3: train.micro_batch: unknown key; did you mean train.micro_batch_size?\n"
                "  " +
                bad +
                ":5: optimizer.lr: expected a positive number, got \"-1\"\n"
                "  command line (schedule.decay=exp): schedule.decay: expected one of cosine, linear, constant, got "
                "\"exp\"");
}

// Issue 59, defect 8: a value that does not parse, an unknown key, another
// algorithm's section and a cross-field error, all in one load's error.
TEST_F(ConfigTest, ParseErrorsUnknownKeysForeignSectionsAndCrossFieldChecksComeTogether) {
  auto bad =
      write("bad.yaml", "optimizer:\n  lr: fast\ntrain:\n  max_step: 3\n  global_batch_size: 12\nkto:\n  beta: 0.2\n");
  EXPECT_EQ(error_of({base_, bad}, {}),
            "4 errors in the config:\n"
            "  " +
                bad +
                ":2: optimizer.lr: expected a number, got \"fast\"\n"
                "  " +
                bad +
                ":4: train.max_step: unknown key; did you mean train.max_steps?\n"
                "  " +
                bad +
                ":5: train.global_batch_size: expected a multiple of train.micro_batch_size (8), got 12\n"
                "  " +
                bad +
                ":7: kto.beta: the kto section is read by algorithm: kto; this run's algorithm is sft (remove the "
                "section, or set algorithm: kto)");
}

// A check that reads a value that did not parse would see its default: what
// it says follows from the parse error, which is reported alone.
TEST_F(ConfigTest, ChecksOfAValueThatDidNotParseAreLeftOut) {
  auto bad = write("bad.yaml", "train:\n  micro_batch_size: eight\n  global_batch_size: 12\n");
  EXPECT_EQ(error_of({base_, bad}, {}), bad + ":2: train.micro_batch_size: expected an integer, got \"eight\"");
  // Nor does a list that is not one report its items missing, nor an unknown algorithm the sections of a known one.
  EXPECT_EQ(error_of({base_}, {"data.train=3"}),
            "command line (data.train=3): data.train: expected a list of maps (- key: value), got \"3\"");
  EXPECT_EQ(error_of({base_}, {"algorithm=kot", "kto.beta=0.2"})
                .rfind("command line (algorithm=kot): algorithm: "
                       "expected one of ",
                       0),
            0u)
      << error_of({base_}, {"algorithm=kot", "kto.beta=0.2"});
  EXPECT_EQ(error_of({base_}, {"algorithm=kot", "kto.beta=0.2"}).find("kto.beta"), std::string::npos);
}

// Issue 59, item 9: errors are listed by source (the files as given, then the
// overrides in order) and line, and those of no line (a required key no
// source sets) last.
TEST_F(ConfigTest, ErrorsAreListedInTheOrderOfTheirSourcesAndLines) {
  auto first = write("first.yaml", "train:\n  seed: -1\n  log_every: 0\n  save_evrey: 3\n");
  auto second = write("second.yaml", "optimizer:\n  eps: 0\nschedule:\n  decay: exp\n");
  auto noout = write("noout.yaml", "output_dir: null\n");
  const auto e = error_of({base_, second, first, noout}, {"train.threads=-2", "eval.batch_size=0"});
  const std::vector<std::string> order = {
      "second.yaml:2: optimizer.eps",         "second.yaml:4: schedule.decay",  "first.yaml:2: train.seed",
      "first.yaml:3: train.log_every",        "first.yaml:4: train.save_evrey", "(train.threads=-2): train.threads",
      "(eval.batch_size=0): eval.batch_size", ": output_dir: required key"};
  size_t at = 0;
  for (const auto& part : order) {
    const auto found = e.find(part, at);
    ASSERT_NE(found, std::string::npos) << part << " after position " << at << " in\n" << e;
    at = found;
  }
  EXPECT_EQ(e.rfind("8 errors in the config:", 0), 0u) << e;
}

// schedule.warmup_ratio is transformers' (and EasyLM's) warmup as a fraction
// of the run; with warmup_steps too, which one counts would be a guess.
TEST_F(ConfigTest, WarmupStepsAndWarmupRatioTogetherAreRefused) {
  EXPECT_EQ(load_config({base_}, {"schedule.warmup_ratio=0.1"}).schedule.warmup_ratio, 0.1);
  EXPECT_EQ(error_of({base_}, {"schedule.warmup_steps=10", "schedule.warmup_ratio=0.1"}),
            "command line (schedule.warmup_ratio=0.1): schedule.warmup_ratio: cannot be set together with "
            "schedule.warmup_steps (10): set one of the two");
  EXPECT_EQ(error_of({base_}, {"schedule.warmup_ratio=1.5"}),
            "command line (schedule.warmup_ratio=1.5): schedule.warmup_ratio: expected a number in [0, 1], got "
            "\"1.5\"");
  EXPECT_EQ(error_of({base_}, {"schedule.num_train_epochs=2"}),
            "command line (schedule.num_train_epochs=2): schedule.num_train_epochs: unknown key; did you mean "
            "train.num_train_epochs? (num_train_epochs is the TRL / transformers name)");
}

// optimizer.state_dtype lives in the fused AdamW; dist.cpu_offload moves full_shard's shards; dist.replicate
// replicates shards.
TEST_F(ConfigTest, OptimizerStateDtypeCpuOffloadAndReplicateNameWhatTheyNeed) {
  EXPECT_EQ(load_config({base_}, {"optimizer.state_dtype=bfloat16"}).optimizer.state_dtype, Dtype::kBFloat16);
  EXPECT_TRUE(load_config({base_}, {"dist.sharding=full_shard", "dist.cpu_offload=true"}).dist.cpu_offload);
  EXPECT_EQ(error_of({base_}, {"optimizer.state_dtype=bfloat16", "optimizer.fused=false"}),
            "command line (optimizer.state_dtype=bfloat16): optimizer.state_dtype: is bfloat16, which the fused "
            "AdamW keeps; set optimizer.fused: true (it is false)");
  EXPECT_EQ(error_of({base_}, {"dist.cpu_offload=true"}),
            "command line (dist.cpu_offload=true): dist.cpu_offload: offloads the shards of full_shard; set "
            "dist.sharding: full_shard (it is no_shard)");
  EXPECT_NE(error_of({base_}, {"optimizer.state_dtype=float16"}).find("expected one of"), std::string::npos);
  EXPECT_EQ(load_config({base_}, {"dist.sharding=full_shard", "dist.replicate=2"}).dist.replicate, 2);
  EXPECT_EQ(error_of({base_}, {"dist.replicate=2"}),
            "command line (dist.replicate=2): dist.replicate: replicates shards across groups of ranks; set "
            "dist.sharding: full_shard or shard_grad_op (it is no_shard, which replicates everything already)");
}

// train.num_train_epochs counts the run instead of train.max_steps for the
// algorithms whose steps read data.train; ppo's steps train on rollouts.
TEST_F(ConfigTest, EpochsCountTheRunOfDataDrivenAlgorithms) {
  auto epochs = write("epochs.yaml", "train:\n  max_steps: null\n  num_train_epochs: 1.5\n");
  for (const char* algorithm : {"sft", "dpo", "kto", "reward"}) {
    const auto c = load_config({base_, epochs}, {std::string("algorithm=") + algorithm});
    EXPECT_EQ(c.train.max_steps, 0) << algorithm;
    EXPECT_EQ(c.train.num_train_epochs, 1.5) << algorithm;
  }
  EXPECT_NE(error_of({base_, epochs}, {"algorithm=ppo", "ppo.reward.exact_match=response"})
                .find(epochs + ":3: train.num_train_epochs: not read by algorithm ppo (read by sft, pretrain"),
            std::string::npos)
      << error_of({base_, epochs}, {"algorithm=ppo", "ppo.reward.exact_match=response"});
  auto nosteps = write("nosteps.yaml", "train:\n  max_steps: null\n");
  EXPECT_EQ(error_of({base_, nosteps}, {}),
            base_ + " + " + nosteps +
                ": train.max_steps: required key is missing; expected a positive integer (set it in a config file or "
                "as train.max_steps=...), or train.num_train_epochs");
  EXPECT_EQ(error_of({base_}, {"train.max_steps=0"}),
            "command line (train.max_steps=0): train.max_steps: expected a positive integer, or "
            "train.num_train_epochs, got 0");
}

TEST_F(ConfigTest, MissingDataOrTokenizerFilesFailBeforeAnyWork) {
  auto f = write("paths.yaml", "data:\n  eval:\n    - path: nowhere/eval.jsonl\n");
  EXPECT_EQ(error_of({base_, f}, {}),
            f + ":3: data.eval[0].path: expected an existing file or folder, got \"nowhere/eval.jsonl\" (paths are "
                "relative to the working directory)");
  EXPECT_EQ(error_of({base_}, {"model.from=no/such/dir"}),
            "command line (model.from=no/such/dir): model.from: expected an existing model folder, got \"no/such/dir\" "
            "(paths are relative to the working directory)");
}

// The model folders an algorithm's section names are checked with the rest of
// the config, kto's and distill's as dpo's: a missing one (or a number given
// as one), or a folder that holds no model (no config.json, no
// adapter_config.json), fails the load, and so --dry-run, naming the key and
// the folder.
TEST_F(ConfigTest, ReferenceAndTeacherFoldersAreCheckedWithTheConfig) {
  const auto model = dir_ / "model", adapter = dir_ / "adapter", empty = dir_ / "empty";
  for (const auto& d : {model, adapter, empty}) std::filesystem::create_directories(d);
  write_text(model / "config.json", "{}");
  write_text(adapter / "adapter_config.json", "{}");
  for (const std::string key : {"dpo.reference", "kto.reference", "distill.teacher", "ppo.reference",
                                "ppo.reward.model", "ppo.critic_from", "ilql.reward.model"}) {
    const auto algorithm = "algorithm=" + key.substr(0, key.find('.'));
    // ppo's exact_match reward is the base config's: one source at a time.
    const std::vector<std::string> others =
        key == "ppo.reward.model" ? std::vector<std::string>{"ppo.reward.exact_match="} : std::vector<std::string>{};
    auto with = [&](const std::string& value) {
      auto o = others;
      o.insert(o.begin(), {algorithm, key + "=" + value});
      return error_of({base_}, o);
    };
    EXPECT_EQ(with("no_such_model"),
              "command line (" + key + "=no_such_model): " + key +
                  ": expected an existing folder, got \"no_such_model\" (paths are relative to the working directory)");
    EXPECT_EQ(with(empty.string()), "command line (" + key + "=" + empty.string() + "): " + key +
                                        ": expected a model folder, got \"" + empty.string() +
                                        "\", which holds neither config.json (a Hugging Face model folder, an Anvil "
                                        "checkpoint or export) nor adapter_config.json (a LoRA adapter folder)");
    EXPECT_EQ(with(model.string()), "<no error>") << key;
    EXPECT_EQ(with(adapter.string()), "<no error>") << key;
  }
  const auto teacher = write("teacher.yaml", "algorithm: distill\ndistill:\n  teacher: 3\n");
  EXPECT_EQ(error_of({base_, teacher}, {}),
            teacher +
                ":3: distill.teacher: expected an existing folder, got \"3\" (paths are relative to the working "
                "directory)");
}

// Keys of multi-turn rollouts do nothing without an environment program:
// set to anything but their defaults (which a printed config holds), they
// are refused, naming the key.
TEST_F(ConfigTest, MultiTurnKeysWithoutAnEnvironmentAreRefused) {
  EXPECT_EQ(error_of({base_}, {"algorithm=ppo", "ppo.max_turns=3"}),
            "command line (ppo.max_turns=3): ppo.max_turns: applies to multi-turn rollouts, which need "
            "ppo.environment.command; without it every rollout is one turn (set the command, or remove the key)");
  EXPECT_EQ(error_of({base_}, {"algorithm=ppo", "ppo.environment.timeout_s=5"}),
            "command line (ppo.environment.timeout_s=5): ppo.environment.timeout_s: applies to the environment "
            "program, and ppo.environment.command names none (set the command, or remove the key)");
  EXPECT_EQ(error_of({base_}, {"algorithm=ppo", "ppo.max_turns=4", "ppo.environment.timeout_s=30"}), "<no error>");
  EXPECT_EQ(error_of({base_}, {"algorithm=ppo", "ppo.max_turns=3", "ppo.environment.timeout_s=5",
                               "ppo.environment.command=true"}),
            "<no error>");
}

TEST_F(ConfigTest, DatasetListsAreCheckedItemByItem) {
  const auto train = anvil::testing::source_dir() + "/data/sft_train.jsonl";
  auto typo = write("typo.yaml", "data:\n  train:\n    - path: " + train + "\n      fracton: 0.5\n");
  EXPECT_EQ(error_of({base_, typo}, {}),
            typo + ":4: data.train[0].fracton: unknown key; did you mean data.train[0].fraction?");
  auto two = write("two.yaml", "data:\n  train:\n    - path: " + train + "\n      fraction: 0.5\n      size: 10\n");
  EXPECT_EQ(error_of({base_, two}, {}),
            two + ":4: data.train[0].fraction: set at most one of fraction, size and weight for a dataset");
  auto mixed =
      write("mixed.yaml", "data:\n  train:\n    - path: " + train + "\n      weight: 2\n    - path: " + train + "\n");
  EXPECT_EQ(error_of({base_, mixed}, {}),
            mixed + ":4: data.train[0].weight: either every dataset of data.train has a weight or none has; 1 of 2 do");
  auto scalar = write("scalar.yaml", "data:\n  train: " + train + "\n");
  EXPECT_EQ(error_of({base_, scalar}, {}),
            scalar + ":2: data.train: expected a list of maps (- key: value), got \"" + train + "\"");
  auto neg = write("neg.yaml", "data:\n  train:\n    - path: " + train + "\n      size: -3\n");
  EXPECT_EQ(error_of({base_, neg}, {}), neg + ":4: data.train[0].size: expected a number >= 0, got \"-3\"");
  // A whole list from the command line.
  auto cfg = load_config({base_}, {"data.train=[{path: " + train + ", fraction: 0.25}, {path: " + train + "}]"});
  ASSERT_EQ(cfg.data.train.size(), 2u);
  EXPECT_EQ(cfg.data.train[0].fraction, 0.25);
  EXPECT_EQ(cfg.data.train[1].path, train);
  EXPECT_NE(to_yaml(cfg).find("fraction: 0.25"), std::string::npos) << to_yaml(cfg);
}

TEST_F(ConfigTest, InvalidYamlAndMissingFile) {
  auto bad = write("bad.yaml", "train:\n  max_steps: [1,\n");
  EXPECT_NE(error_of({bad}, {}).find(bad + ":3: invalid YAML"), std::string::npos) << error_of({bad}, {});
  EXPECT_EQ(error_of({(dir_ / "nope.yaml").string()}, {}), (dir_ / "nope.yaml").string() + ": cannot read config file");
  EXPECT_EQ(error_of({base_}, {"train.seed"}), "command line: \"train.seed\": expected key.path=value");
}

TEST_F(ConfigTest, AWarmupLongerThanTheRunLoads) {
  // A smoke run of a shipped config: the schedule clamps the warmup (Schedule.AWarmupLongerThanTheRunIsClampedToIt).
  const auto c = load_config({base_}, {"schedule.warmup_steps=50", "train.max_steps=10"});
  EXPECT_EQ(c.schedule.warmup_steps, 50);
}

TEST_F(ConfigTest, SectionGivenAScalar) {
  EXPECT_EQ(error_of({base_}, {"train=3"}), "command line (train=3): train: expected a map of train.* keys, got \"3\"");
}

TEST_F(ConfigTest, PrintedConfigLoadsBackToTheSameConfig) {
  auto c = load_config({base_}, {"optimizer.lr=0.1", "schedule.warmup_steps=3"});
  auto printed = write("printed.yaml", to_yaml(c));
  auto again = load_config({printed}, {});
  EXPECT_EQ(to_yaml(again), to_yaml(c));
  EXPECT_DOUBLE_EQ(again.optimizer.lr, 0.1);
}

TEST_F(ConfigTest, OnlyTheRunsAlgorithmReadsItsSection) {
  // An sft run with DPO's and the reward model's keys: each section named once.
  const auto e = error_of({base_}, {"dpo.beta=0.2", "dpo.loss_type=ipo", "reward.center_rewards_coefficient=0.1"});
  EXPECT_NE(e.find("dpo.beta: the dpo section is read by algorithm: dpo; this run's algorithm is sft (remove the "
                   "section, or set algorithm: dpo)"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("dpo.loss_type"), std::string::npos) << e;
  EXPECT_NE(e.find("reward.center_rewards_coefficient: the reward section is read by algorithm: reward"),
            std::string::npos)
      << e;
  EXPECT_EQ(train::dpo_config(load_config({base_}, {"algorithm=dpo", "dpo.beta=0.2"})).beta, 0.2);
  // The printed config holds the run's own section only, and loads back.
  const auto sft = to_yaml(load_config({base_}, {}));
  EXPECT_NE(sft.find("\nsft:\n"), std::string::npos) << sft;
  EXPECT_EQ(sft.find("\ndpo:"), std::string::npos) << sft;
  EXPECT_EQ(sft.find("\nreward:"), std::string::npos) << sft;
  const auto dpo = to_yaml(load_config({base_}, {"algorithm=dpo"}));
  EXPECT_NE(dpo.find("\ndpo:\n"), std::string::npos) << dpo;
  EXPECT_EQ(dpo.find("\nsft:"), std::string::npos) << dpo;
  // A config.yaml saved when every section was printed resumes without a change.
  const std::string old_style = sft + "reward:\n  center_rewards_coefficient: 0\ndpo:\n  beta: 0.1\n";
  EXPECT_TRUE(config_changes(old_style, sft).empty());
  EXPECT_EQ(section_algorithm("dpo"), "dpo");
  EXPECT_EQ(section_algorithm("train"), "");
}

TEST_F(ConfigTest, ReferenceListsEveryContractKey) {
  const auto ref = reference_markdown();
  for (const char* key :
       {"`output_dir`", "`train.max_steps`", "`train.save_every`", "`train.eval_every`", "`train.seed`"})
    EXPECT_NE(ref.find(key), std::string::npos) << key;
}

}  // namespace
}  // namespace anvil::config

namespace anvil::config {
namespace {

TEST(ConfigDocs, DocsConfigMdHoldsTheCurrentReference) {
  const auto doc = anvil::testing::read_text(anvil::testing::source_dir() + "/docs/config.md");
  EXPECT_NE(doc.find(reference_markdown()), std::string::npos)
      << "docs/config.md is stale: regenerate its table with `build/bin/trainer --print-config-reference`";
}

}  // namespace
}  // namespace anvil::config
