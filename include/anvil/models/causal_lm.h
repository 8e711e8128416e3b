#pragma once
// What every decoder-only family provides to trainers and generation.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/linear.h>

#include <ATen/core/grad_mode.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace anvil::models {

/// Per-layer attention keys/values of the tokens seen so far, (B, H_kv, S, D)
/// each. Buffers are allocated once for `reserve` positions (generation sets
/// prompt + new tokens) and written in place; without a reservation they grow
/// by doubling.
struct KVCache {
  std::vector<at::Tensor> keys;
  std::vector<at::Tensor> values;
  int64_t length = 0;   // positions already cached (same for all layers)
  int64_t reserve = 0;  // positions to allocate on first use
  /// When defined, a (T) int64 tensor on the cache's device: update() writes
  /// the new keys/values at these slots of the reserved buffers and returns the
  /// whole buffers, and the caller's attention_mask hides the slots not yet
  /// written. Positions then live on the device (CUDA-graph decode).
  at::Tensor slots;

  /// Stores the new keys/values of `layer` at [length, length + T) and returns
  /// views of everything cached for that layer, (B, H_kv, length + T, D).
  std::pair<at::Tensor, at::Tensor> update(size_t layer, const at::Tensor& k, const at::Tensor& v);
  /// Called by the model once every layer has stored its T new positions.
  void advance(int64_t t) { length += t; }
  /// Keeps only the rows in `index` (B' <= B), e.g. after finished sequences leave a batch.
  void select_rows(const at::Tensor& index);
};

/// One transformer block applied to its input, (B, T, C) -> (B, T, C). It
/// holds copies of what it needs (never references to the caller's locals), so
/// activation checkpointing may call it again during backward.
using BlockFn = std::function<at::Tensor(const at::Tensor&)>;

/// Runs block `layer` on `x` by calling `block(x)`, with whatever it needs
/// around the call: distributed sharding gathers the block's parameters,
/// activation checkpointing recomputes it in backward. Installed on a model
/// from outside (CausalLM::set_block_runner), so models know nothing of either.
using BlockRunner = std::function<at::Tensor(size_t layer, const at::Tensor& x, const BlockFn& block)>;

/// What the mixture-of-experts layers of one micro-batch's forwards record
/// for the load-balancing loss (CausalLM::take_aux_loss), and the gradient
/// that loss sends back to their routers.
struct RouterStats {
  /// False once the loss is taken: a checkpointed block run again in
  /// backward records nothing twice.
  bool open = true;
  std::vector<at::Tensor> counts;  // per MoE layer call, (E) float32: top-k choices of each expert
  std::vector<at::Tensor> probs;   // per MoE layer call, (E) float32: router probabilities summed over tokens
  at::Tensor rows;                 // () float32: the tokens counted over those calls (ForwardArgs::token_mask)
  /// (E) float32, set by take_aux_loss: d(weight * aux_loss) / d(probs[l]),
  /// the same for every layer l; each router receives it in backward.
  at::Tensor grad;
};

/// Packed rows (data.packing) as documents. On CUDA, in float16 or bfloat16
/// and without a cache, attention runs flash attention over the documents as
/// one variable-length batch of the B * T flattened tokens; elsewhere it
/// builds the block-diagonal causal mask from doc_ids, unless the caller gave
/// ForwardArgs::attention_mask. Each id must cover one run of a row's tokens.
struct PackedDocuments {
  at::Tensor doc_ids;      // (B, T) int64, document number within the row (-1 = padding)
  at::Tensor cu_seqlens;   // (N + 1) int32, document i = flattened tokens [cu_seqlens[i], cu_seqlens[i + 1])
  int64_t max_seqlen = 0;  // the longest document
  bool defined() const { return doc_ids.defined(); }
};

/// A rank's share of every row under context parallelism
/// (dist.context_parallel; src/models/context_parallel.h): which positions
/// of the row it holds and how attention gathers the rest's keys and values.
class ContextShare;
class TensorParallelGroup;

