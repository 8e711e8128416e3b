// No silent keys (docs/config.md, "Keys an algorithm does not read"): every
// key of every section, set to a valid value other than its default, either
// is one the run's algorithm reads or is refused with a message naming it.
// The keys are listed by walking RunConfig itself, so a key added to a config
// struct is covered without a change here.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>
#include <sstream>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "anvil/models/registry.h"
#include "test_util.h"

namespace anvil::config {
namespace {

namespace stdfs = std::filesystem;
using anvil::testing::TempDir;
using anvil::testing::write_text;

bool allowed(const Rule& rule, double x) { return (!rule.number || rule.number(x)) && !(rule.off && *rule.off == x); }

std::string text(double x) {
  std::ostringstream os;
  os.precision(17);
  os << x;
  return os.str();
}

// A valid value other than `value`, as an override writes it.
std::string other_value(bool value, const Rule&) { return value ? "false" : "true"; }
std::string other_value(int64_t value, const Rule& rule) {
  for (int64_t c : {value + 1, value * 2, int64_t{1}, int64_t{2}, int64_t{3}})
    if (c != value && allowed(rule, static_cast<double>(c))) return std::to_string(c);
  ADD_FAILURE() << "no other valid integer than " << value;
  return "";
}
std::string other_value(double value, const Rule& rule) {
  for (double c : {value * 0.5, value + 0.25, 0.25, 0.3, 2.0})
    if (c != value && allowed(rule, c)) return text(c);
  ADD_FAILURE() << "no other valid number than " << value;
  return "";
}
std::string other_value(const std::string& value, const Rule& rule) {
  for (const auto& c : rule.choices)
    if (c != value) return c;
  return value == "x" ? "y" : "x";
}
std::string other_value(const std::vector<double>& value, const Rule& rule) {
  std::string out;
  for (double x : value) out += (out.empty() ? "" : ", ") + other_value(x, rule);
  return "[" + (out.empty() ? std::string("0.5") : out) + "]";
}
std::string other_value(const std::vector<int64_t>& value, const Rule& rule) {
  // Ascending, as a range (train.profile_steps) takes them.
  const std::vector<int64_t> c =
      value == std::vector<int64_t>{1, 2} ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{1, 2};
  if (!allowed(rule, static_cast<double>(c[0])) || !allowed(rule, static_cast<double>(c[1])))
    ADD_FAILURE() << "no other valid list of integers";
  return "[" + std::to_string(c[0]) + ", " + std::to_string(c[1]) + "]";
}
std::string other_value(const std::vector<std::string>&, const Rule&) { return "[x]"; }

/// Every key of RunConfig (as the reference names it: data.train[].path),
/// with a valid value other than its default.
class KeyLister {
 public:
  template <class T>
  void field(const char* key, T& value, const char*, const Rule& rule = {}) {
    keys.emplace_back(prefix_ + key, other_value(value, rule));
  }
  template <class S>
  void section(const char* key, S& s, const char*) {
    const auto saved = prefix_;
    prefix_ += std::string(key) + ".";
    s.visit(*this);
    prefix_ = saved;
  }
  template <class S>
  void list(const char* key, std::vector<S>& items, const char* doc) {
    list_of(key, ListRef::of(items), doc);
  }
  // A list inside a registered section (ppo.rewards) comes as a ListRef.
  void list_of(const char* key, const ListRef& items, const char*) {
    const auto saved = prefix_;
    prefix_ += std::string(key) + "[].";
    detail::FieldVisitorFor<KeyLister> fields(*this);
    items.visit_default(fields);
    prefix_ = saved;
  }
  std::vector<std::pair<std::string, std::string>> keys;

