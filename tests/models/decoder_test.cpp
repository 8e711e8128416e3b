// generation::Decoder: its parts one at a time, and buckets kept between calls.
#include "anvil/generation/generate.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"

namespace anvil::generation {
namespace {

std::shared_ptr<models::CausalLM> tiny_llama() {
  at::manual_seed(5);
  models::llama::LlamaOptions o;
  o.vocab_size(60)
      .hidden_size(32)
      .intermediate_size(64)
      .num_hidden_layers(2)
      .num_attention_heads(4)
      .num_key_value_heads(2)
      .max_position_embeddings(40)
      .initializer_range(0.2);
  return std::make_shared<models::llama::LlamaForCausalLM>(o);
}

/// (T, V) float64 log-softmax of one sequence's logits.
at::Tensor forward_logps(models::CausalLM& model, const std::vector<int64_t>& ids) {
  return model.forward(at::tensor(ids, at::kLong).unsqueeze(0))[0].to(at::kDouble).log_softmax(-1);
}

// prefill alone chooses each row's first token from the prompt's last position; one step() the
// second from the prompt and that token; capture() says why not on the CPU; compact() lets a row
// that ended leave; collect() cuts each row after its end of sequence.
TEST(Decoder, EachPartDoesItsOneThing) {
  auto model = tiny_llama();
  model->eval();
  torch::NoGradGuard no_grad;
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3, 4, 5}, {7, 8}, {9, 10, 11}};
  SamplingOptions opt;
  opt.max_new_tokens = 6;
  Decoder d(*model);
  ASSERT_EQ(d.prefill(prompts, {0, 1, 2}, opt, true), 6);
  EXPECT_EQ(d.produced(), 1);
  std::string why;
  EXPECT_FALSE(d.capture(&why));
  EXPECT_EQ(why, "not on CUDA");
  EXPECT_EQ(d.compact(), 3);
  d.step();
  EXPECT_EQ(d.produced(), 2);
  const auto two = d.collect();
  ASSERT_EQ(two.tokens.size(), 3u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(two.tokens[i].size(), 2u);
    auto lp = forward_logps(*model, prompts[i]);
    EXPECT_EQ(two.tokens[i][0], lp[-1].argmax().item<int64_t>()) << i;
    EXPECT_NEAR(two.logprobs[i][0], lp[-1][two.tokens[i][0]].item<double>(), 1e-5) << i;
    auto longer = prompts[i];
    longer.push_back(two.tokens[i][0]);
    lp = forward_logps(*model, longer);
    EXPECT_EQ(two.tokens[i][1], lp[-1].argmax().item<int64_t>()) << i;
    EXPECT_NEAR(two.logprobs[i][1], lp[-1][two.tokens[i][1]].item<double>(), 1e-5) << i;
  }
  EXPECT_EQ(d.produced(), 0) << "collect ends the batch";

  // A row whose first token is the end of sequence leaves at the first compact(); the others decode on
  // as they do without it, and collect() cuts the ended row after that token.
  const auto whole = generate(*model, prompts, opt);
  auto eos = opt;
  eos.eos_id = whole[1][0];
  ASSERT_NE(whole[0][0], eos.eos_id);
  ASSERT_EQ(d.prefill(prompts, {0, 1}, eos, false), 6);
  EXPECT_EQ(d.compact(), 1);
  while (d.produced() < 6 && d.compact() > 0) d.step();
  const auto cut = d.collect();
  EXPECT_EQ(cut.tokens[1], std::vector<int64_t>{eos.eos_id});
  const auto stop = std::find(whole[0].begin(), whole[0].end(), eos.eos_id);
  EXPECT_EQ(cut.tokens[0], std::vector<int64_t>(whole[0].begin(), stop == whole[0].end() ? stop : stop + 1));
  EXPECT_TRUE(cut.logprobs.empty());

  // No room for a token: no batch.
  EXPECT_EQ(d.prefill({std::vector<int64_t>(40, 1)}, {0}, opt, false), 0);
  EXPECT_EQ(d.produced(), 0);
}

