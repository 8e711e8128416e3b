// A section a program registers (as the built-in objectives register theirs)
// may hold nested sections and lists of maps, and its own cross-field checks:
// all load, print, appear in the reference and report errors with the file
// and line of the key, as the built-in sections do.
#include <gtest/gtest.h>

#include <mutex>

#include "anvil/config/config.h"
#include "anvil/core/error.h"
#include "test_util.h"

namespace anvil::config {
namespace {

using anvil::testing::TempDir;
using anvil::testing::write_text;

struct ProbeInner {
  int64_t depth = 1;
  std::vector<int64_t> steps;
  template <class V>
  void visit(V& v) {
    v.field("depth", depth, "How deep.", positive());
    v.field("steps", steps, "Some steps.");
  }
};
struct ProbeItem {
  std::string name;
  double weight = 1.0;
  template <class V>
  void visit(V& v) {
    v.field("name", name, "The item's name.", required());
    v.field("weight", weight, "The item's weight.", non_negative());
  }
};
struct ProbeSection {
  bool on = false;
  ProbeInner inner;
  std::vector<ProbeItem> items;
  template <class V>
  void visit(V& v) {
    v.field("on", on, "Whether it is on.");
    v.section("inner", inner, "A nested section.");
    v.list("items", items, "A list of maps.");
  }
};

void register_probe() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_section<ProbeSection>(
        "nested_probe", "A probe section with a nested section and a list.", "nested_probe_algo",
        [](const ProbeSection& s, const RunConfig& cfg, const Checks& checks) {
          if (s.items.size() > 2) checks.fail("nested_probe.items", "expected at most 2 items");
          for (size_t i = 0; i < s.items.size(); ++i)
            if (s.items[i].name == std::string(static_cast<size_t>(s.inner.depth), 'x'))
              checks.fail(concat("nested_probe.items[", i, "].name"), "expected a name other than the depth's x");
          (void)cfg;
        },
        {{"how_deep", "nested_probe.inner.depth"}});
    add_algorithm_name("nested_probe_algo");
  });
}