 private:
  std::string prefix_;
};

std::string error_of(const std::vector<std::string>& files, const std::vector<std::string>& overrides) {
  try {
    load_config(files, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

// An objective a program registers with the keys it reads.
void register_probe() {
  static std::once_flag once;
  std::call_once(once, [] { add_algorithm_name("unread_keys_probe", {"data.packing"}); });
}

class UnreadKeys : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto src = anvil::testing::source_dir();
    base_ = (dir_ / "base.yaml").string();
    write_text(base_, "output_dir: /tmp/x\ntokenizer:\n  path: " + src + "/data/tokenizer.model\ndata:\n  train:\n" +
                          "    - path: " + src + "/data/sft_train.jsonl\n  eval:\n    - path: " + src +
                          "/data/sft_eval.jsonl\ntrain:\n  max_steps: 10\n");
    register_probe();
  }
  std::string write(const std::string& name, const std::string& text) {
    const auto p = (dir_ / name).string();
    write_text(p, text);
    return p;
  }
  TempDir dir_;
  std::string base_;
};

TEST_F(UnreadKeys, EveryKeyOfEverySectionIsReadOrRefusedUnderEveryAlgorithm) {
  RunConfig defaults;
  KeyLister lister;
  defaults.visit(lister);
  ASSERT_GT(lister.keys.size(), 100u);
  size_t refused = 0;
  for (const auto& algorithm : algorithm_names()) {
    ASSERT_EQ(error_of({base_}, {"algorithm=" + algorithm}), "<no error>") << algorithm;
    const auto read = keys_read_by(algorithm);
    const std::set<std::string> reads(read.begin(), read.end());
    for (const auto& [name, value] : lister.keys) {
      if (name == "algorithm") continue;
      auto key = name;
      if (const auto at = key.find("[]"); at != std::string::npos) key.replace(at, 2, "[0]");
      auto e = error_of({base_}, {"algorithm=" + algorithm, key + "=" + value});
      if (const auto at = key.find("[0].");
          at != std::string::npos && e.find("no list to index") != std::string::npos) {
        // A list the base config leaves empty (ppo.rewards): set it whole, with one item; errors name the list.
        e = error_of({base_},
                     {"algorithm=" + algorithm, key.substr(0, at) + "=[{" + key.substr(at + 4) + ": " + value + "}]"});
        key = key.substr(0, at);
      }
      const auto section = key.substr(0, key.find_first_of(".["));
      if (reads.count(name)) {
        EXPECT_EQ(e.find(key + ": not read by"), std::string::npos) << algorithm << " reads " << key << ": " << e;
        continue;
      }
      ++refused;
      EXPECT_TRUE(e.find(key + ": not read by algorithm " + algorithm + " (read by ") != std::string::npos ||
                  e.find(key + ": the " + section + " section is read by algorithm: ") != std::string::npos)
          << algorithm << " does not read " << key << "=" << value << ", yet: " << e;
    }
  }
  EXPECT_GT(refused, 0u);
}

TEST_F(UnreadKeys, LossChunkSizeUnderDpoIsAnErrorNamingTheKeyAndItsReaders) {
  EXPECT_EQ(error_of({base_}, {"algorithm=dpo", "train.loss_chunk_size=64"}),
            "command line (train.loss_chunk_size=64): train.loss_chunk_size: not read by algorithm dpo (read by sft, "
            "pretrain); remove it");
  const auto file = write("dpo.yaml", "algorithm: dpo\ntrain:\n  loss_chunk_size: 64\n");
  EXPECT_EQ(error_of({base_, file}, {}),
            file + ":3: train.loss_chunk_size: not read by algorithm dpo (read by sft, pretrain); remove it");
  for (const char* algorithm : {"reward", "ppo", "ilql"})
    EXPECT_NE(error_of({base_}, {std::string("algorithm=") + algorithm, "train.loss_chunk_size=64"})
                  .find("train.loss_chunk_size: not read by algorithm " + std::string(algorithm)),
              std::string::npos)
        << algorithm;
  for (const char* algorithm : {"sft", "pretrain"})
    EXPECT_EQ(error_of({base_}, {std::string("algorithm=") + algorithm, "train.loss_chunk_size=64"}), "<no error>");
}

TEST_F(UnreadKeys, AListItemsKeyPointsAtTheItem) {
  const auto file = write("dpo.yaml", "algorithm: dpo\ndata:\n  train:\n    - path: " + anvil::testing::source_dir() +
                                          "/data/sft_train.jsonl\n      response_field: answer\n");
  EXPECT_EQ(error_of({base_, file}, {}), file +
                                             ":5: data.train[0].response_field: not read by algorithm dpo (read "
                                             "by sft, ilql, distill); remove it");
}

TEST_F(UnreadKeys, DefaultValuesAndOffValuesAreAccepted) {
  // What a printed config holds, and 0 = no generation / no table.
  EXPECT_EQ(error_of({base_}, {"algorithm=reward", "eval.generate_samples=64", "train.loss_chunk_size=0"}),
            "<no error>");
  EXPECT_EQ(error_of({base_}, {"algorithm=pretrain", "eval.generate_samples=0", "eval.table_rows=0"}), "<no error>");
  EXPECT_EQ(error_of({base_}, {"algorithm=reward", "eval.generate_samples=5"}),
            "command line (eval.generate_samples=5): eval.generate_samples: not read by algorithm reward (read by sft, "
            "dpo, ppo, ilql, kto, distill); remove it");
  for (const auto& algorithm : {"sft", "pretrain", "reward", "dpo", "ppo", "ilql"}) {
    const auto cfg = load_config({base_}, {std::string("algorithm=") + algorithm});
    const auto printed = write(std::string(algorithm) + "-printed.yaml", to_yaml(cfg));
    EXPECT_EQ(error_of({printed}, {}), "<no error>") << algorithm;
  }
}

TEST_F(UnreadKeys, ARegisteredObjectiveReadsTheKeysItLists) {
  EXPECT_EQ(error_of({base_}, {"algorithm=unread_keys_probe", "data.packing=true"}), "<no error>");
  EXPECT_EQ(error_of({base_}, {"algorithm=unread_keys_probe", "train.loss_chunk_size=8"}),
            "command line (train.loss_chunk_size=8): train.loss_chunk_size: not read by algorithm unread_keys_probe "
            "(read by sft, pretrain); remove it");
  EXPECT_NE(error_of({base_}, {"algorithm=dpo", "data.packing=true"})
                .find("data.packing: not read by algorithm dpo (read by sft, pretrain, unread_keys_probe)"),
            std::string::npos);
  const auto reads = keys_read_by("unread_keys_probe");
  EXPECT_NE(std::find(reads.begin(), reads.end(), "data.packing"), reads.end());
  EXPECT_EQ(std::find(reads.begin(), reads.end(), "train.loss_chunk_size"), reads.end());
  EXPECT_NE(std::find(reads.begin(), reads.end(), "optimizer.lr"), reads.end());
  // A key it names that is not one is refused, and the name stays free.
  EXPECT_THROW(add_algorithm_name("unread_keys_typo", {"data.pakcing"}), ConfigError);
  const auto names = algorithm_names();
  EXPECT_EQ(std::find(names.begin(), names.end(), "unread_keys_typo"), names.end());
}

TEST_F(UnreadKeys, TheReferenceSaysWhichAlgorithmsReadAKey) {
  const auto ref = reference_markdown();
  EXPECT_NE(ref.find("| `train.loss_chunk_size` | an integer | `0` | a number >= 0; read by sft, pretrain |"),
            std::string::npos);
  EXPECT_NE(ref.find("| `eval.generate_samples` | an integer | `64` | a number >= 0; read by sft, dpo, ppo, ilql, "
                     "kto, distill (any algorithm takes 0); may change on resume |"),
            std::string::npos);
}

// The built-in objectives take the path a linking program takes: each
// registered its section (with its checks) and its name, in its own file;
// the config layer names none of them.
TEST(BuiltinObjectives, RegisterTheirSectionsAndNamesAsProgramsDo) {
  const auto names = algorithm_names();
  const std::vector<std::string> builtin = {"sft", "pretrain", "reward", "dpo", "ppo", "ilql", "kto", "distill"};
  ASSERT_GE(names.size(), builtin.size());
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + builtin.size()), builtin);
  std::set<std::string> sections;
  for (const auto& s : registered_sections()) sections.insert(s.name);
  for (const char* s : {"sft", "reward", "dpo", "ppo", "ilql", "kto", "distill"}) {
    EXPECT_TRUE(sections.count(s)) << s;
    EXPECT_EQ(section_algorithm(s), s);
  }
  // keys_read_by knows only registered algorithms (a typo is not "reads everything").
  EXPECT_THROW(keys_read_by("dpoo"), ConfigError);
}

// Model keys that only some families read: for every family of the model
// registry and every such key, set to a valid value other than its default,
// the key is accepted when the family reads it and refused, naming the
// families that do, when it does not. The config layer learns families,
// keys and checks from the registry alone (src/models/registry.cpp).
TEST_F(UnreadKeys, EveryFamilyKeyIsReadOrRefusedUnderEveryFamily) {
  // The registry's families, in its order (a test may register one of its own after them).
  const auto registry = models::family_names();
  const auto names = model_family_names();
  ASSERT_GE(names.size(), registry.size());
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(registry.size())),
            registry);
  RunConfig defaults;
  KeyLister lister;
  defaults.visit(lister);
  size_t refused = 0, accepted = 0;
  for (const auto& family : registry) {
    ASSERT_EQ(error_of({base_}, {"model.family=" + family}), "<no error>") << family;
    for (const auto& [key, value] : lister.keys) {
      const auto readers = model_families_reading(key);
      if (key.rfind("model.", 0) != 0 || readers.empty()) continue;
      const auto e = error_of({base_}, {"model.family=" + family, key + "=" + value});
      if (std::count(readers.begin(), readers.end(), family)) {
        ++accepted;
        EXPECT_EQ(e.find(key + ": applies to model.family"), std::string::npos)
            << family << " reads " << key << ": " << e;
      } else {
        ++refused;
        EXPECT_NE(e.find(key + ": applies to model.family " + readers.front()), std::string::npos)
            << family << ": " << e;
        EXPECT_NE(e.find(" only, not " + family), std::string::npos) << e;
      }
    }
  }
  EXPECT_GT(refused, 0u);
  EXPECT_GT(accepted, 0u);
}

