// Docs that are run: every command of docs/getting-started.md and the
// README's command blocks, executed in order on the bundled data
// (tests/docs/run_doc_commands.py says what it shortens). Needs the
// quickstart fixture, which stands in for the run the docs' later commands use.
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"

namespace anvil {
namespace {

TEST(DocsCommands, GettingStartedAndReadmeCommandsRun) {
  anvil::testing::TempDir dir;
  const auto build = std::filesystem::path(anvil::testing::trainer_bin()).parent_path().parent_path();
  const auto fixture = anvil::testing::fixture_dir() / "quickstart-sft";
  ASSERT_TRUE(std::filesystem::exists(fixture / "checkpoint-1500")) << fixture;
  std::string out;
  const int rc =
      anvil::testing::run(anvil::testing::python_bin() + " " + anvil::testing::source_dir() +
                              "/tests/docs/run_doc_commands.py " + anvil::testing::source_dir() + " " + build.string() +
                              " " + fixture.string() + " " + (dir / "work").string() + " 2>&1",
                          &out);
  std::cout << out;
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(" 0 failed"), std::string::npos);
}

}  // namespace
}  // namespace anvil
