#include "anvil/generation/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "anvil/core/error.h"
#include "core/logging.h"
#include "core/step_graph.h"
#include "generation/sampling.h"

namespace anvil::generation {

namespace {

bool is_greedy(const SamplingOptions& opt) { return opt.greedy || opt.temperature <= 0; }

bool wants_penalties(const SamplingOptions& opt) {
  return opt.repetition_penalty != 1.0 || opt.presence_penalty != 0.0 || opt.frequency_penalty != 0.0;
}

/// The scores a token is chosen from: warped when sampling, as they are when greedy.
at::Tensor final_scores(const at::Tensor& scores, const SamplingOptions& opt) {
  return is_greedy(opt) ? scores : warp(scores, opt);
}

at::Tensor choose(const at::Tensor& final, const SamplingOptions& opt, const at::Tensor& keys, const at::Tensor& step) {
  return is_greedy(opt) ? final.argmax(-1) : draw(final, keys, step);
}

}  // namespace

at::Tensor sample(const at::Tensor& logits_in, const SamplingOptions& opt, at::Generator& gen) {
  const auto logits = logits_in.to(at::kFloat);
  const auto B = logits.size(0);
  std::vector<int64_t> keys(static_cast<size_t>(B));
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* g = gen.get<at::CPUGeneratorImpl>();
    for (auto& k : keys) k = static_cast<int64_t>(row_key(g->random64()));
  }
  const auto opts = at::TensorOptions().dtype(at::kLong).device(logits.device());
  return choose(final_scores(logits, opt), opt, at::tensor(keys, at::kLong).to(logits.device()), at::zeros({}, opts))
      .to(at::kCPU);
}

int64_t sample_next(const at::Tensor& logits, const SamplingOptions& opt, at::Generator& gen) {
  return sample(logits.unsqueeze(0), opt, gen)[0].item<int64_t>();
}

namespace {

constexpr int64_t kCheckEvery = 8;  // accelerator: steps between looks at the end-of-sequence state

/// Decodes one batch of prompts (prompts[b] is prompt `prompt_index[b]` of the
/// call); appends each one's new tokens to `out`, and their log-probabilities
/// to `logprobs` when given. `keys` holds each prompt's sampling key.
void generate_batch(models::CausalLM& model, const std::vector<const std::vector<int64_t>*>& prompts,
                    const SamplingOptions& opt, const std::vector<int64_t>& keys_host,
                    std::vector<std::vector<int64_t>>& out, const std::vector<size_t>& prompt_index,
                    std::vector<std::vector<float>>* logprobs) {
  const auto device = model.parameters().front().device();
  const auto B = static_cast<int64_t>(prompts.size());
  const auto V = model.vocab_size();
  int64_t L = 0;
  for (const auto* p : prompts) L = std::max<int64_t>(L, static_cast<int64_t>(p->size()));
  const int64_t steps = std::min<int64_t>(opt.max_new_tokens, model.max_positions() - L);
  if (steps <= 0) return;
  const int64_t S = L + steps;  // every position the batch will hold
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device);

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
  const bool padded = std::any_of(lengths.begin(), lengths.end(), [L](int64_t n) { return n < L; });
  auto input = at::tensor(ids, at::kLong).view({B, L}).to(device);  // (B, L)
  const auto prompt_ids = input;
  auto prompt_valid = at::tensor(valid, at::kByte).view({B, L}).to(at::kBool).to(device);
  // Which of the S key slots each row may attend to; the decoded tokens' slots are switched on as they come.
  auto key_valid = at::zeros({B, S}, prompt_valid.options());
  key_valid.narrow(1, 0, L).copy_(prompt_valid);
  auto next_pos = at::tensor(lengths, at::kLong).to(device).unsqueeze(1);  // (B, 1)

