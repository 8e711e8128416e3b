#include "anvil/generation/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>

namespace anvil::generation {

namespace {

/// The logits a token is drawn from: temperature-scaled and top-k / top-p
/// filtered when sampling, as they are when greedy. (B, V) float on the CPU.
at::Tensor final_logits(const at::Tensor& logits_in, const SamplingOptions& opt) {
  auto logits = logits_in.to(at::kCPU, at::kFloat);  // (B, V)
  if (opt.greedy || opt.temperature <= 0) return logits;
  logits = logits / opt.temperature;
  const auto V = logits.size(-1);
  if (opt.top_k > 0 && opt.top_k < V) {
    auto kth = std::get<0>(logits.topk(opt.top_k, -1)).narrow(-1, opt.top_k - 1, 1);  // (B, 1)
    logits = logits.masked_fill(logits < kth, -INFINITY);
  }
  if (opt.top_p < 1.0) {
    auto [sorted, idx] = logits.sort(/*dim=*/-1, /*descending=*/true);
    auto p = sorted.softmax(-1);
    // Drop tokens once the mass before them already reaches top_p (the first always stays).
    auto drop_sorted = (p.cumsum(-1) - p) >= opt.top_p;
    auto drop = at::zeros_like(drop_sorted).scatter(-1, idx, drop_sorted);
    logits = logits.masked_fill(drop, -INFINITY);
  }
  return logits;
}

at::Tensor choose(const at::Tensor& logits, const SamplingOptions& opt, at::Generator& gen) {
  if (opt.greedy || opt.temperature <= 0) return logits.argmax(-1);
  return at::multinomial(logits.softmax(-1), 1, /*replacement=*/false, gen).squeeze(-1);
}

/// choose(), with each row drawn from its prompt's own generator.
at::Tensor choose_rows(const at::Tensor& logits, const SamplingOptions& opt, std::vector<at::Generator>& gens,
                       const std::vector<int64_t>& prompt_of_row) {
  if (opt.greedy || opt.temperature <= 0) return logits.argmax(-1);
  const auto probs = logits.softmax(-1);
  auto out = at::empty({logits.size(0)}, at::kLong);
  for (int64_t r = 0; r < logits.size(0); ++r)
    out[r] = at::multinomial(probs[r], 1, false, gens[static_cast<size_t>(prompt_of_row[static_cast<size_t>(r)])])[0];
  return out;
}

}  // namespace

at::Tensor sample(const at::Tensor& logits_in, const SamplingOptions& opt, at::Generator& gen) {
  return choose(final_logits(logits_in, opt), opt, gen);
}

int64_t sample_next(const at::Tensor& logits, const SamplingOptions& opt, at::Generator& gen) {
  return sample(logits.unsqueeze(0), opt, gen)[0].item<int64_t>();
}

namespace {

/// Decodes one batch of prompts (the first is prompt `first` of the call);
/// appends each one's new tokens to `out`, and their log-probabilities to
/// `logprobs` when given.
void generate_batch(models::CausalLM& model, const std::vector<const std::vector<int64_t>*>& prompts,
                    const SamplingOptions& opt, at::Generator& gen, std::vector<at::Generator>& row_gens,
                    std::vector<std::vector<int64_t>>& out, size_t first, std::vector<std::vector<float>>* logprobs) {
  const auto device = model.parameters().front().device();
  const auto B = static_cast<int64_t>(prompts.size());
  int64_t L = 0;
  for (const auto* p : prompts) L = std::max<int64_t>(L, static_cast<int64_t>(p->size()));
  const int64_t steps = std::min<int64_t>(opt.max_new_tokens, model.max_positions() - L);
  if (steps <= 0) return;

  // Left-pad into (B, L); padding is never attended to.
  std::vector<int64_t> ids(static_cast<size_t>(B * L), 0);
  std::vector<int64_t> lengths(static_cast<size_t>(B));
  std::vector<uint8_t> valid(static_cast<size_t>(B * L), 0);
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = *prompts[static_cast<size_t>(b)];
    const auto n = static_cast<int64_t>(p.size());
    lengths[static_cast<size_t>(b)] = n;
    std::copy(p.begin(), p.end(), ids.begin() + b * L + (L - n));
    std::fill(valid.begin() + b * L + (L - n), valid.begin() + (b + 1) * L, 1);
  }
  auto input = at::tensor(ids, at::kLong).view({B, L}).to(device);                    // (B, L)
  auto key_valid = at::tensor(valid, at::kByte).view({B, L}).to(at::kBool).to(device);  // (B, S)
  auto next_pos = at::tensor(lengths, at::kLong).to(device).unsqueeze(1);              // (B, 1)

  models::KVCache cache;
  cache.reserve = L + steps;
  models::ForwardArgs args;
  args.cache = &cache;
  args.position_ids = (key_valid.to(at::kLong).cumsum(1) - 1).clamp_min(0);  // (B, L)
  const bool padded = std::any_of(lengths.begin(), lengths.end(), [L](int64_t n) { return n < L; });
  if (padded) {
    auto causal = at::ones({L, L}, key_valid.options()).tril();
    // A pad query sees itself, so no attention row is empty.
    args.attention_mask = (causal & key_valid.view({B, 1, 1, L})) | at::eye(L, key_valid.options());
  }