// The parts, in generate()'s order, are generate(): the same tokens and log-probs, greedy and
// sampled, with penalties, repeated prompts and an end of sequence.
TEST(Decoder, ItsPartsInOrderAreGenerate) {
  auto model = tiny_llama();
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {4, 5, 6, 7, 8}, {1, 2, 3}, {9}};
  SamplingOptions opt;
  opt.max_new_tokens = 10;
  opt.greedy = false;
  opt.top_p = 0.9;
  opt.repetition_penalty = 1.2;
  opt.frequency_penalty = 0.3;
  opt.seed = 4;
  opt.eos_id = 7;
  const auto ref = generate_with_logprobs(*model, prompts, opt);
  model->eval();
  torch::NoGradGuard no_grad;
  Decoder d(*model);
  const auto n = d.prefill(prompts, {0, 1, 2, 3}, opt, true);
  while (d.produced() < n && d.compact() > 0) d.step();
  const auto g = d.collect();
  EXPECT_EQ(g.tokens, ref.tokens);
  EXPECT_EQ(g.logprobs, ref.logprobs);
}

// A decoder that keeps its buckets refills them in place: a second call of the same shape (other
// prompts, other seeds, changed weights) gives what a fresh decoder gives; other shapes get their
// own bucket, up to max_buckets, the one used longest ago leaving first; a cast model gets a new cache.
TEST(Decoder, KeptBucketsDecodeAsFreshOnes) {
  at::manual_seed(3);
  models::gpt2::GPT2Options go;
  go.vocab_size(50).n_positions(32).n_embd(32).n_layer(2).n_head(4);
  auto gpt2 = std::make_shared<models::gpt2::GPT2LMHeadModel>(go);
  for (auto model : std::vector<std::shared_ptr<models::CausalLM>>{tiny_llama(), gpt2}) {
    SCOPED_TRACE(model->family());
    DecoderOptions keep;
    keep.keep_buckets = true;
    keep.max_buckets = 2;
    Decoder kept(*model, keep);
    SamplingOptions opt;
    opt.max_new_tokens = 8;
    opt.greedy = false;
    opt.presence_penalty = 0.4;
    const std::vector<std::vector<std::vector<int64_t>>> calls = {
        {{1, 2, 3}, {4, 5}},          // bucket (2 rows, length 3, 8 tokens)
        {{6, 7, 8}, {9, 9, 9}},       // the same bucket, unpadded now
        {{1, 2, 3}, {1, 2, 3}},       // the same bucket, one shared prefill
        {{1, 2, 3, 4}, {5}},          // a second bucket
        {{3}, {4}, {5}},              // a third: the first leaves
        {{11, 12, 13}, {14, 15, 16}}  // the first's shape again, in a new bucket
    };
    const std::vector<size_t> held = {1, 1, 1, 2, 2, 2};
    for (size_t c = 0; c < calls.size(); ++c) {
      SCOPED_TRACE(c);
      opt.seed = c;
      if (c == 2) {  // the weights change in place between calls, as an optimizer step changes them
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) p.mul_(1.01);
      }
      const auto fresh = generate_with_logprobs(*model, calls[c], opt);
      const auto g = kept.generate_with_logprobs(calls[c], opt);
      EXPECT_EQ(g.tokens, fresh.tokens);
      EXPECT_EQ(g.logprobs, fresh.logprobs);
      EXPECT_EQ(kept.buckets(), held[c]);
    }
    model->to(at::kDouble);
    const auto fresh = generate(*model, calls.back(), opt);
    EXPECT_EQ(kept.generate(calls.back(), opt), fresh);
    EXPECT_EQ(kept.replays(), 0) << "no graphs on the CPU";
    kept.clear();
    EXPECT_EQ(kept.buckets(), 0u);
  }
  // Without keep_buckets nothing outlives a call.
  auto model = tiny_llama();
  Decoder d(*model);
  SamplingOptions opt;
  d.generate({{1, 2}}, opt);
  EXPECT_EQ(d.buckets(), 0u);
}

}  // namespace
}  // namespace anvil::generation