  // Where a graph can run: on CUDA, nothing per step needs the host.
  const bool host_per_step = !opt.logits_processors.empty() || static_cast<bool>(opt.score_fn);
  // A model whose positions past N are encoded differently recomputes its cache once the batch grows past N.
  const int64_t recompute_at = model.cache_recompute_length();
  const bool recomputes = recompute_at > 0 && L <= recompute_at && L + steps > recompute_at;
  const bool use_graph = device.is_cuda() && StepGraph::built() && !host_per_step && !recomputes && steps > 2 &&
                         (opt.cuda_graphs == CudaGraphs::kOn || opt.cuda_graphs == CudaGraphs::kAuto);
  if (opt.cuda_graphs == CudaGraphs::kOn && device.is_cuda() && !use_graph)
    log::warn(
        "generate: cuda_graphs on, but ",
        host_per_step ? "a logits processor or score_fn needs the host each step" : "this build has no CUDA graphs",
        "; decoding eagerly");
  // On the CPU finished rows leave the batch (a sync costs nothing there); elsewhere they are masked.
  const bool compact = device.is_cpu();

  models::KVCache cache;
  cache.reserve = S;
  models::ForwardArgs args;
  args.cache = &cache;
  args.position_ids = (prompt_valid.to(at::kLong).cumsum(1) - 1).clamp_min(0);  // (B, L)
  const auto prompt_positions = args.position_ids;
  if (padded) {
    auto causal = at::ones({L, L}, prompt_valid.options()).tril();
    // A pad query sees itself, so no attention row is empty.
    args.attention_mask = (causal & prompt_valid.view({B, 1, 1, L})) | at::eye(L, prompt_valid.options());
  }

  // Sampling state, all on the device.
  auto keys = at::tensor(keys_host, at::kLong).to(device);  // (B') each row's key
  auto step_t = at::zeros({}, long_opts);                   // the step being decoded
  at::Tensor seen, counts;                                  // (B', V) for the penalties
  if (opt.repetition_penalty != 1.0)
    seen = at::zeros({B, V}, at::TensorOptions().dtype(at::kFloat).device(device))
               .scatter_add_(1, input, prompt_valid.to(at::kFloat)) > 0;
  if (opt.presence_penalty != 0.0 || opt.frequency_penalty != 0.0)
    counts = at::zeros({B, V}, at::TensorOptions().dtype(at::kFloat).device(device));
  auto rows = at::arange(B, long_opts);  // (B') current row -> batch row
  auto tokens = at::zeros({B, steps}, long_opts);
  at::Tensor lps =
      logprobs ? at::zeros({B, steps}, at::TensorOptions().dtype(at::kFloat).device(device)) : at::Tensor();
  auto done = at::zeros({B}, at::TensorOptions().dtype(at::kBool).device(device));