/// Inputs beyond the token ids. Defaults mean: positions continue after the
/// cache, causal attention over every cached and new token.
struct ForwardArgs {
  /// (B, T) int64 positions (left-padded batches, packed documents).
  at::Tensor position_ids;
  /// (B, 1, T, S) bool, true = may attend; S = cached + new positions. It
  /// replaces the causal mask, so it must be causal itself.
  at::Tensor attention_mask;
  /// Packed documents (see PackedDocuments); on the model's device.
  PackedDocuments documents;
  KVCache* cache = nullptr;
  /// Set by CausalLM::hidden_states from the model's installed runner.
  const BlockRunner* block_runner = nullptr;
  /// Set by CausalLM::hidden_states while router statistics are recorded
  /// (begin_router_stats) and gradients are on.
  std::shared_ptr<RouterStats> router;
  /// (B, T) bool, true = a real token, false = padding. Only the router
  /// statistics of the load-balancing loss read it: padding counts neither as
  /// a choice nor as probability mass, as transformers' load_balancing_loss_func
  /// treats the model's attention_mask. Undefined = every token counts.
  at::Tensor token_mask;
  /// Set by the trainer under context parallelism: the ids are this rank's
  /// share of each row (position_ids its global positions, attention_mask
  /// (B, 1, T_share, T) when given) and attention runs over the whole row's
  /// keys and values. No cache with it.
  std::shared_ptr<const ContextShare> context;
  /// Set by CausalLM::hidden_states under sequence parallelism
  /// (CausalLM::sequence_parallel) for a forward without a cache: the blocks
  /// run on this rank's part of the `length` positions (the group's ranks
  /// split them), from block 0 to block `blocks` - 1 (layers::run_block).
  struct SequenceSplit {
    const TensorParallelGroup* group = nullptr;
    int64_t length = 0;
    int64_t blocks = 0;
  } sequence;
};

/// Token ids the model's config.json records.
struct SpecialTokens {
  int64_t bos = -1;
  int64_t eos = -1;
  int64_t pad = -1;
};

/// Where the values of a model's deferred parameters (built inside a
/// models::DeferredInitGuard, without storage) come from: a model folder's
/// safetensors, read a range at a time.
class ShardedParameters;

/// How a family initialises one parameter (transformers' _init_weights):
/// every element drawn from N(0, value) (`draws`) or set to `value`; then,
/// when zero_row >= 0, that row zeroed (a padding embedding).
struct ParameterInit {
  bool draws = false;
  double value = 0;
  int64_t zero_row = -1;
  static ParameterInit normal(double std, int64_t zero_row = -1) { return {true, std, zero_row}; }
  static ParameterInit constant(double v) { return {false, v, -1}; }
};

class ParameterSource {
 public:
  virtual ~ParameterSource() = default;
  /// Elements [begin, begin + count) of parameter `name`, flattened row-major,
  /// as a 1-D CPU tensor in any floating dtype (the stored one).
  virtual at::Tensor read(const std::string& name, int64_t begin, int64_t count) const = 0;
};

