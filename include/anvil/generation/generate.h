#pragma once
// Autoregressive decoding with a KV cache, many prompts at once.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "anvil/models/causal_lm.h"

namespace anvil::generation {

/// Reshapes next-token scores before a token is chosen (transformers'
/// LogitsProcessor): gets the (B, V) float scores of the rows still decoding
/// (on the model's device), each row's prompt index and the tokens each row
/// produced so far; returns the scores to choose from (e.g. -inf for banned
/// tokens). A processor makes every step copy the tokens to the host: the fast
/// path has none.
using LogitsProcessor = std::function<at::Tensor(const at::Tensor& scores, const std::vector<int64_t>& prompt_index,
                                                 const std::vector<std::vector<int64_t>>& produced)>;

/// How a row's next token is chosen from its (V) scores.
struct WarpOptions {
  double temperature = 1.0;
  int64_t top_k = 0;                // 0 = off
  double top_p = 1.0;               // 1 = off
  double min_p = 0.0;               // 0 = off
  double repetition_penalty = 1.0;  // 1 = off; prompt and produced tokens (transformers)
  double presence_penalty = 0.0;    // 0 = off; produced tokens (OpenAI, vLLM)
  double frequency_penalty = 0.0;   // 0 = off; produced tokens, per occurrence (OpenAI, vLLM)
};

/// Whether decode steps are captured in a CUDA graph and replayed.
enum class CudaGraphs { kAuto, kOn, kOff };

/// Sampling is on the model's device: penalties, then the logits processors,
/// then (when sampling) temperature, top-k, top-p and min-p (transformers'
/// order), then a draw (inverse CDF) from a counter-based generator keyed by
/// (row seed, step): a row's tokens depend on its seed and its scores alone,
/// never on the batch it is decoded in. Greedy skips the warpers.
struct SamplingOptions : WarpOptions {
  int64_t max_new_tokens = 32;
  bool greedy = true;
  int64_t eos_id = -1;     // stop a sequence when produced (kept in its output)
  uint64_t seed = 0;       // rows without row_seeds draw from (seed, prompt index); the global RNG is never touched
  int64_t batch_size = 0;  // prompts decoded together; 0 = all
  std::vector<LogitsProcessor> logits_processors;  // applied in order, after the penalties, before the warpers
  /// Next-token scores from the model's heads rather than its LM logits alone:
  /// gets the (B, C) final hidden states at each decoding row's last position
  /// (on the model's device) and their (B, V) logits, returns (B, V) scores
  /// (ILQL's advantage-shaped sampling: log-softmax + β (min Q - V)). Applied
  /// before the logits processors.
  std::function<at::Tensor(const at::Tensor& hidden, const at::Tensor& logits)> score_fn;
  /// One sampling seed per prompt (else `seed` for the whole call): each
  /// prompt's tokens then do not depend on the batch it is decoded in.
  std::vector<uint64_t> row_seeds;
  /// Decode steps on CUDA run as one captured graph (auto: on for CUDA when
  /// nothing needs the host per step: no logits processors, no score_fn).
  CudaGraphs cuda_graphs = CudaGraphs::kAuto;
  /// Rows of a batch with the same prompt (GRPO / RLOO groups of samples)
  /// share one prefill: it runs on each distinct prompt once, and its keys
  /// and values are copied to the rows that repeat it.
  bool share_prefixes = true;
};

/// New tokens of each prompt and each one's log-probability under the
/// distribution it was chosen from: the scores after the penalties, the logits
/// processors and the warpers (greedy: the log-softmax of the processed
/// scores). Without processors, greedy logprobs equal a forward pass's.
struct Generation {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<float>> logprobs;
};

/// Continues each prompt; returns only the new tokens of each. Prompts of
/// different lengths are left-padded into one batch (positions start at 0 for
/// every prompt, padding is masked out), decoded with a KV cache allocated once
/// for prompt + new tokens. On an accelerator, tokens, log-probs and the
/// end-of-sequence state stay on the device (finished rows are masked, and the
/// host looks every 8 steps whether all have finished); on the CPU finished
/// rows leave the batch. A reply also ends where the model's max_positions
/// do: a prompt that leaves fewer than max_new_tokens positions is decoded
/// only beside prompts of its own length, so each reply gets every position
/// its own prompt leaves (batch_size prompts at a time). The model is put in
/// eval mode for the call and restored afterwards.
std::vector<std::vector<int64_t>> generate(models::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const SamplingOptions& opt);

/// generate(), with each new token's log-probability (for RL rollouts).
Generation generate_with_logprobs(models::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                  const SamplingOptions& opt);

/// Picks the next token of each row of (B, V) logits per the options (warpers,
/// no penalties; each row's key drawn from `gen`) -> (B) int64 on the CPU.
at::Tensor sample(const at::Tensor& logits, const SamplingOptions& opt, at::Generator& gen);

/// Picks the next token from (V) logits per the options.
int64_t sample_next(const at::Tensor& logits, const SamplingOptions& opt, at::Generator& gen);

// A decoder that outlives a call: what generate() allocates for a batch (the
// KV cache, the sampling state, on CUDA the recorded decode step) belongs to a
// bucket of the decoder, and a caller that decodes again and again (PPO's
// rollouts, an evaluation, a chat) may keep the buckets between calls.

struct DecoderOptions {
  /// Keep each bucket (rows, prompt length, new tokens) between calls: its KV
  /// cache and sampling buffers are refilled in place, and on CUDA its
  /// recorded decode step is replayed rather than recorded anew while the
  /// model's parameters stay where they are. The kept cache holds its memory
  /// between calls (during training too). Off by default: replaying a kept
  /// graph has not run on a GPU yet.
  bool keep_buckets = false;
  /// Buckets kept at most; the one used longest ago goes first.
  size_t max_buckets = 4;
};

/// Decodes prompts with one model (which must outlive it). generate() is
/// generation::generate() (the same tokens and log-probs for every setting);
/// prefill(), step(), compact(), capture() and collect() are its parts for one
/// batch, in that order, callable alone (under torch::NoGradGuard with the
/// model in eval mode and whole):
///
///   Decoder d(model);
///   for (auto n = d.prefill(prompts, {0, 1}, opt, true); d.produced() < n && d.compact() > 0;) d.step();
///   auto g = d.collect();
class Decoder {
 public:
  explicit Decoder(models::CausalLM& model, DecoderOptions options = {});
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  /// generation::generate() and generate_with_logprobs() on this decoder's model.
  std::vector<std::vector<int64_t>> generate(const std::vector<std::vector<int64_t>>& prompts,
                                             const SamplingOptions& opt);
  Generation generate_with_logprobs(const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& opt);