  // Scores -> next token (B'), recorded at column `col` (a 0-dim device tensor) of `tokens` / `lps`.
  std::vector<int64_t> row_of(static_cast<size_t>(B));  // current row -> batch row (host, for processors)
  for (int64_t b = 0; b < B; ++b) row_of[static_cast<size_t>(b)] = b;
  auto choose_next = [&](const at::Tensor& last_hidden, const at::Tensor& col) {
    auto logits = model.logits(last_hidden);
    auto scores = opt.score_fn ? opt.score_fn(last_hidden, logits) : logits;
    TORCH_CHECK(scores.dim() == 2 && scores.size(0) == last_hidden.size(0),
                "score_fn must return (rows, vocab) scores");
    scores = scores.to(device, at::kFloat);
    if (wants_penalties(opt)) scores = apply_penalties(scores, seen, counts, opt);
    if (!opt.logits_processors.empty()) {
      std::vector<int64_t> index;
      std::vector<std::vector<int64_t>> so_far;
      const auto n = step_t.item<int64_t>();
      const auto done_cols = tokens.index_select(0, rows).narrow(1, 0, n).to(at::kCPU).contiguous();
      for (size_t r = 0; r < row_of.size(); ++r) {
        index.push_back(static_cast<int64_t>(prompt_index[static_cast<size_t>(row_of[r])]));
        const auto* p = done_cols.data_ptr<int64_t>() + static_cast<int64_t>(r) * n;
        so_far.emplace_back(p, p + n);
      }
      for (const auto& process : opt.logits_processors) {
        scores = process(scores, index, so_far);
        TORCH_CHECK(scores.dim() == 2 && scores.size(0) == static_cast<int64_t>(row_of.size()),
                    "a logits processor must return (rows, vocab) scores");
        scores = scores.to(device, at::kFloat);
      }
    }
    const auto final = final_scores(scores, opt);
    auto next = choose(final, opt, keys, step_t);  // (B')
    auto col_index = col.view({1}).expand({next.size(0)});
    tokens.index_put_({rows, col_index}, next);
    if (logprobs) lps.index_put_({rows, col_index}, final.log_softmax(-1).gather(-1, next.unsqueeze(-1)).squeeze(-1));
    if (opt.eos_id >= 0) done.index_put_({rows}, done.index_select(0, rows) | (next == opt.eos_id));
    if (seen.defined()) seen.scatter_(1, next.unsqueeze(1), true);
    if (counts.defined()) counts.scatter_add_(1, next.unsqueeze(1), at::ones_like(next, counts.options()).unsqueeze(1));
    return next;
  };

  // Prefill, and the first new token. Rows with the same prompt (a GRPO or RLOO group) share one
  // prefill: the first such row's keys and values are copied to the others.
  std::vector<int64_t> firsts, source(static_cast<size_t>(B));  // unique rows; row -> its unique row
  {
    std::map<std::vector<int64_t>, int64_t> index_of;
    for (int64_t b = 0; b < B; ++b) {
      const auto [it, fresh] = index_of.emplace(*prompts[static_cast<size_t>(b)], static_cast<int64_t>(firsts.size()));
      if (fresh) firsts.push_back(b);
      source[static_cast<size_t>(b)] = it->second;
    }
  }
  at::Tensor last;
  if (opt.share_prefixes && static_cast<int64_t>(firsts.size()) < B) {
    const auto unique = at::tensor(firsts, at::kLong).to(device);
    auto once = args;
    once.position_ids = args.position_ids.index_select(0, unique);
    if (padded) once.attention_mask = args.attention_mask.index_select(0, unique);
    const auto to_rows = at::tensor(source, at::kLong).to(device);
    last = model.hidden_states(input.index_select(0, unique), once).select(1, -1).index_select(0, to_rows);
    cache.select_rows(to_rows);
  } else {
    last = model.hidden_states(input, args).select(1, -1);
  }
  // `next` is a fixed buffer: a captured step reads and refills it.
  auto next = choose_next(last, step_t);
  int64_t taken = 1;  // tokens produced so far; the last of them is the next step's input