class RegisteredSection : public ::testing::Test {
 protected:
  void SetUp() override {
    register_probe();
    const auto src = anvil::testing::source_dir();
    base_ = (dir_ / "base.yaml").string();
    write_text(base_, "output_dir: /tmp/x\nalgorithm: nested_probe_algo\ntokenizer:\n  path: " + src +
                          "/data/tokenizer.model\ndata:\n  train:\n    - path: " + src +
                          "/data/sft_train.jsonl\ntrain:\n  max_steps: 10\n");
  }
  std::string write(const std::string& name, const std::string& text) {
    const auto p = (dir_ / name).string();
    write_text(p, text);
    return p;
  }
  std::string error_of(const std::vector<std::string>& files, const std::vector<std::string>& overrides = {}) {
    try {
      load_config(files, overrides);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "<no error>";
  }
  TempDir dir_;
  std::string base_;
};

TEST_F(RegisteredSection, NestedSectionsAndListsLoadPrintAndLoadBack) {
  const auto file = write("probe.yaml",
                          "nested_probe:\n  on: true\n  inner:\n    depth: 3\n    steps: [1, 5]\n  items:\n"
                          "    - name: a\n    - name: b\n      weight: 0.5\n");
  const auto cfg = load_config({base_, file}, {"nested_probe.inner.depth=4"});
  const auto& s = cfg.extensions.get<ProbeSection>("nested_probe");
  EXPECT_TRUE(s.on);
  EXPECT_EQ(s.inner.depth, 4);
  EXPECT_EQ(s.inner.steps, (std::vector<int64_t>{1, 5}));
  ASSERT_EQ(s.items.size(), 2u);
  EXPECT_EQ(s.items[0].name, "a");
  EXPECT_EQ(s.items[0].weight, 1.0);
  EXPECT_EQ(s.items[1].name, "b");
  EXPECT_EQ(s.items[1].weight, 0.5);
  // A list item's key is overridden in place.
  EXPECT_EQ(load_config({base_, file}, {"nested_probe.items[1].weight=2"})
                .extensions.get<ProbeSection>("nested_probe")
                .items[1]
                .weight,
            2.0);
  const auto printed = to_yaml(cfg);
  EXPECT_NE(printed.find("nested_probe:\n  on: true\n  inner:\n    depth: 4\n"), std::string::npos) << printed;
  const auto again = write("printed.yaml", printed);
  EXPECT_EQ(to_yaml(load_config({again}, {})), printed);
  // Another algorithm's run does not print it, and refuses it.
  const auto sft = to_yaml(load_config({base_}, {"algorithm=sft"}));
  EXPECT_EQ(sft.find("nested_probe"), std::string::npos);
  const auto e = error_of({base_, file}, {"algorithm=sft"});
  EXPECT_NE(e.find("the nested_probe section is read by algorithm: nested_probe_algo"), std::string::npos) << e;
}

TEST_F(RegisteredSection, ErrorsInNestedKeysAndItemsNameTheFileLineAndKey) {
  const auto file = write("bad.yaml",
                          "nested_probe:\n  inner:\n    depth: -1\n    dpeth: 2\n  items:\n    - weight: 0.5\n"
                          "    - name: b\n      weight: -3\n    - 7\n");
  const auto e = error_of({base_, file});
  EXPECT_NE(e.find(file + ":3: nested_probe.inner.depth: expected a positive number, got \"-1\""), std::string::npos)
      << e;
  EXPECT_NE(e.find(file + ":4: nested_probe.inner.dpeth: unknown key; did you mean nested_probe.inner.depth?"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("nested_probe.items[0].name: required key is missing"), std::string::npos) << e;
  EXPECT_NE(e.find(file + ":8: nested_probe.items[1].weight: expected a number >= 0, got \"-3\""), std::string::npos)
      << e;
  EXPECT_NE(e.find(file + ":9: nested_probe.items[2]: expected a map, got \"7\""), std::string::npos) << e;
  // Another trainer's name for a key is pointed at ours.
  const auto foreign = write("foreign.yaml", "nested_probe:\n  how_deep: 2\n");
  EXPECT_EQ(error_of({base_, foreign}),
            foreign +
                ":2: nested_probe.how_deep: unknown key; did you mean nested_probe.inner.depth? (how_deep is "
                "the TRL / transformers name)");
}

TEST_F(RegisteredSection, ItsChecksRunWithTheRestAndPointAtTheKey) {
  const auto file = write("checked.yaml",
                          "nested_probe:\n  inner:\n    depth: 2\n  items:\n    - name: a\n    - name: xx\n"
                          "    - name: c\n");
  const auto e = error_of({base_, file}, {"data.eval=[{path: /nonexistent/eval.jsonl}]"});
  EXPECT_NE(e.find("errors in the config"), std::string::npos) << e;
  EXPECT_NE(e.find(file + ":5: nested_probe.items: expected at most 2 items"), std::string::npos) << e;
  EXPECT_NE(e.find(file + ":6: nested_probe.items[1].name: expected a name other than the depth's x"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("data.eval[0].path: expected an existing file or folder"), std::string::npos) << e;
  EXPECT_EQ(error_of({base_, write("fine.yaml", "nested_probe:\n  items:\n    - name: a\n")}), "<no error>");
}

TEST_F(RegisteredSection, TheReferenceDocumentsNestedKeysAndListItems) {
  const auto ref = reference_markdown();
  EXPECT_NE(ref.find("| **`nested_probe`** | section | | | A probe section with a nested section and a list. |"),
            std::string::npos);
  EXPECT_NE(ref.find("| `nested_probe.inner.depth` | an integer | `1` | a positive number | How deep. |"),
            std::string::npos);
  EXPECT_NE(ref.find("| **`nested_probe.items[]`** | list of maps | `[]` | | A list of maps. |"), std::string::npos);
  EXPECT_NE(ref.find("| `nested_probe.items[].weight` |"), std::string::npos);
  // A section that is not registered is not there.
  const RunConfig defaults;
  EXPECT_THROW(defaults.extensions.get<ProbeSection>("no_such_section"), std::out_of_range);
  // Unset, a registered section reads as its defaults.
  EXPECT_EQ(defaults.extensions.get<ProbeSection>("nested_probe").inner.depth, 1);
}

}  // namespace
}  // namespace anvil::config