TEST_F(UnreadKeys, AFamilyKeyNamesItsReadersAndAFamilyChecksItsOwnKeys) {
  EXPECT_EQ(error_of({base_}, {"model.sliding_window=8"}),
            "command line (model.sliding_window=8): model.sliding_window: applies to model.family qwen2, qwen3, "
            "mistral, phi3, mixtral, qwen3_moe, gemma2 or gemma3_text only, not gpt2");
  EXPECT_EQ(error_of({base_}, {"model.family=llama", "model.do_layer_norm_before=false"}),
            "command line (model.do_layer_norm_before=false): model.do_layer_norm_before: applies to model.family opt "
            "only, not "
            "llama");
  EXPECT_EQ(error_of({base_}, {"model.family=mixtral", "model.moe_intermediate_size=64"}),
            "command line (model.moe_intermediate_size=64): model.moe_intermediate_size: applies to model.family "
            "qwen3_moe only, not mixtral");
  EXPECT_EQ(error_of({base_}, {"model.family=qwen3_moe", "model.moe_intermediate_size=64"}), "<no error>");
  // Keys most families read are still refused where one does not (GPT-NeoX has no LLaMA 3 scaling and no
  // grouped-query attention, OPT and GPT-2 no rotary positions): once they were silently ignored.
  EXPECT_EQ(error_of({base_}, {"model.family=neox", "model.rope_scaling.type=llama3"}),
            "command line (model.rope_scaling.type=llama3): model.rope_scaling.type: applies to model.family llama, "
            "qwen2, qwen3, mistral, phi3, mixtral or qwen3_moe only, not neox");
  EXPECT_EQ(error_of({base_}, {"model.family=neox", "model.num_key_value_heads=2"}),
            "command line (model.num_key_value_heads=2): model.num_key_value_heads: applies to model.family llama, "
            "qwen2, qwen3, mistral, phi3, mixtral, qwen3_moe, gemma2 or gemma3_text only, not neox");
  EXPECT_NE(error_of({base_}, {"model.family=opt", "model.rope_theta=500000"})
                .find("model.rope_theta: applies to model.family llama, "),
            std::string::npos);
  EXPECT_NE(error_of({base_}, {"model.rope_theta=500000"}).find(" only, not gpt2"), std::string::npos);
  EXPECT_NE(error_of({base_}, {"model.family=qwen2", "model.attention_bias=true"})
                .find("model.attention_bias: applies to model.family llama, qwen3, qwen3_moe, gemma2 or gemma3_text "
                      "only, not qwen2"),
            std::string::npos);
  // Defaults are what a printed config holds: accepted for every family.
  EXPECT_EQ(error_of({base_}, {"model.family=gpt2", "model.do_layer_norm_before=true", "model.sliding_window=0"}),
            "<no error>");
  // GPT-2's own checks, registered by its folder (src/models/gpt2/register.cpp).
  EXPECT_EQ(error_of({base_}, {"model.tie_word_embeddings=false"}),
            "command line (model.tie_word_embeddings=false): model.tie_word_embeddings: GPT-2's output head is always "
            "tied to "
            "its embedding; expected auto or true");
  EXPECT_EQ(error_of({base_}, {"model.family=llama", "model.tie_word_embeddings=false"}), "<no error>");
  // A family is registered once, with keys of the model section only.
  EXPECT_THROW(add_model_family({"gpt2", {}}), ConfigError);
  EXPECT_THROW(add_model_family({"unread_keys_family", {"model.slidng_window"}}), ConfigError);
  EXPECT_THROW(add_model_family({"unread_keys_family", {"train.max_steps"}}), ConfigError);
  const auto names = model_family_names();
  EXPECT_EQ(std::find(names.begin(), names.end(), "unread_keys_family"), names.end());
}