  // One decode step: the last token in, the next token out, everything on the device. Captured
  // (`in_graph`), the cache writes at a device-computed slot and attention runs over all S slots
  // under the key mask; eagerly, the slot is `taken - 1` past the prompt and known on the host.
  auto decode_step = [&](bool in_graph) {
    input = next.unsqueeze(1);  // (B', 1)
    args.position_ids = next_pos;
    if (in_graph) {
      cache.slots = (step_t + L).view({1});
      key_valid.index_fill_(1, cache.slots, true);
      args.attention_mask = key_valid.view({key_valid.size(0), 1, 1, S});
    } else {
      const int64_t keys_now = L + taken;  // prompt, the tokens before the input, and the input
      key_valid.select(1, keys_now - 1).fill_(true);
      args.attention_mask =
          padded ? key_valid.narrow(1, 0, keys_now).view({key_valid.size(0), 1, 1, keys_now}) : at::Tensor();
    }
    step_t.add_(1);
    at::Tensor last;
    if (!in_graph && recomputes && L + taken == recompute_at + 1) {
      // The batch just grew past the model's switch length (Phi-3's LongRoPE): like transformers, drop the
      // cache and run the whole sequence, prompt and tokens so far, once more.
      const auto n = L + taken;
      const auto gen = tokens.index_select(0, rows).narrow(1, 0, taken);  // its last column is `next`
      const auto full = at::cat({prompt_ids.index_select(0, rows), gen}, 1);
      models::ForwardArgs again;
      again.cache = &cache;
      again.position_ids = at::cat(
          {prompt_positions.index_select(0, rows), next_pos - (taken - 1) + at::arange(taken, long_opts).unsqueeze(0)},
          1);
      if (padded) {
        const auto kv = key_valid.narrow(1, 0, n);
        const auto eye = at::eye(n, kv.options());
        again.attention_mask = (at::ones({n, n}, kv.options()).tril() & kv.view({kv.size(0), 1, 1, n})) | eye;
      }
      cache.keys.clear();
      cache.values.clear();
      cache.length = 0;
      last = model.hidden_states(full, again).select(1, -1);
    } else {
      last = model.hidden_states(input, args).select(1, -1);
    }
    next_pos.add_(1);
    next.copy_(choose_next(last, step_t));
  };

  std::unique_ptr<SideStream> side;
  std::unique_ptr<StepGraph> graph;
  bool try_graph = use_graph;
  for (; taken < steps; ++taken) {
    if (compact) {
      // Finished rows leave the batch.
      const auto still = (~done.index_select(0, rows)).nonzero().squeeze(1);
      if (still.size(0) == 0) break;
      if (still.size(0) != rows.size(0)) {
        cache.select_rows(still);
        rows = rows.index_select(0, still);
        key_valid = key_valid.index_select(0, still);
        next = next.index_select(0, still);
        next_pos = next_pos.index_select(0, still);
        keys = keys.index_select(0, still);
        if (seen.defined()) seen = seen.index_select(0, still);
        if (counts.defined()) counts = counts.index_select(0, still);
        std::vector<int64_t> kept;
        const auto* s = still.data_ptr<int64_t>();
        for (int64_t i = 0; i < still.size(0); ++i) kept.push_back(row_of[static_cast<size_t>(s[i])]);
        row_of = std::move(kept);
      }
    } else if (opt.eos_id >= 0 && taken % kCheckEvery == 0 && done.all().item<bool>()) {
      break;
    }
    if (try_graph && !side) {
      // One eager step on the capture stream first: handles and workspaces exist before the capture.
      side = std::make_unique<SideStream>(device);
      decode_step(false);
      continue;
    }
    if (try_graph) {
      try_graph = false;
      graph = std::make_unique<StepGraph>();
      const auto length = cache.length;
      std::string why;
      const bool captured = graph->capture([&] { decode_step(true); }, &why);
      cache.length = length + 1;  // the captured step's position (its kernels have not run yet)
      if (!captured) {
        log::warn("generate: the decode step could not be captured in a CUDA graph (", why, "); decoding eagerly");
        graph.reset();
        side.reset();
        cache.slots = at::Tensor();
        cache.length = length;
        args.attention_mask = at::Tensor();
      }
    }
    if (graph)
      graph->replay();
    else
      decode_step(false);
  }
  side.reset();  // the default stream waits for the decode

  const auto tok = tokens.narrow(1, 0, taken).to(at::kCPU).contiguous();
  const auto lp = logprobs ? lps.narrow(1, 0, taken).to(at::kCPU).contiguous() : at::Tensor();
  for (int64_t b = 0; b < B; ++b) {
    const auto* t = tok.data_ptr<int64_t>() + b * taken;
    int64_t n = taken;
    if (opt.eos_id >= 0)
      for (int64_t i = 0; i < taken; ++i)
        if (t[i] == opt.eos_id) {
          n = i + 1;
          break;
        }
    out.emplace_back(t, t + n);
    if (logprobs) {
      const auto* l = lp.data_ptr<float>() + b * taken;
      logprobs->emplace_back(l, l + n);
    }
  }
}

