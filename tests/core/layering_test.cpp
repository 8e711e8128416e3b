// The layers of shared/ARCHITECTURE.md, checked on the sources: an include
// points down only (apps at the top, core at the bottom), io/ holds formats
// that know no model, and the objectives that score samples (ppo, ilql) reach
// rewards/ rather than each other. An exception would be listed by file and
// header, so the list can only shrink: one that no longer occurs fails too.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "anvil/config/config.h"
#include "anvil/models/registry.h"
#include "test_util.h"

namespace {

namespace stdfs = std::filesystem;

// Top to bottom. A folder may include its own headers and those of the
// layers below it. checkpoint/ (HF folders, PEFT adapters, checkpoint
// assembly) sits below distributed/, whose sharded checkpoints write through
// it, and above optim/ and models/, whose state it saves.
// tool/ (the anvil tool's commands) sits above train/, whose public headers it reads.
const std::vector<std::string> kLayers = {"apps",       "tool",    "train", "rewards", "generation", "distributed",
                                          "checkpoint", "optim",   "data",  "chat",    "jinja",      "tokenizer",
                                          "models",     "kernels", "io",    "config",  "core"};

// Includes that still run up a layer, by file and header; none today.
const std::set<std::string> kKnownUpward = {};

size_t rank_of(const std::string& layer) {
  return static_cast<size_t>(std::find(kLayers.begin(), kLayers.end(), layer) - kLayers.begin());
}

struct Include {
  std::string file;    // relative to the source tree
  std::string layer;   // the including file's
  std::string header;  // as written
  std::string target;  // the included header's layer
};

std::vector<Include> includes() {
  const stdfs::path src = anvil::testing::source_dir();
  const std::regex line(R"(^\s*#\s*include\s*"(anvil/)?([a-z_]+)/[^"]+")");
  std::vector<Include> out;
  for (const auto& [root, top] :
       std::vector<std::pair<std::string, bool>>{{"apps", true}, {"src", false}, {"include/anvil", false}}) {
    for (const auto& e : stdfs::recursive_directory_iterator(src / root)) {
      const auto ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh")) continue;
      const auto rel = stdfs::relative(e.path(), src / root);
      const auto layer = top ? std::string("apps") : rel.begin()->string();
      if (rank_of(layer) == kLayers.size()) continue;  // src/pch.h and the like
      std::ifstream in(e.path());
      for (std::string l; std::getline(in, l);) {
        std::smatch m;
        if (!std::regex_search(l, m, line)) continue;
        const auto header = l.substr(l.find('"') + 1, l.rfind('"') - l.find('"') - 1);
        out.push_back({stdfs::relative(e.path(), src).string(), layer, header, m[2]});
      }
    }
  }
  return out;
}

TEST(Layering, IncludesPointDownOnly) {
  const auto all = includes();
  ASSERT_GT(all.size(), 300u);  // the walk found the sources
  std::set<std::string> upward;
  for (const auto& i : all)
    if (rank_of(i.target) < kLayers.size() && i.target != i.layer && rank_of(i.target) < rank_of(i.layer))
      upward.insert(i.file + " -> " + i.header);
  for (const auto& u : upward)
    EXPECT_TRUE(kKnownUpward.count(u)) << u << ": an include that runs up a layer (shared/ARCHITECTURE.md)";
  for (const auto& k : kKnownUpward)
    EXPECT_TRUE(upward.count(k)) << k << " no longer runs up a layer: remove it from kKnownUpward";
}

// The programs (apps/trainer, apps/anvil) use the public API only, as a
// program linking the installed package does: each calls its entry in the library.
TEST(Layering, TheAppsUseThePublicApiOnly) {
  int seen = 0;
  for (const auto& i : includes()) {
    if (i.layer != "apps") continue;
    ++seen;
    EXPECT_EQ(i.header.rfind("anvil/", 0), 0u) << i.file << " includes \"" << i.header << "\", which is not public";
  }
  EXPECT_GE(seen, 2);  // the walk found both programs
}

// train/ is two rooms: the engine and loop (src/train/*) and the objectives
// (src/train/objectives/, a file or folder each, as an external objective
// would be). The engine includes no objective's header; an objective reaches
// the engine only through the public API (anvil/train/*.h), never through
// the engine's private headers.
TEST(Layering, TrainIsTwoRoomsTheEngineAndTheObjectives) {
  int objectives = 0;
  for (const auto& i : includes()) {
    if (i.layer != "train" || i.target != "train" || i.header.rfind("anvil/", 0) == 0) continue;
    const bool in_objectives = i.file.find("train/objectives/") != std::string::npos;
    const bool of_objectives = i.header.rfind("train/objectives/", 0) == 0;
    objectives += in_objectives;
    EXPECT_EQ(in_objectives, of_objectives) << i.file << " includes " << i.header;
  }
  EXPECT_GT(objectives, 20);  // the walk found the objectives' includes
}

// PPO and ILQL both score samples through rewards/ (anvil/rewards/rewards.h);
// neither includes the other, and rewards/ includes nothing of train/.
TEST(Layering, PpoAndIlqlReachRewardsNotEachOther) {
  const auto all = includes();
  const auto is = [](const std::string& file, const std::string& stem) {
    const auto name = stdfs::path(file).filename().string();
    return file.find("train/objectives/") != std::string::npos && name.rfind(stem, 0) == 0;
  };
  std::map<std::string, bool> reaches_rewards;
  for (const auto& i : all) {
    const auto target = stdfs::path(i.header).filename().string();
    for (const auto& [self, other] : {std::pair<std::string, std::string>{"ilql", "ppo"}, {"ppo", "ilql"}}) {
      if (!is(i.file, self)) continue;
      EXPECT_FALSE(i.target == "train" && target.rfind(other, 0) == 0) << i.file << " includes " << i.header;
      if (i.header == "anvil/rewards/rewards.h") reaches_rewards[self] = true;
    }
    EXPECT_FALSE(i.layer == "rewards" && i.target == "train") << i.file << " includes " << i.header;
  }
  EXPECT_TRUE(reaches_rewards["ppo"]);
  EXPECT_TRUE(reaches_rewards["ilql"]);
}

// The config layer names no algorithm: the objectives register their
// sections, checks and the keys they read (register_section,
// register_objective) from their own files, as a linking program does. The
// data formats (sft, pretrain, ...) and RunConfig's default algorithm are
// values, not algorithms' rules, and stay.
TEST(Layering, TheConfigLayerNamesNoAlgorithm) {
  const stdfs::path src = anvil::testing::source_dir();
  const std::regex named(
      R"re("(reward|dpo|ppo|ilql|kto|distill)[".]|\b(Sft|Reward|Dpo|Ppo|Ilql)Config\b|\.(sft|reward|dpo|ppo|ilql)\.)re");
  size_t files = 0;
  for (const auto* dir : {"src/config", "include/anvil/config"})
    for (const auto& e : stdfs::directory_iterator(src / dir)) {
      ++files;
      std::ifstream in(e.path());
      size_t n = 0;
      for (std::string l; std::getline(in, l);) {
        ++n;
        // Doc strings may name an algorithm that reads a key; code may not.
        const auto code = l.substr(0, l.find("//"));
        std::smatch m;
        if (code.find("v.field(") == std::string::npos && std::regex_search(code, m, named))
          ADD_FAILURE() << e.path().string() << ":" << n << ": names an algorithm (" << m[0]
                        << "): register it from the objective's own file";
      }
    }
  EXPECT_GE(files, 4u);
}

// Nor a model family: the model registry hands the config layer each
// family's name, the model keys it reads and its checks
// (config::add_model_family). The default family is a value and stays.
TEST(Layering, TheConfigLayerNamesNoModelFamily) {
  const stdfs::path src = anvil::testing::source_dir();
  const auto fallback = anvil::config::ModelConfig{}.family;
  size_t names = 0;
  for (const auto& family : anvil::models::family_names()) {
    if (family == fallback) continue;
    ++names;
    const auto literal = "\"" + family + "\"";
    for (const auto* dir : {"src/config", "include/anvil/config"})
      for (const auto& e : stdfs::directory_iterator(src / dir)) {
        std::ifstream in(e.path());
        size_t n = 0;
        for (std::string l; std::getline(in, l);) {
          ++n;
          if (l.substr(0, l.find("//")).find(literal) != std::string::npos)
            ADD_FAILURE() << e.path().string() << ":" << n << ": names the model family " << literal
                          << ": give it to the family's ModelFamily (config_keys, check)";
        }
      }
  }
  EXPECT_GE(names, 11u);
}

// include/anvil/ is the installed API: its headers include only each other
// (an internal header there would be missing from the package), and the
// surface only shrinks.
TEST(Layering, PublicHeadersIncludeOnlyPublicHeaders) {
  const stdfs::path src = anvil::testing::source_dir();
  const std::regex quoted(R"re(^\s*#\s*include\s*"([^"]+)")re");
  size_t headers = 0;
  for (const auto& e : stdfs::recursive_directory_iterator(src / "include/anvil")) {
    if (!e.is_regular_file() || e.path().extension() != ".h") continue;
    ++headers;
    {
      std::ifstream top(e.path());
      std::string first, second;
      std::getline(top, first);
      std::getline(top, second);
      EXPECT_EQ(second.rfind("// ", 0), 0u)
          << stdfs::relative(e.path(), src).string() << ": no comment under #pragma once saying what the header holds";
    }
    std::ifstream in(e.path());
    for (std::string l; std::getline(in, l);) {
      std::smatch m;
      if (!std::regex_search(l, m, quoted)) continue;
      EXPECT_TRUE(stdfs::is_regular_file(src / "include" / m[1].str()))
          << stdfs::relative(e.path(), src).string() << " includes \"" << m[1] << "\", which is not installed";
    }
  }
  // The API of docs/library.md's "What the headers hold": errors, config and schema, the trainer entry,
  // the anvil tool's entry, objective and engine, the four built-in objectives, causal LM and registry,
  // HF folders, tokenizer, chat, generation, rewards. Each says at its top what it holds.
  EXPECT_GE(headers, 14u);
  EXPECT_LE(headers, 18u) << "a new public header: is it API (docs/library.md, \"What the headers hold\")?";
}

}  // namespace