  std::vector<int64_t> row_of(static_cast<size_t>(B));  // batch row -> prompt index
  for (int64_t b = 0; b < B; ++b) row_of[static_cast<size_t>(b)] = b;
  std::vector<std::vector<int64_t>> produced(static_cast<size_t>(B));
  std::vector<std::vector<float>> produced_lp(static_cast<size_t>(B));
  for (int64_t step = 0; step < steps && !row_of.empty(); ++step) {
    const auto last = model.hidden_states(input, args).select(1, -1);  // (B', C): the last position's logits only
    auto scores = (opt.score_fn ? opt.score_fn(last, model.logits(last)) : model.logits(last)).to(at::kCPU, at::kFloat);
    TORCH_CHECK(scores.dim() == 2 && scores.size(0) == last.size(0), "score_fn must return (rows, vocab) scores");
    if (!opt.logits_processors.empty()) {
      std::vector<int64_t> index;
      std::vector<std::vector<int64_t>> so_far;
      for (auto r : row_of) {
        index.push_back(static_cast<int64_t>(first) + r);
        so_far.push_back(produced[static_cast<size_t>(r)]);
      }
      for (const auto& process : opt.logits_processors) {
        scores = process(scores, index, so_far);
        TORCH_CHECK(scores.dim() == 2 && scores.size(0) == static_cast<int64_t>(row_of.size()),
                    "a logits processor must return (rows, vocab) scores");
      }
    }
    const auto final = final_logits(scores, opt);
    at::Tensor next;  // (B')
    if (row_gens.empty()) {
      next = choose(final, opt, gen);
    } else {
      std::vector<int64_t> prompt_of_row;
      for (auto r : row_of) prompt_of_row.push_back(static_cast<int64_t>(first) + r);
      next = choose_rows(final, opt, row_gens, prompt_of_row);
    }
    at::Tensor lp;
    if (logprobs) lp = final.log_softmax(-1).gather(-1, next.unsqueeze(-1)).squeeze(-1).contiguous();
    const auto* next_ptr = next.data_ptr<int64_t>();
    std::vector<int64_t> keep;
    for (size_t r = 0; r < row_of.size(); ++r) {
      produced[static_cast<size_t>(row_of[r])].push_back(next_ptr[r]);
      if (logprobs) produced_lp[static_cast<size_t>(row_of[r])].push_back(lp.data_ptr<float>()[r]);
      if (next_ptr[r] != opt.eos_id) keep.push_back(static_cast<int64_t>(r));
    }
    if (step + 1 == steps || keep.empty()) break;
    // The new token: valid, at the next position, seeing every valid key.
    key_valid = at::cat({key_valid, at::ones({key_valid.size(0), 1}, key_valid.options())}, 1);
    input = next.to(device).unsqueeze(1);  // (B', 1)
    args.position_ids = next_pos;
    next_pos = next_pos + 1;
    if (keep.size() != row_of.size()) {  // finished sequences leave the batch
      auto index = at::tensor(keep, at::kLong).to(device);
      cache.select_rows(index);
      key_valid = key_valid.index_select(0, index);
      input = input.index_select(0, index);
      args.position_ids = args.position_ids.index_select(0, index);
      next_pos = next_pos.index_select(0, index);
      std::vector<int64_t> rows;
      for (auto r : keep) rows.push_back(row_of[static_cast<size_t>(r)]);
      row_of = std::move(rows);
    }
    if (padded) args.attention_mask = key_valid.view({key_valid.size(0), 1, 1, key_valid.size(1)});
  }
  for (auto& p : produced) out.push_back(std::move(p));
  if (logprobs)
    for (auto& p : produced_lp) logprobs->push_back(std::move(p));
}

Generation run(models::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& opt,
               bool with_logprobs) {
  for (const auto& p : prompts) TORCH_CHECK(!p.empty(), "generate: empty prompt");
  const bool was_training = model.is_training();
  model.eval();
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  std::vector<at::Generator> row_gens;
  if (!opt.row_seeds.empty()) {
    TORCH_CHECK(opt.row_seeds.size() == prompts.size(), "generate: ", opt.row_seeds.size(), " row seeds for ",
                prompts.size(), " prompts");
    for (auto seed : opt.row_seeds) row_gens.push_back(at::make_generator<at::CPUGeneratorImpl>(seed));
  }
  Generation g;
  g.tokens.reserve(prompts.size());
  const size_t batch = opt.batch_size > 0 ? static_cast<size_t>(opt.batch_size) : std::max<size_t>(prompts.size(), 1);
  for (size_t start = 0; start < prompts.size(); start += batch) {
    std::vector<const std::vector<int64_t>*> chunk;
    for (size_t i = start; i < std::min(prompts.size(), start + batch); ++i) chunk.push_back(&prompts[i]);
    const auto before = g.tokens.size();
    generate_batch(model, chunk, opt, gen, row_gens, g.tokens, start, with_logprobs ? &g.logprobs : nullptr);
    g.tokens.resize(before + chunk.size());  // a batch with no budget yields empty outputs
    if (with_logprobs) g.logprobs.resize(before + chunk.size());
  }
  if (was_training) model.train();
  return g;
}

}  // namespace

std::vector<std::vector<int64_t>> generate(models::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const SamplingOptions& opt) {
  return run(model, prompts, opt, false).tokens;
}

Generation generate_with_logprobs(models::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                  const SamplingOptions& opt) {
  return run(model, prompts, opt, true);
}

}  // namespace anvil::generation