/// The prompts (by index, in order) that may be decoded together. A batch
/// decodes as many steps as its longest prompt leaves positions for, so a
/// prompt whose reply may reach the model's last position (prompt +
/// max_new_tokens > positions) is batched only with prompts of its own
/// length: beside a longer one its reply would be cut short. Every other
/// prompt has room for max_new_tokens in any batch.
std::vector<std::vector<size_t>> batches_by_room(const std::vector<std::vector<int64_t>>& prompts,
                                                 int64_t max_new_tokens, int64_t positions) {
  std::vector<size_t> roomy;
  std::map<size_t, std::vector<size_t>> by_length;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto n = prompts[i].size();
    if (static_cast<int64_t>(n) + max_new_tokens <= positions)
      roomy.push_back(i);
    else
      by_length[n].push_back(i);
  }
  std::vector<std::vector<size_t>> out;
  if (!roomy.empty()) out.push_back(std::move(roomy));
  for (auto& [n, rows] : by_length) out.push_back(std::move(rows));
  return out;
}

Generation run(models::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& opt,
               bool with_logprobs) {
  // Decoding reads every block at every token, and the ranks' lengths differ: a sharded model stays whole.
  models::WholeParameters whole(model);
  for (size_t i = 0; i < prompts.size(); ++i) {
    TORCH_CHECK(!prompts[i].empty(), "generate: empty prompt");
    // A prompt must leave room for one new token (the CLI refuses or truncates before this).
    if (static_cast<int64_t>(prompts[i].size()) >= model.max_positions())
      throw DataError(concat("generate: prompt ", i + 1, " is ", prompts[i].size(), " tokens; the model reads at most ",
                             model.max_positions(), " positions, prompt and reply together"));
  }
  if (!opt.row_seeds.empty())
    TORCH_CHECK(opt.row_seeds.size() == prompts.size(), "generate: ", opt.row_seeds.size(), " row seeds for ",
                prompts.size(), " prompts");
  const bool was_training = model.is_training();
  model.eval();
  torch::NoGradGuard no_grad;
  // Each prompt's stream: its own seed, or the call's seed and its index.
  std::vector<int64_t> keys(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    keys[i] =
        static_cast<int64_t>(opt.row_seeds.empty() ? row_key(row_key(opt.seed) ^ (i + 1)) : row_key(opt.row_seeds[i]));
  Generation g;
  g.tokens.resize(prompts.size());
  if (with_logprobs) g.logprobs.resize(prompts.size());
  const size_t batch = opt.batch_size > 0 ? static_cast<size_t>(opt.batch_size) : std::max<size_t>(prompts.size(), 1);
  for (const auto& rows : batches_by_room(prompts, opt.max_new_tokens, model.max_positions())) {
    for (size_t start = 0; start < rows.size(); start += batch) {
      const std::vector<size_t> index(rows.begin() + static_cast<std::ptrdiff_t>(start),
                                      rows.begin() + static_cast<std::ptrdiff_t>(std::min(rows.size(), start + batch)));
      std::vector<const std::vector<int64_t>*> chunk;
      std::vector<int64_t> chunk_keys;
      for (const auto i : index) chunk.push_back(&prompts[i]), chunk_keys.push_back(keys[i]);
      std::vector<std::vector<int64_t>> tokens;
      std::vector<std::vector<float>> logprobs;
      generate_batch(model, chunk, opt, chunk_keys, tokens, index, with_logprobs ? &logprobs : nullptr);
      // A batch with no budget yields nothing: its rows stay empty.
      for (size_t b = 0; b < tokens.size(); ++b) g.tokens[index[b]] = std::move(tokens[b]);
      for (size_t b = 0; b < logprobs.size(); ++b) g.logprobs[index[b]] = std::move(logprobs[b]);
    }
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