  /// Starts a batch of `prompts[rows[0]], prompts[rows[1]], ...` (each row's
  /// sampling key from its index in `prompts`, as generate() derives it):
  /// left-pads them, runs the prefill (rows with the same prompt share one
  /// when opt.share_prefixes) and chooses each row's first token. Returns the
  /// tokens the batch may produce (max_new_tokens, or fewer where the model's
  /// positions end); 0 leaves no batch.
  int64_t prefill(const std::vector<std::vector<int64_t>>& prompts, const std::vector<size_t>& rows,
                  const SamplingOptions& opt, bool with_logprobs);
  /// Rows still decoding. On the CPU rows that produced the end of sequence
  /// leave the batch here; on an accelerator they stay (masked), and the
  /// device is asked whether all have ended only every 8 tokens.
  int64_t compact();
  /// Records the decode step as a CUDA graph for this bucket (after one eager
  /// step on a side stream, which this call runs); false, with the reason in
  /// `why`, where it cannot: not CUDA, a build without graphs, a logits
  /// processor or score_fn (they need the host each step), a model that
  /// recomputes its cache mid-batch. The batch decodes eagerly then.
  bool capture(std::string* why);
  /// Decodes one more token of every row: the bucket's graph replayed when
  /// there is one, else eagerly.
  void step();
  /// Tokens decoded so far per row, the first included.
  int64_t produced() const;
  /// Ends the batch: each row's new tokens, cut after the end of sequence,
  /// and their log-probabilities when prefill asked for them (row order).
  Generation collect();

  /// Buckets held now (between calls: 0 unless keep_buckets).
  size_t buckets() const;
  /// Recorded decode steps replayed so far (tests; 0 on the CPU).
  int64_t replays() const;
  /// Frees every bucket.
  void clear();

 private:
  struct Bucket;
  struct Batch;
  Generation run(const std::vector<std::vector<int64_t>>& prompts, const SamplingOptions& opt, bool with_logprobs);
  /// prefill's parts: the prompts left-padded, their masks and positions; the sampling state; the forward.
  void lay_out(const std::vector<std::vector<int64_t>>& prompts, const std::vector<size_t>& rows);
  void start_sampling();
  at::Tensor forward_prompts(const std::vector<std::vector<int64_t>>& prompts, const std::vector<size_t>& rows);
  void decode_step(bool in_graph);
  at::Tensor choose_next(const at::Tensor& last_hidden, const at::Tensor& col);
  Bucket& bucket_for(int64_t rows, int64_t length, int64_t steps);
  /// What a recorded decode step bakes in: the sampling settings and where the parameters and buffers are.
  std::string graph_key() const;

  models::CausalLM& model_;
  DecoderOptions options_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::unique_ptr<Batch> batch_;
  uint64_t uses_ = 0;
  int64_t replays_ = 0;
};

}  // namespace anvil::generation