class CausalLM : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;

  /// (B, T) token ids -> (B, T, C) final (normalised) hidden states.
  at::Tensor hidden_states(const at::Tensor& input_ids, const ForwardArgs& args) {
    if (forward_begin_) forward_begin_();
    const bool route = router_stats_ && !args.router && at::GradMode::is_enabled();
    const bool split = sequence_parallel && !args.cache && !args.sequence.group;
    if ((!block_runner_ || args.block_runner) && !route && !split) return forward_hidden(input_ids, args);
    auto a = args;
    if (!a.block_runner && block_runner_) a.block_runner = &block_runner_;
    if (route) a.router = router_stats_;
    if (split) a.sequence = {sequence_parallel.get(), input_ids.size(1), num_layers()};
    return forward_hidden(input_ids, a);
  }
  /// The LM head: logits = hidden W^T + b (bias undefined when the family has none).
  struct OutputHead {
    at::Tensor weight;  // (V, C): the input embedding's when tied
    at::Tensor bias;    // (V) or undefined
  };
  virtual OutputHead output_head() = 0;
  /// cap > 0: logits become cap * tanh(logits / cap) (Gemma's
  /// final_logit_softcapping); the fused loss heads then give way to the plain one.
  virtual double final_logit_softcap() const { return 0.0; }
  /// N > 0: positions past N are encoded differently (LongRoPE's long
  /// factors), so generation recomputes the whole KV cache at the step where a
  /// sequence first grows past N tokens, as transformers' Phi-3 does; 0 = never.
  virtual int64_t cache_recompute_length() const { return 0; }
  /// (..., C) hidden states -> (..., V) logits.
  at::Tensor logits(const at::Tensor& hidden);

  /// (B, T) token ids -> (B, T, V) logits.
  at::Tensor forward(const at::Tensor& input_ids, const ForwardArgs& args) {
    return logits(hidden_states(input_ids, args));
  }
  /// With `cache`, positions continue after the cached tokens and the cache is extended.
  at::Tensor forward(const at::Tensor& input_ids, KVCache* cache = nullptr) {
    ForwardArgs args;
    args.cache = cache;
    return forward(input_ids, args);
  }

  /// Mixture-of-experts families: experts per sparse layer; 0 = a dense model.
  virtual int64_t num_experts() const { return 0; }
  /// The weight of the load-balancing loss every objective adds to its loss
  /// (0 = none): a folder's router_aux_loss_coef when its
  /// output_router_logits is true, as transformers trains it; the
  /// model.router_aux_loss_coef key sets it.
  double router_aux_loss_coef = 0.0;
  /// Starts recording the routers of the forwards with gradients that follow
  /// (a micro-batch's), for take_aux_loss.
  void begin_router_stats() { router_stats_ = std::make_shared<RouterStats>(); }
  /// Stops recording and returns the load-balancing loss of what was recorded,
  /// transformers' load_balancing_loss_func over every MoE layer call:
  /// E * sum_e (choices of e / rows) * (probability mass of e / rows), rows
  /// being the tokens counted (ForwardArgs::token_mask) times the layers, a
  /// detached float32 scalar (undefined when nothing was recorded). Its
  /// gradient, times `weight`, reaches the routers in the next backward
  /// through their layers' outputs, so it holds through activation
  /// checkpointing and sharding; add `weight * loss` to the reported loss.
  at::Tensor take_aux_loss(double weight);

  virtual std::string family() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t hidden_size() const = 0;
  virtual int64_t max_positions() const = 0;
  virtual int64_t num_layers() const = 0;

  /// Hugging Face config.json for this model (architectures, model_type, ...).
  virtual nlohmann::json hf_config() const = 0;
  /// Maps a tensor name found in an HF file to our parameter name: "" means
  /// the tensor is not a parameter here but may be skipped (tied heads, legacy
  /// buffers); a name that is neither is an error at load.
  virtual std::string checkpoint_key(const std::string& name) const { return name; }

  /// Names of the LM output head's parameters (empty when tied to the
  /// embedding); a sequence-classification folder does not store them.
  virtual std::vector<std::string> lm_head_parameters() const { return {}; }

  /// The modules LoRA adapts when lora.target_modules is empty (PEFT's
  /// default for the family where PEFT has one): last name components.
  virtual std::vector<std::string> default_lora_targets() const = 0;

  /// How parameter `name` of the family's own starts (ParameterInit). A family
  /// that says it for every parameter draws its weights at construction as
  /// models::init_parameters does (models/init.h), and a randomly initialised
  /// sharded run then builds it without storage and has each rank draw its
  /// shards of the very same weights; nullopt (a family of the user's that
  /// does not say) builds such a model whole on every rank first.
  virtual std::optional<ParameterInit> parameter_init(const std::string& /*name*/) const { return std::nullopt; }

  /// Resizes the vocabulary to `n` rows as transformers'
  /// resize_token_embeddings does: the input embedding and an untied LM head
  /// keep their first min(n, old) rows; new rows are the mean of the old ones
  /// (transformers' mean_resizing, without its 1e-9-scaled covariance noise).
  /// vocab_size() and hf_config() then report `n`.
  void resize_vocab(int64_t n);

  /// Turns the model into a reward model: a scalar head on the final hidden
  /// state, Hugging Face's `...ForSequenceClassification` "score"
  /// (Linear(C -> 1), no bias, weights ~ N(0, init_std)). Saved folders then
  /// use that layout (score.weight, no LM head). No-op when already present.
  void add_score_head(double init_std = 0.02);
  bool has_score_head() const { return !score_head_.is_empty(); }
  /// (B, T, C) hidden states and (B) positions -> (B) float32 scores read at
  /// each row's position.
  at::Tensor score(const at::Tensor& hidden, const at::Tensor& positions);
  /// (..., C) hidden states -> (...) float32 scores at every position (a
  /// separate PPO critic's per-token values).
  at::Tensor token_scores(const at::Tensor& hidden);

  /// Named heads beside the LM head, on the final hidden states: a value
  /// head (PPO, out_features 1), ILQL's Q and V heads, a user's own. A head is
  /// Linear(C -> out_features), or with `hidden_features` > 0 an MLP as trlx
  /// builds its heads: Linear(C -> hidden) -> ReLU -> Linear(hidden -> out).
  /// Weights ~ N(0, init_std), zero biases. Their parameters are
  /// "heads.<name>.weight" / ".bias" (an MLP's "heads.<name>.0.weight",
  /// "heads.<name>.2.weight", ...); a saved folder keeps them in
  /// heads.safetensors + heads.json beside the HF files, so the base model
  /// still loads in transformers as is. (A reward model's score head is HF's
  /// own sequence-classification head, above.) Throws when `name` is taken or
  /// not of a-z, 0-9 and _.
  struct HeadOptions {
    int64_t out_features = 1;
    int64_t hidden_features = 0;  // 0 = one Linear
    bool bias = true;
    double init_std = 0.02;
  };
  void add_head(const std::string& name, const HeadOptions& options);
  void add_head(const std::string& name, int64_t out_features, bool bias = true, double init_std = 0.02) {
    add_head(name, HeadOptions{out_features, 0, bias, init_std});
  }
  bool has_head(const std::string& name) const;
  /// The named heads, sorted by name.
  std::vector<std::string> head_names() const;
  /// (..., C) hidden states -> (..., out_features).
  at::Tensor head(const std::string& name, const at::Tensor& hidden);
  /// How the head was built.
  HeadOptions head_options(const std::string& name) const;

  /// Names of transformer block `i`'s parameters start with block_prefix(i)
  /// + "." (e.g. "transformer.h.3"): the units sharding and activation
  /// checkpointing apply to, i in [0, num_layers()).
  virtual std::string block_prefix(int64_t i) const = 0;

  /// Installs (or, with an empty function, removes) the wrapper every block
  /// call goes through.
  void set_block_runner(BlockRunner runner) { block_runner_ = std::move(runner); }
  /// Installs (or removes) what hidden_states() calls before each forward:
  /// sharding gathers the input embeddings there.
  void set_forward_begin(std::function<void()> f) { forward_begin_ = std::move(f); }
  /// The parameters the forward reads before the first block, every one an
  /// embedding table (whose backward reads no weight values): sharding puts
  /// them in a unit of their own, gathered for the start of a forward and
  /// freed once the first block runs, unless one is tied to the LM head.
  /// Empty: the family reads other weights there (they stay in the root).
  virtual std::vector<std::string> input_embedding_parameters() const { return {embedding_parameter()}; }

  SpecialTokens special_tokens;
  /// The values of deferred parameters (models/init.h); null once every
  /// parameter holds its own.
  std::shared_ptr<const ParameterSource> parameter_source;
  /// Set while the model's parameters are sharded (distributed::ShardedModel):
  /// what makes them whole, for whoever needs them so (generation).
  ShardedParameters* sharded_parameters = nullptr;
  /// Set by distributed::apply_tensor_parallel under dist.sequence_parallel:
  /// the tensor-parallel group whose ranks split the positions of the blocks'
  /// activations in forwards without a cache (models/tensor_parallel.h).
  std::shared_ptr<const TensorParallelGroup> sequence_parallel;
  /// Set by distributed::apply_tensor_parallel under dist.vocab_parallel: the
  /// group whose rank t holds rows [t V / T, (t + 1) V / T) of the input
  /// embedding and the LM head; logits() gathers the columns, and the fused
  /// training loss runs on each rank's (models/tensor_parallel.h).
  std::shared_ptr<const TensorParallelGroup> vocab_parallel;
  /// The input embedding's parameter name ("transformer.wte.weight").
  std::string token_embedding_parameter() const { return embedding_parameter(); }

 protected:
  /// The family's forward to the final hidden states; blocks run through
  /// layers::run_block(args, ...).
  virtual at::Tensor forward_hidden(const at::Tensor& input_ids, const ForwardArgs& args) = 0;
  /// The input embedding's parameter name ("transformer.wte.weight").
  virtual std::string embedding_parameter() const = 0;
  /// Records a new vocabulary size (resize_vocab has resized the tensors).
  virtual void set_vocab_size(int64_t n) = 0;

 private:
  BlockRunner block_runner_;
  std::function<void()> forward_begin_;
  std::shared_ptr<RouterStats> router_stats_;
  torch::nn::Linear score_head_{nullptr};
  torch::nn::ModuleDict heads_{nullptr};
  std::map<std::string, HeadOptions> head_options_;
};