// A family's own keys (FamilyKeys::own_keys): new keys of the model section
// that load, print, reach the family's config and are refused for every
// other family. OPT's five are such keys; here a family of the test's own
// (registered with the config layer only, so no model is built).
struct WidgetKeys {
  int64_t widgets = 3;
  void visit(FieldVisitor& v) { v.field("widgets", widgets, "Widgets per block.", positive()); }
};

TEST_F(UnreadKeys, AFamilysOwnKeysLoadPrintAndAreRefusedForOtherFamilies) {
  EXPECT_EQ(model_families_reading("model.do_layer_norm_before"), std::vector<std::string>{"opt"});
  static std::once_flag once;
  std::call_once(once, [] {
    add_model_family({"unread_keys_widgets", {"model.head_dim"}, {}, family_keys<WidgetKeys>()});
  });
  EXPECT_EQ(model_families_reading("model.widgets"), std::vector<std::string>{"unread_keys_widgets"});
  // Loaded into the family's own struct, printed and loaded back.
  auto cfg = load_config({base_}, {"model.family=unread_keys_widgets", "model.widgets=7"});
  EXPECT_EQ(cfg.model.keys.get<WidgetKeys>("unread_keys_widgets").widgets, 7);
  const auto printed = write("widgets-printed.yaml", to_yaml(cfg));
  EXPECT_NE(anvil::testing::read_text(printed).find("widgets: 7"), std::string::npos);
  EXPECT_EQ(load_config({printed}, {}).model.keys.get<WidgetKeys>("unread_keys_widgets").widgets, 7);
  // A copy is deep; an unset family's keys are its defaults.
  auto copy = cfg;
  copy.model.keys.get<WidgetKeys>("unread_keys_widgets").widgets = 9;
  EXPECT_EQ(cfg.model.keys.get<WidgetKeys>("unread_keys_widgets").widgets, 7);
  EXPECT_EQ(load_config({base_}, {}).model.keys.get<WidgetKeys>("unread_keys_widgets").widgets, 3);
  // Its rule holds; other families refuse the key, naming its one reader.
  EXPECT_NE(error_of({base_}, {"model.family=unread_keys_widgets", "model.widgets=0"})
                .find("model.widgets: expected a positive number"),
            std::string::npos);
  EXPECT_EQ(error_of({base_}, {"model.family=llama", "model.widgets=7"}),
            "command line (model.widgets=7): model.widgets: applies to model.family unread_keys_widgets only, not "
            "llama");
  // The reference lists it with its reader.
  EXPECT_NE(reference_markdown().find("| `model.widgets` | an integer | `3` | a positive number; model.family "
                                      "unread_keys_widgets | Widgets per block. |"),
            std::string::npos);
  // Own keys are new keys: one that is already a model key is refused.
  EXPECT_THROW(add_model_family({"unread_keys_twice", {}, {}, family_keys<WidgetKeys>()}), ConfigError);
}

