#include "anvil/generation/generate.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "anvil/core/error.h"
#include "core/logging.h"
#include "core/step_graph.h"
#include "generation/sampling.h"

namespace anvil::generation {

namespace {

constexpr int64_t kCheckEvery = 8;  // accelerator: tokens between looks at the end-of-sequence state

/// Prompt `i`'s sampling key: its own seed, or the call's seed and its index.
int64_t key_of(const SamplingOptions& opt, size_t i) {
  return static_cast<int64_t>(opt.row_seeds.empty() ? row_key(row_key(opt.seed) ^ (i + 1)) : row_key(opt.row_seeds[i]));
}

/// `value` written into `home` when `home` has its shape, type and device (a
/// recorded step reads `home`'s memory), else `home` becomes `value`;
/// `moved` says the latter happened.
at::Tensor& place(at::Tensor& home, const at::Tensor& value, bool& moved) {
  if (!value.defined()) {
    if (home.defined()) moved = true;
    home = at::Tensor();
  } else if (home.defined() && home.sizes() == value.sizes() && home.scalar_type() == value.scalar_type() &&
             home.device() == value.device()) {
    home.copy_(value);
  } else {
    home = value;
    moved = true;
  }
  return home;
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

}  // namespace

/// What a batch of one shape allocates, kept between calls with keep_buckets:
/// the cache and every device buffer a recorded decode step reads.
struct Decoder::Bucket {
  int64_t rows = 0, length = 0, steps = 0;
  uint64_t used = 0;
  at::ScalarType dtype = at::ScalarType::Undefined;  // the model's parameters' when the cache was made
  std::vector<at::Tensor> keys, values;              // the KV cache's buffers, (B, H_kv, S, D) per layer
  at::Tensor key_valid, next_pos, row_keys, step, seen, counts, rows_left, tokens, logprobs, done, next;
  bool moved = false;  // a buffer was allocated anew for this batch: a recorded step reads the old ones
  std::unique_ptr<StepGraph> graph;
  std::string graph_key;  // what the recorded step baked in
  int64_t stream = 0;     // the side stream it was recorded on
};

/// One batch being decoded: the working handles (compaction replaces them on
/// the CPU) and what the steps need.
struct Decoder::Batch {
  SamplingOptions opt;
  bool with_logprobs = false;
  std::vector<size_t> prompt_index;  // batch row -> the call's prompt
  int64_t B = 0, L = 0, steps = 0, S = 0;
  bool padded = false, recomputes = false, use_graph = false, compacts = false;
  int64_t recompute_at = 0;
  at::Device device = at::kCPU;
  at::Tensor prompt_ids, prompt_valid, prompt_positions;
  at::Tensor key_valid, next_pos, keys, step, seen, counts, rows, tokens, lps, done, next;
  std::vector<int64_t> row_of;  // current row -> batch row (host, for logits processors)
  models::KVCache cache;
  models::ForwardArgs args;
  int64_t taken = 0;  // tokens produced so far; the last of them is the next step's input
  Bucket* bucket = nullptr;
  std::unique_ptr<Bucket> own;  // the bucket when none is kept
  std::unique_ptr<SideStream> side;
  bool capture_tried = false;
};

Decoder::Decoder(models::CausalLM& model, DecoderOptions options) : model_(model), options_(options) {}
Decoder::~Decoder() = default;

size_t Decoder::buckets() const { return buckets_.size(); }
int64_t Decoder::replays() const { return replays_; }
void Decoder::clear() {
  batch_.reset();
  buckets_.clear();
}
int64_t Decoder::produced() const { return batch_ ? batch_->taken : 0; }

Decoder::Bucket& Decoder::bucket_for(int64_t rows, int64_t length, int64_t steps) {
  for (auto& b : buckets_)
    if (b->rows == rows && b->length == length && b->steps == steps) return *b;
  if (buckets_.size() >= std::max<size_t>(options_.max_buckets, 1)) {
    auto oldest = std::min_element(buckets_.begin(), buckets_.end(),
                                   [](const auto& a, const auto& b) { return a->used < b->used; });
    buckets_.erase(oldest);
  }
  buckets_.push_back(std::make_unique<Bucket>());
  auto& b = *buckets_.back();
  b.rows = rows, b.length = length, b.steps = steps;
  return b;
}

at::Tensor Decoder::choose_next(const at::Tensor& last_hidden, const at::Tensor& col) {
  auto& b = *batch_;
  const auto& opt = b.opt;
  auto logits = model_.logits(last_hidden);
  auto scores = opt.score_fn ? opt.score_fn(last_hidden, logits) : logits;
  TORCH_CHECK(scores.dim() == 2 && scores.size(0) == last_hidden.size(0), "score_fn must return (rows, vocab) scores");
  scores = scores.to(b.device, at::kFloat);
  if (wants_penalties(opt)) scores = apply_penalties(scores, b.seen, b.counts, opt);
  if (!opt.logits_processors.empty()) {
    std::vector<int64_t> index;
    std::vector<std::vector<int64_t>> so_far;
    const auto n = b.step.item<int64_t>();
    const auto done_cols = b.tokens.index_select(0, b.rows).narrow(1, 0, n).to(at::kCPU).contiguous();
    for (size_t r = 0; r < b.row_of.size(); ++r) {
      index.push_back(static_cast<int64_t>(b.prompt_index[static_cast<size_t>(b.row_of[r])]));
      const auto* p = done_cols.data_ptr<int64_t>() + static_cast<int64_t>(r) * n;
      so_far.emplace_back(p, p + n);
    }
    for (const auto& process : opt.logits_processors) {
      scores = process(scores, index, so_far);
      TORCH_CHECK(scores.dim() == 2 && scores.size(0) == static_cast<int64_t>(b.row_of.size()),
                  "a logits processor must return (rows, vocab) scores");
      scores = scores.to(b.device, at::kFloat);
    }
  }
  const auto final = final_scores(scores, opt);
  auto next = choose(final, opt, b.keys, b.step);  // (B')
  auto col_index = col.view({1}).expand({next.size(0)});
  b.tokens.index_put_({b.rows, col_index}, next);
  if (b.with_logprobs)
    b.lps.index_put_({b.rows, col_index}, final.log_softmax(-1).gather(-1, next.unsqueeze(-1)).squeeze(-1));
  if (opt.eos_id >= 0) b.done.index_put_({b.rows}, b.done.index_select(0, b.rows) | (next == opt.eos_id));
  if (b.seen.defined()) b.seen.scatter_(1, next.unsqueeze(1), true);
  if (b.counts.defined())
    b.counts.scatter_add_(1, next.unsqueeze(1), at::ones_like(next, b.counts.options()).unsqueeze(1));
  return next;
}

void Decoder::lay_out(const std::vector<std::vector<int64_t>>& prompts, const std::vector<size_t>& rows) {
  auto& b = *batch_;
  auto& home = *b.bucket;
  const auto& opt = b.opt;
  const auto B = b.B, L = b.L, S = b.S, steps = b.steps;
  const auto device = b.device;
  // Left-pad into (B, L); padding is never attended to.
  std::vector<int64_t> ids(static_cast<size_t>(B * L), 0);
  std::vector<int64_t> lengths(static_cast<size_t>(B));
  std::vector<uint8_t> valid(static_cast<size_t>(B * L), 0);
  for (int64_t r = 0; r < B; ++r) {
    const auto& p = prompts[rows[static_cast<size_t>(r)]];
    const auto n = static_cast<int64_t>(p.size());
    lengths[static_cast<size_t>(r)] = n;
    std::copy(p.begin(), p.end(), ids.begin() + r * L + (L - n));
    std::fill(valid.begin() + r * L + (L - n), valid.begin() + (r + 1) * L, 1);
  }
  b.padded = std::any_of(lengths.begin(), lengths.end(), [L](int64_t n) { return n < L; });
  const auto input = at::tensor(ids, at::kLong).view({B, L}).to(device);  // (B, L)
  b.prompt_ids = input;
  b.prompt_valid = at::tensor(valid, at::kByte).view({B, L}).to(at::kBool).to(device);
  const auto& prompt_valid = b.prompt_valid;
  // Which of the S key slots each row may attend to; the decoded tokens' slots are switched on as they come.
  auto key_valid = at::zeros({B, S}, prompt_valid.options());
  key_valid.narrow(1, 0, L).copy_(prompt_valid);
  b.key_valid = place(home.key_valid, key_valid, home.moved);
  b.next_pos = place(home.next_pos, at::tensor(lengths, at::kLong).to(device).unsqueeze(1), home.moved);  // (B, 1)

  // Where a graph can run: on CUDA, nothing per step needs the host.
  const bool host_per_step = !opt.logits_processors.empty() || static_cast<bool>(opt.score_fn);
  // A model whose positions past N are encoded differently recomputes its cache once the batch grows past N.
  b.recompute_at = model_.cache_recompute_length();
  b.recomputes = b.recompute_at > 0 && L <= b.recompute_at && L + steps > b.recompute_at;
  b.use_graph = device.is_cuda() && StepGraph::built() && !host_per_step && !b.recomputes && steps > 2 &&
                (opt.cuda_graphs == CudaGraphs::kOn || opt.cuda_graphs == CudaGraphs::kAuto);
  if (opt.cuda_graphs == CudaGraphs::kOn && device.is_cuda() && !b.use_graph)
    log::warn(
        "generate: cuda_graphs on, but ",
        host_per_step ? "a logits processor or score_fn needs the host each step" : "this build has no CUDA graphs",
        "; decoding eagerly");
  // On the CPU finished rows leave the batch (a sync costs nothing there); elsewhere they are masked.
  b.compacts = device.is_cpu();

  b.cache.reserve = S;
  b.cache.keys = home.keys;  // the kept buffers, refilled in place (none on a first call)
  b.cache.values = home.values;
  b.args.cache = &b.cache;
  b.args.position_ids = (prompt_valid.to(at::kLong).cumsum(1) - 1).clamp_min(0);  // (B, L)
  b.prompt_positions = b.args.position_ids;
  if (b.padded) {
    auto causal = at::ones({L, L}, prompt_valid.options()).tril();
    // A pad query sees itself, so no attention row is empty.
    b.args.attention_mask = (causal & prompt_valid.view({B, 1, 1, L})) | at::eye(L, prompt_valid.options());
  }
}

void Decoder::start_sampling() {
  auto& b = *batch_;
  auto& home = *b.bucket;
  const auto& opt = b.opt;
  const auto B = b.B, steps = b.steps, V = model_.vocab_size();
  const auto device = b.device;
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device);
  const auto& input = b.prompt_ids;
  // Sampling state, all on the device.
  std::vector<int64_t> keys_host;
  for (const auto i : b.prompt_index) keys_host.push_back(key_of(opt, i));
  b.keys = place(home.row_keys, at::tensor(keys_host, at::kLong).to(device), home.moved);  // (B') each row's key
  b.step = place(home.step, at::zeros({}, long_opts), home.moved);                         // the step being decoded
  at::Tensor seen, counts;                                                                 // (B', V) for the penalties
  if (opt.repetition_penalty != 1.0)
    seen = at::zeros({B, V}, at::TensorOptions().dtype(at::kFloat).device(device))
               .scatter_add_(1, input, b.prompt_valid.to(at::kFloat)) > 0;
  if (opt.presence_penalty != 0.0 || opt.frequency_penalty != 0.0)
    counts = at::zeros({B, V}, at::TensorOptions().dtype(at::kFloat).device(device));
  b.seen = place(home.seen, seen, home.moved);
  b.counts = place(home.counts, counts, home.moved);
  b.rows = place(home.rows_left, at::arange(B, long_opts), home.moved);  // (B') current row -> batch row
  b.tokens = place(home.tokens, at::zeros({B, steps}, long_opts), home.moved);
  b.lps = place(
      home.logprobs,
      b.with_logprobs ? at::zeros({B, steps}, at::TensorOptions().dtype(at::kFloat).device(device)) : at::Tensor(),
      home.moved);
  b.done = place(home.done, at::zeros({B}, at::TensorOptions().dtype(at::kBool).device(device)), home.moved);
  b.row_of.resize(static_cast<size_t>(B));
  for (int64_t r = 0; r < B; ++r) b.row_of[static_cast<size_t>(r)] = r;
}

at::Tensor Decoder::forward_prompts(const std::vector<std::vector<int64_t>>& prompts, const std::vector<size_t>& rows) {
  auto& b = *batch_;
  auto& home = *b.bucket;
  const auto B = b.B, S = b.S;
  const auto device = b.device;
  const auto& input = b.prompt_ids;
  // The prefill, and the first new token. Rows with the same prompt (a GRPO or RLOO group) share one
  // prefill: the first such row's keys and values are copied to the others.
  std::vector<int64_t> firsts, source(static_cast<size_t>(B));  // unique rows; row -> its unique row
  {
    std::map<std::vector<int64_t>, int64_t> index_of;
    for (int64_t r = 0; r < B; ++r) {
      const auto [it, fresh] =
          index_of.emplace(prompts[rows[static_cast<size_t>(r)]], static_cast<int64_t>(firsts.size()));
      if (fresh) firsts.push_back(r);
      source[static_cast<size_t>(r)] = it->second;
    }
  }
  at::Tensor last;
  if (b.opt.share_prefixes && static_cast<int64_t>(firsts.size()) < B) {
    const auto unique = at::tensor(firsts, at::kLong).to(device);
    models::KVCache once_cache;
    once_cache.reserve = S;
    auto once = b.args;
    once.cache = &once_cache;
    once.position_ids = b.args.position_ids.index_select(0, unique);
    if (b.padded) once.attention_mask = b.args.attention_mask.index_select(0, unique);
    const auto to_rows = at::tensor(source, at::kLong).to(device);
    last = model_.hidden_states(input.index_select(0, unique), once).select(1, -1).index_select(0, to_rows);
    // Each row's copy, into the kept buffers where they fit.
    auto spread = [&](std::vector<at::Tensor>& into, const std::vector<at::Tensor>& from) {
      into.resize(from.size());
      for (size_t i = 0; i < from.size(); ++i) {
        auto& t = into[i];
        if (t.defined() && t.size(0) == B && t.sizes().slice(1) == from[i].sizes().slice(1) &&
            t.scalar_type() == from[i].scalar_type() && t.device() == from[i].device())
          at::index_select_out(t, from[i], 0, to_rows);
        else
          t = from[i].index_select(0, to_rows);
      }
    };
    spread(b.cache.keys, once_cache.keys);
    spread(b.cache.values, once_cache.values);
    b.cache.length = once_cache.length;
  } else {
    last = model_.hidden_states(input, b.args).select(1, -1);
  }
  // The cache's buffers are the bucket's from now on (a recorded step reads them).
  for (size_t i = 0; i < b.cache.keys.size(); ++i)
    if (i >= home.keys.size() || !home.keys[i].is_same(b.cache.keys[i]) || !home.values[i].is_same(b.cache.values[i]))
      home.moved = true;
  home.keys = b.cache.keys;
  home.values = b.cache.values;
  return last;
}

int64_t Decoder::prefill(const std::vector<std::vector<int64_t>>& prompts, const std::vector<size_t>& rows,
                         const SamplingOptions& opt, bool with_logprobs) {
  batch_.reset();
  TORCH_CHECK(!rows.empty(), "Decoder::prefill: no rows");
  const auto device = model_.parameters().front().device();
  const auto B = static_cast<int64_t>(rows.size());
  int64_t L = 0;
  for (const auto i : rows) {
    TORCH_CHECK(i < prompts.size(), "Decoder::prefill: row ", i, " of ", prompts.size(), " prompts");
    TORCH_CHECK(!prompts[i].empty(), "generate: empty prompt");
    L = std::max<int64_t>(L, static_cast<int64_t>(prompts[i].size()));
  }
  if (!opt.row_seeds.empty())
    TORCH_CHECK(opt.row_seeds.size() == prompts.size(), "generate: ", opt.row_seeds.size(), " row seeds for ",
                prompts.size(), " prompts");
  const int64_t steps = std::min<int64_t>(opt.max_new_tokens, model_.max_positions() - L);
  if (steps <= 0) return 0;
  batch_ = std::make_unique<Batch>();
  auto& b = *batch_;
  b.opt = opt;
  b.with_logprobs = with_logprobs;
  b.prompt_index = rows;
  b.B = B, b.L = L, b.steps = steps, b.S = L + steps;  // S: every position the batch will hold
  b.device = device;
  if (options_.keep_buckets) {
    b.bucket = &bucket_for(B, L, steps);
  } else {
    b.own = std::make_unique<Bucket>();
    b.bucket = b.own.get();
  }
  auto& home = *b.bucket;
  home.used = ++uses_;
  home.moved = false;
  const auto dtype = model_.parameters().front().scalar_type();
  if (home.dtype != dtype) {  // the model was cast since: its cache is of another type
    home.keys.clear();
    home.values.clear();
    home.dtype = dtype;
  }

  lay_out(prompts, rows);
  start_sampling();
  const auto last = forward_prompts(prompts, rows);
  // `next` is a fixed buffer: a recorded step reads and refills it.
  b.next = place(home.next, choose_next(last, b.step), home.moved);
  b.taken = 1;

  // A recorded step stays valid while it would record the same kernels on the same memory.
  if (b.use_graph && home.graph && (home.moved || graph_key() != home.graph_key)) home.graph.reset();
  return steps;
}

std::string Decoder::graph_key() const {
  const auto& b = *batch_;
  const auto& o = b.opt;
  std::ostringstream key;
  key << b.with_logprobs << ' ' << o.greedy << ' ' << o.temperature << ' ' << o.top_k << ' ' << o.top_p << ' '
      << o.min_p << ' ' << o.repetition_penalty << ' ' << o.presence_penalty << ' ' << o.frequency_penalty << ' '
      << o.eos_id;
  for (const auto& p : model_.parameters()) key << ' ' << p.data_ptr();
  for (const auto& t : model_.buffers()) key << ' ' << t.data_ptr();  // rotary frequencies, ...
  return key.str();
}

void Decoder::decode_step(bool in_graph) {
  auto& b = *batch_;
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(b.device);
  const auto input = b.next.unsqueeze(1);  // (B', 1)
  b.args.position_ids = b.next_pos;
  if (in_graph) {
    // Recorded: the cache writes at a device-computed slot and attention runs over all S slots under the key mask.
    b.cache.slots = (b.step + b.L).view({1});
    b.key_valid.index_fill_(1, b.cache.slots, true);
    b.args.attention_mask = b.key_valid.view({b.key_valid.size(0), 1, 1, b.S});
  } else {
    // Eagerly the slot is `taken - 1` past the prompt and known on the host.
    const int64_t keys_now = b.L + b.taken;  // prompt, the tokens before the input, and the input
    b.key_valid.select(1, keys_now - 1).fill_(true);
    b.args.attention_mask =
        b.padded ? b.key_valid.narrow(1, 0, keys_now).view({b.key_valid.size(0), 1, 1, keys_now}) : at::Tensor();
  }
  b.step.add_(1);
  at::Tensor last;
  if (!in_graph && b.recomputes && b.L + b.taken == b.recompute_at + 1) {
    // The batch just grew past the model's switch length (Phi-3's LongRoPE): like transformers, drop the
    // cache and run the whole sequence, prompt and tokens so far, once more.
    const auto n = b.L + b.taken;
    const auto gen = b.tokens.index_select(0, b.rows).narrow(1, 0, b.taken);  // its last column is `next`
    const auto full = at::cat({b.prompt_ids.index_select(0, b.rows), gen}, 1);
    models::ForwardArgs again;
    again.cache = &b.cache;
    again.position_ids = at::cat({b.prompt_positions.index_select(0, b.rows),
                                  b.next_pos - (b.taken - 1) + at::arange(b.taken, long_opts).unsqueeze(0)},
                                 1);
    if (b.padded) {
      const auto kv = b.key_valid.narrow(1, 0, n);
      const auto eye = at::eye(n, kv.options());
      again.attention_mask = (at::ones({n, n}, kv.options()).tril() & kv.view({kv.size(0), 1, 1, n})) | eye;
    }
    b.cache.keys.clear();
    b.cache.values.clear();
    b.cache.length = 0;
    last = model_.hidden_states(full, again).select(1, -1);
  } else {
    last = model_.hidden_states(input, b.args).select(1, -1);
  }
  b.next_pos.add_(1);
  b.next.copy_(choose_next(last, b.step));
}

int64_t Decoder::compact() {
  TORCH_CHECK(batch_, "Decoder::compact: no batch (prefill first)");
  auto& b = *batch_;
  if (!b.compacts) {
    if (b.opt.eos_id >= 0 && b.taken % kCheckEvery == 0 && b.done.all().item<bool>()) return 0;
    return b.rows.size(0);
  }
  // Finished rows leave the batch.
  const auto still = (~b.done.index_select(0, b.rows)).nonzero().squeeze(1);
  if (still.size(0) == 0 || still.size(0) == b.rows.size(0)) return still.size(0);
  b.cache.select_rows(still);
  b.rows = b.rows.index_select(0, still);
  b.key_valid = b.key_valid.index_select(0, still);
  b.next = b.next.index_select(0, still);
  b.next_pos = b.next_pos.index_select(0, still);
  b.keys = b.keys.index_select(0, still);
  if (b.seen.defined()) b.seen = b.seen.index_select(0, still);
  if (b.counts.defined()) b.counts = b.counts.index_select(0, still);
  std::vector<int64_t> kept;
  const auto* s = still.data_ptr<int64_t>();
  for (int64_t i = 0; i < still.size(0); ++i) kept.push_back(b.row_of[static_cast<size_t>(s[i])]);
  b.row_of = std::move(kept);
  return still.size(0);
}

bool Decoder::capture(std::string* why) {
  TORCH_CHECK(batch_, "Decoder::capture: no batch (prefill first)");
  auto& b = *batch_;
  auto& home = *b.bucket;
  std::string reason;
  if (!why) why = &reason;
  if (!b.use_graph) {
    *why = !b.device.is_cuda()                     ? "not on CUDA"
           : !StepGraph::built()                   ? "this build has no CUDA graphs"
           : b.opt.cuda_graphs == CudaGraphs::kOff ? "cuda_graphs is off"
           : b.recomputes                          ? "the model recomputes its cache within this batch"
           : b.steps <= 2                          ? "too few tokens to decode"
                                                   : "a logits processor or score_fn needs the host each step";
    return false;
  }
  b.capture_tried = true;
  if (home.graph) return true;  // kept from an earlier batch of this bucket
  if (b.taken + 1 >= b.steps) {
    *why = "too few tokens left to decode";
    return false;
  }
  // One eager step on the side stream first: handles and workspaces exist before the recording.
  b.side = std::make_unique<SideStream>(b.device, &home.stream);
  decode_step(false);
  ++b.taken;
  home.graph = std::make_unique<StepGraph>();
  const auto length = b.cache.length;
  if (!home.graph->capture([&] { decode_step(true); }, why)) {
    home.graph.reset();
    b.side.reset();
    b.cache.slots = at::Tensor();
    b.cache.length = length;
    b.args.attention_mask = at::Tensor();
    return false;
  }
  b.cache.length = length + 1;  // the recorded step's position (its kernels have not run yet)
  home.graph_key = graph_key();
  return true;
}

void Decoder::step() {
  TORCH_CHECK(batch_, "Decoder::step: no batch (prefill first)");
  auto& b = *batch_;
  auto& home = *b.bucket;
  if (b.use_graph && home.graph) {
    if (!b.side) b.side = std::make_unique<SideStream>(b.device, &home.stream);
    home.graph->replay();
    ++replays_;
  } else {
    decode_step(false);
  }
  ++b.taken;
}

Generation Decoder::collect() {
  TORCH_CHECK(batch_, "Decoder::collect: no batch (prefill first)");
  auto& b = *batch_;
  b.side.reset();  // the default stream waits for the decode
  Generation g;
  const auto taken = b.taken;
  const auto tok = b.tokens.narrow(1, 0, taken).to(at::kCPU).contiguous();
  const auto lp = b.with_logprobs ? b.lps.narrow(1, 0, taken).to(at::kCPU).contiguous() : at::Tensor();
  for (int64_t r = 0; r < b.B; ++r) {
    const auto* t = tok.data_ptr<int64_t>() + r * taken;
    int64_t n = taken;
    if (b.opt.eos_id >= 0)
      for (int64_t i = 0; i < taken; ++i)
        if (t[i] == b.opt.eos_id) {
          n = i + 1;
          break;
        }
    g.tokens.emplace_back(t, t + n);
    if (b.with_logprobs) {
      const auto* l = lp.data_ptr<float>() + r * taken;
      g.logprobs.emplace_back(l, l + n);
    }
  }
  batch_.reset();
  return g;
}

Generation Decoder::run(const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& opt,
                        bool with_logprobs) {
  // Decoding reads every block at every token, and the ranks' lengths differ: a sharded model stays whole.
  models::WholeParameters whole(model_);
  for (size_t i = 0; i < prompts.size(); ++i) {
    TORCH_CHECK(!prompts[i].empty(), "generate: empty prompt");
    // A prompt must leave room for one new token (the CLI refuses or truncates before this).
    if (static_cast<int64_t>(prompts[i].size()) >= model_.max_positions())
      throw DataError(concat("generate: prompt ", i + 1, " is ", prompts[i].size(), " tokens; the model reads at most ",
                             model_.max_positions(), " positions, prompt and reply together"));
  }
  if (!opt.row_seeds.empty())
    TORCH_CHECK(opt.row_seeds.size() == prompts.size(), "generate: ", opt.row_seeds.size(), " row seeds for ",
                prompts.size(), " prompts");
  const bool was_training = model_.is_training();
  model_.eval();
  torch::NoGradGuard no_grad;
  Generation g;
  g.tokens.resize(prompts.size());
  if (with_logprobs) g.logprobs.resize(prompts.size());
  const size_t batch = opt.batch_size > 0 ? static_cast<size_t>(opt.batch_size) : std::max<size_t>(prompts.size(), 1);
  for (const auto& rows : batches_by_room(prompts, opt.max_new_tokens, model_.max_positions())) {
    for (size_t start = 0; start < rows.size(); start += batch) {
      const std::vector<size_t> index(rows.begin() + static_cast<std::ptrdiff_t>(start),
                                      rows.begin() + static_cast<std::ptrdiff_t>(std::min(rows.size(), start + batch)));
      // A batch with no room yields nothing: its rows stay empty.
      const auto steps = prefill(prompts, index, opt, with_logprobs);
      if (steps == 0) continue;
      while (produced() < steps && compact() > 0) {
        if (batch_->use_graph && !batch_->capture_tried) {
          std::string why;
          if (!capture(&why))
            log::warn("generate: the decode step could not be captured in a CUDA graph (", why, "); decoding eagerly");
        }
        step();
      }
      auto out = collect();
      for (size_t r = 0; r < out.tokens.size(); ++r) g.tokens[index[r]] = std::move(out.tokens[r]);
      for (size_t r = 0; r < out.logprobs.size(); ++r) g.logprobs[index[r]] = std::move(out.logprobs[r]);
    }
  }
  if (was_training) model_.train();
  return g;
}

std::vector<std::vector<int64_t>> Decoder::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                    const SamplingOptions& opt) {
  return run(prompts, opt, false).tokens;
}

Generation Decoder::generate_with_logprobs(const std::vector<std::vector<int64_t>>& prompts,
                                           const SamplingOptions& opt) {
  return run(prompts, opt, true);
}

}  // namespace anvil::generation