/// HF's rule for the token a sequence-classification head reads: each row's
/// rightmost token that is not `pad_id` (right or left padding), (B) int64.
at::Tensor last_non_pad_index(const at::Tensor& input_ids, int64_t pad_id);

/// Parameters this process holds a part of (a fully sharded model,
/// distributed::ShardedModel), made whole on demand.
class ShardedParameters {
 public:
  virtual ~ShardedParameters() = default;
  /// Makes every parameter whole until release_full_parameters().
  virtual void gather_full_parameters() = 0;
  virtual void release_full_parameters() = 0;
  /// Bytes of parameters this process holds now.
  virtual int64_t held_parameter_bytes() const = 0;
};

/// Keeps a sharded model's parameters whole while it lives (nests; nothing
/// for a model that is not sharded). Under full_shard a block's forward is a
/// collective: hold one around work whose forwards differ between ranks
/// (generation, whose lengths do; scoring rows a rank alone has), entered
/// the same number of times on every rank. generation::generate holds one.
class WholeParameters {
 public:
  explicit WholeParameters(CausalLM& model) : sharded_(model.sharded_parameters) {
    if (sharded_) sharded_->gather_full_parameters();
  }
  ~WholeParameters() {
    if (sharded_) sharded_->release_full_parameters();
  }
  WholeParameters(const WholeParameters&) = delete;
  WholeParameters& operator=(const WholeParameters&) = delete;