// A key group (ModelKeyGroup): keys several families read, registered once
// with their checks; the library's are models/registry.h's (attention, rotary,
// norm, experts). Here a group of the test's own, read by a test family.
struct GizmoKeys {
  static constexpr const char* kGroup = "unread_keys_gizmos";
  int64_t gizmos = 1;
  void visit(FieldVisitor& v) { v.field("gizmos", gizmos, "Gizmos per head.", positive()); }
};

TEST_F(UnreadKeys, AKeyGroupIsRegisteredOnceReadByItsFamiliesAndChecked) {
  static std::once_flag once;
  std::call_once(once, [] {
    add_model_key_group(model_key_group<GizmoKeys>([](const ModelConfig& m, const Checks& checks) {
      if (m.keys.get<GizmoKeys>().gizmos > m.num_attention_heads)
        checks.fail("model.gizmos", "expected at most model.num_attention_heads gizmos");
    }));
    add_model_family({"unread_keys_gizmo_family", {"model.gizmos"}});
  });
  EXPECT_EQ(model_families_reading("model.gizmos"), std::vector<std::string>{"unread_keys_gizmo_family"});
  auto cfg = load_config({base_}, {"model.family=unread_keys_gizmo_family", "model.gizmos=2"});
  EXPECT_EQ(cfg.model.keys.get<GizmoKeys>().gizmos, 2);
  const auto printed = write("gizmos-printed.yaml", to_yaml(cfg));
  EXPECT_EQ(load_config({printed}, {}).model.keys.get<GizmoKeys>().gizmos, 2);
  // The group's check runs on a model built from keys; a family that does not read the key refuses it.
  EXPECT_NE(error_of({base_}, {"model.family=unread_keys_gizmo_family", "model.gizmos=64"})
                .find("model.gizmos: expected at most model.num_attention_heads gizmos"),
            std::string::npos);
  EXPECT_EQ(error_of({base_}, {"model.family=neox", "model.gizmos=2"}),
            "command line (model.gizmos=2): model.gizmos: applies to model.family unread_keys_gizmo_family only, "
            "not neox");
  // The library's groups are registered, with their checks (the heads divide).
  std::vector<std::string> groups;
  for (const auto& g : model_key_groups()) groups.push_back(g.name);
  EXPECT_EQ(std::vector<std::string>(groups.begin(), groups.begin() + 4),
            (std::vector<std::string>{"norm", "attention", "rotary", "experts"}));
  EXPECT_NE(error_of({base_}, {"model.family=llama", "model.num_key_value_heads=3"})
                .find("model.num_key_value_heads: expected a divisor of model.num_attention_heads (4), got 3"),
            std::string::npos);
  // A name is a group's or a family's once; a group's keys are new keys.
  EXPECT_THROW(add_model_key_group(model_key_group<GizmoKeys>()), ConfigError);
  EXPECT_THROW(add_model_key_group({"gpt2", family_keys<WidgetKeys>()}), ConfigError);
  EXPECT_THROW(add_model_key_group({"unread_keys_widget_group", family_keys<GizmoKeys>()}), ConfigError);
  EXPECT_THROW(add_model_family({"attention", {}}), ConfigError);
  EXPECT_THROW(add_model_key_group({"unread_keys_empty", {}}), ConfigError);
}

// Shipped configs name files of the machine they were written for (models,
// data, a finished quickstart): those may be missing here, nothing else.
TEST(UnreadKeysShipped, EveryShippedConfigLoadsButForMissingFiles) {
  const stdfs::path src = anvil::testing::source_dir();
  const auto cwd = stdfs::current_path();
  stdfs::current_path(src);  // their paths are relative to the source folder
  std::vector<stdfs::path> files;
  for (const auto* dir : {"configs", "configs/examples"})
    for (const auto& e : stdfs::directory_iterator(src / dir))
      if (e.path().extension() == ".yaml") files.push_back(e.path());
  EXPECT_GE(files.size(), 14u);
  for (const auto& f : files) {
    const auto e = error_of({f.string()}, {"model.from=null", "tokenizer.path=data/tokenizer.model"});
    if (e == "<no error>") continue;
    std::istringstream lines(e);
    std::string line;
    while (std::getline(lines, line))
      if (line.find("errors in the config:") == std::string::npos)
        EXPECT_NE(line.find("expected an existing"), std::string::npos) << f << ": " << e;
  }
  stdfs::current_path(cwd);
}

}  // namespace
}  // namespace anvil::config
