#include "anvil/data/sft_dataset.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

#include "anvil/core/error.h"
#include "anvil/data/collate.h"
#include "anvil/data/sampler.h"
#include "test_util.h"

namespace anvil::data {
namespace {

using anvil::testing::TempDir;
using anvil::testing::write_text;

std::unique_ptr<tokenizer::Tokenizer> bundled_tokenizer() {
  return tokenizer::load_tokenizer("sentencepiece", anvil::testing::source_dir() + "/data/tokenizer.model");
}

std::string load_error(const std::string& content, SftOptions opt = {}) {
  TempDir dir;
  auto p = dir / "d.jsonl";
  write_text(p, content);
  auto tok = bundled_tokenizer();
  try {
    SftDataset::load(p, *tok, opt);
  } catch (const DataError& e) {
    std::string msg = e.what();
    return msg.substr(msg.find("d.jsonl"));  // drop the temp folder
  }
  return "<no error>";
}

TEST(SftSample, LossCoversResponseAndEosOnly) {
  auto tok = bundled_tokenizer();
  auto s = make_sft_sample(*tok, "upper: ab\n", "AB", {});
  const auto p = tok->encode("upper: ab\n");
  const auto r = tok->encode("AB");
  ASSERT_EQ(s.input_ids.size(), p.size() + r.size() + 1);
  EXPECT_EQ(s.input_ids.back(), tok->eos_id());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(s.labels[i], kIgnoreIndex);
  for (size_t i = p.size(); i < s.labels.size(); ++i) EXPECT_EQ(s.labels[i], s.input_ids[i]);
  EXPECT_EQ(tok->decode(s.input_ids), "upper: ab\nAB");

  SftOptions all;
  all.train_on_prompt = true;
  all.add_eos = false;
  auto s2 = make_sft_sample(*tok, "upper: ab\n", "AB", all);
  EXPECT_EQ(s2.labels, s2.input_ids);
}

TEST(SftCollate, PadsRightAndCountsTargets) {
  auto tok = bundled_tokenizer();
  auto a = make_sft_sample(*tok, "add: 1+1\n", "2", {});
  auto b = make_sft_sample(*tok, "reverse: abcdef\n", "fedcba", {});
  auto batch = collate_sft({&a, &b}, tok->pad_id());
  EXPECT_EQ(batch.input_ids.size(1), static_cast<int64_t>(b.input_ids.size()));
  EXPECT_EQ(batch.num_targets, 2 + 7);  // "2"+EOS, "fedcba"+EOS
  EXPECT_EQ(batch.labels.ne(kIgnoreIndex).sum().item<int64_t>(), 9);
  const auto pad_from = static_cast<int64_t>(a.input_ids.size());
  EXPECT_TRUE(batch.input_ids[0].narrow(0, pad_from, batch.input_ids.size(1) - pad_from).eq(tok->pad_id()).all().item<bool>());
  EXPECT_TRUE(batch.labels[0].narrow(0, pad_from, batch.labels.size(1) - pad_from).eq(kIgnoreIndex).all().item<bool>());
}

TEST(SftDataset, BadLinesNameFileLineAndField) {
  EXPECT_EQ(load_error("{\"prompt\": \"a\", \"response\": \"b\"}\n{oops\n"), "d.jsonl:2: not valid JSON");
  EXPECT_EQ(load_error("\n{\"prompt\": \"a\"}\n"), "d.jsonl:2: missing field \"response\"");
  EXPECT_EQ(load_error("{\"prompt\": 3, \"response\": \"b\"}\n"), "d.jsonl:1: field \"prompt\": expected a string, got number");
  EXPECT_EQ(load_error("[1, 2]\n"), "d.jsonl:1: expected a JSON object");
  EXPECT_EQ(load_error(""), "d.jsonl: no usable samples (0 lines read)");
}

TEST(SftDataset, OverflowIsTruncatedOrDroppedAndCounted) {
  TempDir dir;
  auto p = dir / "d.jsonl";
  write_text(p,
             "{\"prompt\": \"reverse: abcdefg\\n\", \"response\": \"gfedcba\"}\n"  // 17 + 8 tokens
             "{\"prompt\": \"add: 1+2\\n\", \"response\": \"3\"}\n"                // 9 + 2
             "{\"prompt\": \"reverse: abcdefghijklmnop\\n\", \"response\": \"x\"}\n");  // prompt alone too long
  auto tok = bundled_tokenizer();
  SftOptions o;
  o.max_length = 20;
  auto ds = SftDataset::load(p, *tok, o);
  EXPECT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.stats().truncated, 1);
  EXPECT_EQ(ds.stats().dropped_no_target, 1);
  EXPECT_EQ(ds[0].input_ids.size(), 20u);
  o.drop_overflow = true;
  auto dropped = SftDataset::load(p, *tok, o);
  EXPECT_EQ(dropped.size(), 1);
  EXPECT_EQ(dropped.stats().dropped_overflow, 2);
}

TEST(EpochSampler, EachEpochIsAPermutationAndResumesExactly) {
  EpochSampler s(10, 42);
  std::vector<int64_t> stream;
  for (int i = 0; i < 35; ++i) stream.push_back(s.next());
  for (int e = 0; e < 3; ++e)
    EXPECT_EQ(std::set<int64_t>(stream.begin() + 10 * e, stream.begin() + 10 * e + 10).size(), 10u);
  EXPECT_NE(std::vector<int64_t>(stream.begin(), stream.begin() + 10),
            std::vector<int64_t>(stream.begin() + 10, stream.begin() + 20));
  for (int cut : {0, 7, 10, 20, 23}) {  // mid-epoch and exactly at epoch boundaries
    EpochSampler a(10, 42);
    for (int i = 0; i < cut; ++i) a.next();
    EpochSampler b(10, 42);
    b.set_state(a.state());
    for (int i = cut; i < 35; ++i) EXPECT_EQ(b.next(), stream[i]) << "cut " << cut << " i " << i;
  }
}

}  // namespace
}  // namespace anvil::data