 private:
  ShardedParameters* sharded_;
};

/// A model that never trains (a DPO or PPO reference, a reward model, a
/// critic's target), held for forward passes the way the run holds the
/// policy: under `dist.sharding: full_shard` each rank keeps 1/world of every
/// block and gathers a block only for its forward (the root unit, embeddings
/// and heads, stays whole); otherwise the whole model. No gradients, no
/// optimizer state. Build it with train::RunContext::freeze.
///
/// A sharded frozen model's forward is a collective: every rank runs the
/// same forwards in the same order. Where ranks do different work (an
/// evaluation split among ranks), hold gathered() around it.
class FrozenModel {
 public:
  FrozenModel() = default;
  FrozenModel(std::shared_ptr<models::CausalLM> model, std::shared_ptr<ShardedParameters> sharded);

  explicit operator bool() const { return model_ != nullptr; }
  models::CausalLM& operator*() const { return *model_; }
  models::CausalLM* operator->() const { return model_.get(); }
  bool sharded() const { return sharded_ != nullptr; }
  /// Bytes of parameters this process holds now.
  int64_t parameter_bytes() const;
  /// Frees the model.
  void reset();

  /// Keeps every parameter whole on this rank while it lives.
  class Gathered {
   public:
    explicit Gathered(ShardedParameters* s) : sharded_(s) {}
    Gathered(Gathered&& o) noexcept : sharded_(o.sharded_) { o.sharded_ = nullptr; }
    Gathered(const Gathered&) = delete;
    Gathered& operator=(const Gathered&) = delete;
    ~Gathered();

   private:
    ShardedParameters* sharded_;
  };
  [[nodiscard]] Gathered gathered();

 private:
  std::shared_ptr<models::CausalLM> model_;
  std::shared_ptr<ShardedParameters> sharded_;
};

/// How a run holds a model that never trains (train::RunContext::freeze:
/// moved to the run's device, sharded like the policy under full_shard), as
/// the layers below train/ take it (a reward model's source).
using FreezeFn = std::function<FrozenModel(std::shared_ptr<models::CausalLM>)>;

}  // namespace anvil::models
