#pragma once
// Typed run configuration. YAML is parsed once, in src/config/, into these
// structs; nothing below the config layer sees a YAML node. The sections,
// algorithms and model families that register themselves (built-in ones and
// a linking program's) are in schema.h.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "anvil/config/schema.h"

namespace anvil::config {

/// Whether the output head shares the input embedding (model.tie_word_embeddings).
enum class Tied { kAuto, kTrue, kFalse };
inline const Choices<Tied> kTied{{"auto", Tied::kAuto}, {"true", Tied::kTrue}, {"false", Tied::kFalse}};

struct ModelConfig {
  std::string family = "gpt2";
  std::string from;  // HF-layout folder to start from (weights + config.json)
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 128;
  int64_t hidden_size = 128;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t intermediate_size = 0;
  std::string hidden_act = "auto";
  double dropout = 0.0;
  double initializer_range = 0.02;
  Tied tie_word_embeddings = Tied::kAuto;
  std::string lora_from;
  /// The keys only some families read: the registered groups'
  /// (ModelKeyGroup: models/registry.h's attention, rotary, norm and expert keys,
  /// keys.get<models::RotaryKeys>()) and each family's own (OPT's layer-norm
  /// placement, projections and biases: keys.get<T>(family)).
  ModelKeys keys;

  template <class V>
  void visit(V& v) {
    v.field("family", family,
            "Model family: one of the model registry's (src/models/registry.cpp), e.g. qwen2 for Qwen2 / "
            "Qwen2.5, gemma3_text for Gemma 3's text model, neox for GPT-NeoX / Pythia, opt for OPT / "
            "Galactica. docs/models.md lists them with their Hugging Face model_type.",
            one_of(model_family_names()));
    v.field("from", from,
            "HF-layout folder (config.json + model.safetensors, e.g. an Anvil checkpoint or a downloaded "
            "Hugging Face model) to initialise from, or a Hugging Face model id (owner/name[@revision]) read "
            "from the local Hugging Face cache. Its config.json then defines the model: the shape keys below "
            "may not be set.");
    v.field("vocab_size", vocab_size, "Vocabulary size; 0 = the tokenizer's.", non_negative());
    v.field("max_position_embeddings", max_position_embeddings, "Longest sequence the model accepts.", positive());
    v.field("hidden_size", hidden_size, "Width of the residual stream (GPT-2 n_embd).", positive());
    v.field("num_hidden_layers", num_hidden_layers, "Transformer blocks (GPT-2 n_layer).",
            renamed_from("num_layers", positive()));
    v.field("num_attention_heads", num_attention_heads, "Attention (query) heads; must divide hidden_size.",
            renamed_from("num_heads", positive()));
    v.field("intermediate_size", intermediate_size,
            "MLP width; 0 = the family's default (gpt2, neox: 4 * hidden_size; llama: 8/3 * hidden_size "
            "rounded up to a multiple of 256).",
            non_negative());
    v.field("hidden_act", hidden_act,
            "MLP activation by its HF name; auto = the family's (gpt2: gelu_new, llama: silu, neox: gelu). "
            "GPT-2 supports only gelu_new.",
            renamed_from("activation", one_of({"auto", "gelu", "gelu_new", "gelu_pytorch_tanh", "silu", "relu"})));
    v.field("dropout", dropout, "Dropout on embeddings, attention and residuals (GPT-2 *_pdrop).",
            in_open_unit_interval());
    v.field("initializer_range", initializer_range,
            "Std of the normal init (0.02, transformers' default for every family).", positive());
    enum_field(v, "tie_word_embeddings", tie_word_embeddings,
               "Output head shares the input embedding: true, false, or auto (gpt2: true, llama and neox: "
               "false). GPT-2 is always tied.",
               kTied, renamed_from("tie_embeddings", kTied.rule()));
    v.field("lora_from", lora_from,
            "PEFT adapter folder (adapter_config.json + adapter_model.safetensors, e.g. a LoRA run's "
            "checkpoint) to continue training from: its r, alpha, dropout and target_modules replace the lora "
            "section's, and its weights the new adapter's. Needs model.from (the adapter's base).");
    // The keys only some families read: the groups', then each family's own.
    for (const auto& g : model_key_groups()) {
      detail::ExtensionShim shim{keys.at(g.name)};
      shim.visit(v);
    }
    for (const auto& f : model_families())
      if (f.own_keys) {
        detail::ExtensionShim shim{keys.at(f.name)};
        shim.visit(v);
      }
  }
};

/// LoRA (Hu et al. 2021) adapters, as PEFT's LoraConfig: W x + (alpha / r) B A dropout(x) on the target
/// linear layers, with A ~ kaiming-uniform and B = 0. Only the adapters (and a reward model's score head,
/// ILQL's and PPO's heads) train. docs/lora.md.
struct LoraConfig {
  int64_t r = 0;
  double alpha = 16;
  double dropout = 0;
  std::vector<std::string> target_modules;

  template <class V>
  void visit(V& v) {
    v.field("r", r, "Adapter rank; 0 = no LoRA (every weight trains).", non_negative());
    v.field("alpha", alpha, "Scaling numerator: the update is (alpha / r) B A x (PEFT's lora_alpha).", positive());
    v.field("dropout", dropout, "Dropout on the adapter's input while training (PEFT's lora_dropout).",
            in_open_unit_interval());
    v.field("target_modules", target_modules,
            "Linear layers that get adapters, by the last part of their HF name (e.g. [q_proj, v_proj]), or "
            "[all-linear] for every linear layer of the blocks. Empty = PEFT's default for the family (gpt2: "
            "c_attn; llama, opt: q_proj, v_proj; neox: query_key_value). A name the model does not have is an "
            "error listing the ones it has.");
  }
};

/// How tokenizer.path is read (tokenizer.type).
enum class TokenizerType { kAuto, kHf, kSentencepiece };
inline const Choices<TokenizerType> kTokenizerTypes{
    {"auto", TokenizerType::kAuto}, {"hf", TokenizerType::kHf}, {"sentencepiece", TokenizerType::kSentencepiece}};

struct TokenizerConfig {
  TokenizerType type = TokenizerType::kAuto;
  std::string path;
  std::vector<std::string> add_special_tokens;
  int64_t resize_to_multiple_of = 0;

  template <class V>
  void visit(V& v) {
    enum_field(v, "type", type,
               "Tokenizer kind: hf (tokenizer.json), sentencepiece (.model), or auto (a folder is searched for "
               "tokenizer.json then tokenizer.model; a .json file is hf).",
               kTokenizerTypes, kTokenizerTypes.rule());
    v.field("path", path,
            "Tokenizer file or a folder holding one (with tokenizer_config.json for BOS/EOS/PAD). Required unless "
            "model.from has one.");
    v.field("add_special_tokens", add_special_tokens,
            "Special tokens to add to the vocabulary (e.g. [\"<|prompter|>\", \"<|assistant|>\"] for the oasst "
            "format, as Open-Assistant does). The model's embedding and LM head grow to the new vocabulary as "
            "transformers' resize_token_embeddings does (new rows: the mean of the old ones).");
    v.field("resize_to_multiple_of", resize_to_multiple_of,
            "When the vocabulary grows, pad the model's embedding rows to a multiple of this (0 = exactly the "
            "tokenizer's size).",
            non_negative());
  }
};

/// The records of a dataset (data.train[i].format).
enum class DataFormat { kAuto, kSft, kPreference, kPrompts, kOfflineRl, kPretrain };
inline const Choices<DataFormat> kDataFormats{{"auto", DataFormat::kAuto},
                                              {"sft", DataFormat::kSft},
                                              {"preference", DataFormat::kPreference},
                                              {"prompts", DataFormat::kPrompts},
                                              {"offline_rl", DataFormat::kOfflineRl},
                                              {"pretrain", DataFormat::kPretrain}};

/// One dataset of a mixture (data.train[i] / data.eval[i]).
struct DatasetConfig {
  std::string path;
  DataFormat format = DataFormat::kAuto;
  double fraction = 0;
  int64_t size = 0;
  double weight = 0;
  double eval_fraction = 0;
  std::string prompt_field = "prompt";
  std::string response_field = "response";
  std::string token_dtype = "int64";

  template <class V>
  void visit(V& v) {
    v.field("path", path,
            "JSONL file; or, for format pretrain, a folder of token shards written by `anvil prepare`, a Megatron "
            "indexed dataset (PREFIX of PREFIX.bin/.idx) or a MosaicML streaming (MDS) folder (index.json + "
            "shards, uncompressed or zstd).",
            required());
    enum_field(v, "format", format,
               "Record format (docs/data.md): sft ({prompt, response} or {messages}), preference ({prompt, chosen, "
               "rejected[, margin]}), prompts ({prompt}), offline_rl ({prompt, response, reward}), pretrain (token "
               "shards). auto = a shard folder is pretrain, a file is what the algorithm reads.",
               kDataFormats, kDataFormats.rule());
    v.field("fraction", fraction,
            "Share of this dataset used per epoch, a fresh random subset every epoch (above 1 repeats it); "
            "0 = not set (1 unless size or weight is).",
            non_negative());
    v.field("size", size, "Samples drawn from this dataset per epoch, a fresh random subset every epoch; 0 = not set.",
            non_negative());
    v.field("weight", weight,
            "Sampling weight: every sample of an epoch comes from dataset i with probability weight_i / sum; an "
            "epoch is as long as all datasets together. All datasets of a list use weights or none does.",
            non_negative());
    v.field("eval_fraction", eval_fraction, "Held out of training (a fixed random subset) and added to the eval set.",
            read_if_declared(Rule{"a number in [0, 1)", [](double x) { return x >= 0 && x < 1; }, {}}));
    v.field("prompt_field", prompt_field, "JSON field holding the prompt.", read_if_declared());
    v.field("response_field", response_field, "JSON field holding the response (sft, offline_rl).", read_if_declared());
    v.field("token_dtype", token_dtype,
            "MDS folders: dtype of the token ids in a `bytes` tokens column, which stores none (llm-foundry's "
            "token_encoding_type); ndarray columns carry their own.",
            read_if_declared(one_of({"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"})));
  }
};

/// SFT conversations with several replies (data.split_turns).
enum class SplitTurns { kAuto, kNever, kAlways };
inline const Choices<SplitTurns> kSplitTurns{
    {"auto", SplitTurns::kAuto}, {"never", SplitTurns::kNever}, {"always", SplitTurns::kAlways}};
/// Samples longer than data.max_length (data.on_overflow).
enum class OnOverflow { kTruncate, kDrop };
inline const Choices<OnOverflow> kOnOverflow{{"truncate", OnOverflow::kTruncate}, {"drop", OnOverflow::kDrop}};
/// A malformed data line (data.on_error).
enum class OnError { kFail, kSkip };
inline const Choices<OnError> kOnError{{"fail", OnError::kFail}, {"skip", OnError::kSkip}};

struct DataConfig {
  std::vector<DatasetConfig> train;
  std::vector<DatasetConfig> eval;
  std::string template_name = "auto";
  SplitTurns split_turns = SplitTurns::kAuto;
  int64_t max_length = 0;
  OnOverflow on_overflow = OnOverflow::kTruncate;
  OnError on_error = OnError::kFail;
  bool packing = false;
  int64_t pad_to_multiple_of = 0;
  bool shuffle = true;

  template <class V>
  void visit(V& v) {
    v.list("train", train, "Training datasets: one or more, mixed as their fraction / size / weight say.");
    v.list("eval", eval, "Held-out datasets (same keys; fraction, size and weight are ignored).");
    v.field("template", template_name,
            "Chat format that turns prompts and messages into tokens: auto (the one recorded with the model's "
            "tokenizer: a built-in one by name, any other Jinja chat_template as hf; else plain), hf (the "
            "tokenizer's own Jinja chat_template from tokenizer_config.json, rendered as transformers' "
            "apply_chat_template does; docs/data.md), plain (turns as written, user turns ending in a newline, "
            "replies in EOS), chatml, llama3, oasst (Open-Assistant). Only assistant turns are trained; "
            "checkpoints record it as tokenizer_config.json's chat_template.",
            read_if_declared(one_of({"auto", "hf", "plain", "chatml", "llama3", "oasst"})));
    enum_field(v, "split_turns", split_turns,
               "SFT conversations with several assistant turns: never (one sample; each reply trained where the "
               "whole conversation's rendering shows it, which fails for a template that renders an earlier reply "
               "differently from the last, such as Qwen3 dropping earlier reasoning), always (one sample per "
               "assistant turn: the conversation before it rendered with the generation prompt, as the model sees "
               "it when it writes that reply, then the reply), or auto (never where the template renders earlier "
               "turns as written, always where it does not). data.packing packs the split samples into rows. "
               "docs/data.md.",
               kSplitTurns, read_if_declared(kSplitTurns.rule()));
    v.field("max_length", max_length,
            "Longest tokenized sample (prompt + response + EOS), and the row length when packing; "
            "0 = model.max_position_embeddings.",
            non_negative());
    enum_field(v, "on_overflow", on_overflow,
               "Samples longer than max_length: truncate them (from the right) or drop them; both are "
               "counted and reported.",
               kOnOverflow, read_if_declared(kOnOverflow.rule()));
    enum_field(v, "on_error", on_error,
               "A malformed line (bad JSON, missing field, wrong type): fail names file, line and field and stops; "
               "skip counts and reports such lines and goes on.",
               kOnError, read_if_declared(kOnError.rule()));
    v.field("packing", packing,
            "Pack several samples into each max_length row; positions restart and attention stops at every "
            "document boundary, so the loss equals unpacked training.",
            read_if_declared());
    v.field("pad_to_multiple_of", pad_to_multiple_of,
            "Unpacked rows: pad each micro-batch to its longest sample rounded up to this multiple (at most "
            "data.max_length), as transformers' DataCollatorWithPadding(pad_to_multiple_of); fewer distinct shapes, "
            "each of which train.cuda_graphs records once. Padding never changes the loss; 0 = the longest sample.",
            read_if_declared(non_negative()));
    v.field("shuffle", shuffle,
            "Draw the training samples in a fresh seeded order each epoch (and interleave a mixture's datasets); "
            "false = each file's own order, dataset after dataset, every epoch, as a sequential sampler does "
            "(to follow another trainer's order exactly; a list mixed by weight still picks its datasets by "
            "seeded draws).");
  }
};

/// optimizer.name.
enum class OptimizerName { kAdamW };
inline const Choices<OptimizerName> kOptimizerNames{{"adamw", OptimizerName::kAdamW}};
/// A floating dtype by its torch name: dist.param_dtype and dist.reduce_dtype (kDtypes), optimizer.state_dtype
/// (kStateDtypes).
enum class Dtype { kFloat32, kBFloat16, kFloat16 };
inline const Choices<Dtype> kDtypes{
    {"float32", Dtype::kFloat32}, {"bfloat16", Dtype::kBFloat16}, {"float16", Dtype::kFloat16}};
inline const Choices<Dtype> kStateDtypes{{"float32", Dtype::kFloat32}, {"bfloat16", Dtype::kBFloat16}};

struct OptimizerConfig {
  OptimizerName name = OptimizerName::kAdamW;
  double lr = 3e-4;
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decay_biases_and_norms = false;
  bool fused = true;
  Dtype state_dtype = Dtype::kFloat32;

  template <class V>
  void visit(V& v) {
    enum_field(v, "name", name, "Optimizer.", kOptimizerNames, kOptimizerNames.rule());
    v.field("lr", lr, "Peak learning rate.", positive());
    v.field("betas", betas, "Adam betas [beta1, beta2], each in [0, 1).", in_open_unit_interval());
    v.field("eps", eps, "Adam epsilon.", positive());
    v.field("weight_decay", weight_decay,
            "Decoupled weight decay (AdamW), applied as transformers' Trainer and TRL apply it: to every "
            "trained parameter except biases and normalization weights (get_decay_parameter_names).",
            non_negative());
    v.field("decay_biases_and_norms", decay_biases_and_norms,
            "Apply weight_decay to biases and normalization weights too (Anvil's behaviour before "
            "2026-11-26; nanoGPT-style runs that decay everything).");
    v.field("fused", fused,
            "One fused multi-tensor AdamW kernel per step (CPU and CUDA); false = torch::optim::AdamW's "
            "per-tensor ops. Same state either way, so a run may switch on resume.");
    enum_field(v, "state_dtype", state_dtype,
               "Dtype of AdamW's two moments for float32 parameters (the masters stay float32): bfloat16 halves the "
               "optimizer state (4 bytes per parameter instead of 8), computes each update in float32 and stores the "
               "moments with stochastic rounding; needs optimizer.fused. Checkpoints convert either way, so a run may "
               "switch on resume. docs/distributed.md.",
               kStateDtypes, changeable_on_resume(kStateDtypes.rule()));
  }
};

/// schedule.decay: the learning rate's shape after warmup.
enum class Decay { kCosine, kLinear, kConstant };
inline const Choices<Decay> kDecays{
    {"cosine", Decay::kCosine}, {"linear", Decay::kLinear}, {"constant", Decay::kConstant}};

struct ScheduleConfig {
  int64_t warmup_steps = 0;
  double warmup_ratio = 0.0;
  Decay decay = Decay::kCosine;
  double min_lr_ratio = 0.0;

  template <class V>
  void visit(V& v) {
    v.field("warmup_steps", warmup_steps, "Linear warmup from 0 to optimizer.lr, in optimizer steps.", non_negative());
    v.field("warmup_ratio", warmup_ratio,
            "Linear warmup as a fraction of the run: ceil(warmup_ratio * train.max_steps) steps, the run's resolved "
            "length (transformers' warmup_ratio and get_warmup_steps). 0 = schedule.warmup_steps; setting both is an "
            "error.",
            in_unit_interval());
    enum_field(v, "decay", decay, "Decay after warmup, down to min_lr_ratio * lr at train.max_steps.", kDecays,
               kDecays.rule());
    v.field("min_lr_ratio", min_lr_ratio, "Final lr as a fraction of optimizer.lr.", in_unit_interval());
  }
};

/// train.cuda_graphs: whether whole steps are recorded as CUDA graphs.
enum class CudaGraphs { kAuto, kOn, kOff };
inline const Choices<CudaGraphs> kCudaGraphs{
    {"auto", CudaGraphs::kAuto}, {"on", CudaGraphs::kOn}, {"off", CudaGraphs::kOff}};

/// train.resume: whether a run continues from its output_dir's latest checkpoint.
enum class Resume { kAuto, kNever };
inline const Choices<Resume> kResumes{{"auto", Resume::kAuto}, {"never", Resume::kNever}};

/// train.on_nonfinite: what a step whose loss or gradient norm is not finite does.
enum class OnNonfinite { kStop, kSkip };
inline const Choices<OnNonfinite> kOnNonfinite{{"stop", OnNonfinite::kStop}, {"skip", OnNonfinite::kSkip}};

struct TrainConfig {
  int64_t max_steps = 0;
  double num_train_epochs = 0;
  int64_t micro_batch_size = 8;  // kAutoMicroBatch: "auto"
  static constexpr int64_t kAutoMicroBatch = 0;
  int64_t grad_accum_steps = 1;
  int64_t global_batch_size = 0;
  bool activation_checkpointing = false;
  bool fused_loss = true;
  bool fused_kernels = true;
  bool unverified_cuda = false;
  int64_t loss_chunk_size = 0;
  bool overlap_step_reads = true;
  CudaGraphs cuda_graphs = CudaGraphs::kOff;
  double grad_clip = 1.0;
  int64_t seed = 1234;
  int64_t save_every = 0;
  int64_t eval_every = 0;
  int64_t log_every = 10;
  int64_t keep_checkpoints = 2;
  bool background_saves = true;
  std::string device = "cpu";
  bool tf32 = false;
  int64_t threads = 0;
  OnNonfinite on_nonfinite = OnNonfinite::kStop;
  int64_t max_nonfinite_in_a_row = 10;
  Resume resume = Resume::kAuto;
  std::string resume_from;
  bool allow_config_change = false;
  std::vector<int64_t> profile_steps;

  template <class V>
  void visit(V& v) {
    visit_length(v);
    visit_compute(v);
    visit_run(v);
  }
  /// The run's length and batch.
  template <class V>
  void visit_length(V& v) {
    v.field("max_steps", max_steps,
            "Optimizer steps to train for; when set (> 0) it overrides num_train_epochs, as in transformers. 0 = "
            "from num_train_epochs (one of the two is required).",
            changeable_on_resume(non_negative()));
    v.field("num_train_epochs", num_train_epochs,
            "Passes over the training data (transformers' num_train_epochs, fractions allowed), for algorithms "
            "whose steps read data.train: max_steps = ceil(num_train_epochs * steps per epoch), steps per epoch = "
            "ceil(rows of an epoch / (micro_batch_size * grad_accum_steps)), or / global_batch_size; a row is a "
            "sample, or with data.packing a packed row. Resolved once the data is loaded and logged; 0 = not set "
            "(train.max_steps counts the run). docs/config.md.",
            read_if_declared(changeable_on_resume(non_negative())));
    v.field("micro_batch_size", micro_batch_size,
            "Samples per forward/backward pass. auto (algorithms sft and pretrain): starts at one micro-batch per "
            "rank (global_batch_size / ranks) and, whenever a step runs out of device memory on any rank, halves "
            "the micro-batch and doubles the accumulation on every rank, the same math (llm-foundry's "
            "device_train_microbatch_size: auto); the value reached is logged and kept in checkpoints. "
            "docs/config.md.",
            or_word(positive(), "auto", kAutoMicroBatch));
    v.field("grad_accum_steps", grad_accum_steps,
            "Micro-batches per optimizer step, summed over all ranks (each rank runs grad_accum_steps / "
            "world_size); when global_batch_size is also set, the two must agree. The loss is normalised by the step's "
            "total "
            "number of target tokens over all ranks.",
            positive());
    v.field("global_batch_size", global_batch_size,
            "Samples per optimizer step over all ranks (the math); 0 = micro_batch_size * grad_accum_steps. "
            "Each rank accumulates global_batch_size / (micro_batch_size * world_size) micro-batches, so the "
            "same config trains the same way on 1, 2 or 8 ranks.",
            non_negative());
  }
  /// How a step computes.
  template <class V>
  void visit_compute(V& v) {
    v.field("activation_checkpointing", activation_checkpointing,
            "Recompute each transformer block in backward instead of keeping its activations (RNG state "
            "restored, so dropout matches).");
    v.field("fused_loss", fused_loss,
            "The LM head and the loss computed together, a chunk of tokens at a time, so the (batch x sequence x "
            "vocabulary) logits never exist: sft and pretrain take the gradients of the hidden states and of the "
            "head in the same pass (Liger's fused linear cross-entropy) and skip tokens without a target; dpo and "
            "ppo (all advantages) get token log-probs whose backward recomputes each chunk's logits. false = logits "
            "for the whole micro-batch. docs/algorithms.md.",
            read_if_declared());
    v.field("fused_kernels", fused_kernels,
            "Rotary embeddings, the gated MLP's act(gate) * up (silu, or GELU's tanh approximation) and "
            "LayerNorm each run as one op with its own backward (src/kernels/): on CUDA one kernel each way for "
            "rope and the gated MLP, and Anvil's LayerNorm backward, in float32, float16 and bfloat16, and there "
            "act(gate) is not kept for backward (one tokens x intermediate tensor less per layer). Results equal "
            "ATen's composition bit for bit on the CPU. false = ATen's composition. docs/algorithms.md.");
    v.field("unverified_cuda", unverified_cuda,
            "Run the CUDA paths that no GPU has run yet (docs/benchmarks.md, \"What waits for a GPU\"): "
            "train.fused_kernels' CUDA kernels (on CUDA they otherwise give way to ATen's composition), packed rows "
            "through flash attention with cumulative lengths (otherwise the block-diagonal mask), "
            "train.overlap_step_reads (otherwise each step is read at once) and batches copied through pinned "
            "memory without a wait (otherwise a plain copy). false until bench/gpu/run.sh check has passed them on "
            "a device; no effect on the CPU, where all of them run and are tested.",
            changeable_on_resume());
    v.field("loss_chunk_size", loss_chunk_size,
            "sft and pretrain, with train.fused_loss: target tokens projected to logits at a time; 0 = as few "
            "equal chunks as keep each chunk's float32 logits within 1 GiB.",
            read_if_declared(non_negative()));
    v.field("overlap_step_reads", overlap_step_reads,
            "Read each step's loss, gradient norm and metrics only once the next step is queued, with the "
            "non-finite check (train.on_nonfinite) decided on the device inside the fused AdamW step, so the host "
            "never waits for the device between steps. Applies with optimizer.fused to sft, pretrain, reward, "
            "dpo, kto and ppo without a separate critic (on several ranks the loss and stop flag are all-reduced on "
            "the device, and a stop takes "
            "one step more); other runs read each step at once. Metrics, checkpoints and results are the same "
            "either way; false reads each step at once. docs/algorithms.md.",
            changeable_on_resume());
    enum_field(v, "cuda_graphs", cuda_graphs,
               "Whole-step CUDA graphs: after 2 warm-up steps on a side stream, the first step of each new set of "
               "batch shapes (forward, backward, clipping, the non-finite skip and the fused AdamW step) is recorded, "
               "up to 8 graphs, and replayed for every later step of those shapes (pretraining windows and packed rows "
               "have one; data.pad_to_multiple_of buckets padded ones); other steps run eagerly. "
               "auto uses them where a run allows (CUDA, one process without dist.sharding, dist.param_dtype "
               "either way; train.overlap_step_reads, optimizer.fused, sft or pretrain, no mixture of experts, no "
               "activation checkpointing) and logs why not on a GPU otherwise; on makes that an error; off "
               "(the default until they have been checked on a GPU) never records. A step that cannot be recorded is "
               "logged and the run goes on eagerly. docs/algorithms.md.",
               kCudaGraphs, changeable_on_resume(kCudaGraphs.rule()));
  }
  /// Clipping, seeds, cadence, checkpoints, where it runs, resume.
  template <class V>
  void visit_run(V& v) {
    v.field("grad_clip", grad_clip, "Max global gradient L2 norm; 0 disables clipping.", non_negative());
    v.field("seed", seed, "Seed for init, data order and dropout.", non_negative());
    v.field("save_every", save_every, "Checkpoint every N steps (and always at the end); 0 = end only.",
            changeable_on_resume(non_negative()));
    v.field("eval_every", eval_every, "Evaluate every N steps (and at the end); 0 = end only.",
            changeable_on_resume(non_negative()));
    v.field("log_every", log_every, "Console progress every N steps.", changeable_on_resume(positive()));
    v.field("keep_checkpoints", keep_checkpoints, "Most recent checkpoints kept; 0 keeps all.",
            changeable_on_resume(non_negative()));
    v.field("background_saves", background_saves,
            "Write checkpoints on a background thread while training goes on: the next optimizer step waits only "
            "until the rank's weights and optimizer moments are copied to host memory, and that copy (12 bytes "
            "per trained parameter, divided by the ranks that shard them) is kept for the whole run. false "
            "writes each checkpoint at once and holds no copy, for a run whose host memory is its limit (a "
            "sharded run on CPU ranks). docs/reliability.md.",
            changeable_on_resume());
    v.field("device", device, "Device: cpu, cuda or cuda:N.", changeable_on_resume());
    v.field("tf32", tf32,
            "CUDA: float32 matmuls and convolutions on TensorFloat-32 tensor cores (PyTorch's "
            "allow_tf32 = True; ~10-bit mantissa products, float32 accumulation). No effect on the CPU or "
            "on bfloat16/float16 compute.",
            changeable_on_resume());
    v.field("threads", threads, "Intra-op CPU threads; 0 = LibTorch's default.", changeable_on_resume(non_negative()));
    enum_field(v, "on_nonfinite", on_nonfinite,
               "A step whose loss or gradient norm is NaN or infinite is never applied. stop: exit with an error "
               "naming the step and the quantity, saving nothing from it (the last checkpoint stays as it was); "
               "skip: drop the step, count it (nonfinite_steps in metrics.jsonl) and go on.",
               kOnNonfinite, kOnNonfinite.rule());
    v.field("max_nonfinite_in_a_row", max_nonfinite_in_a_row,
            "With on_nonfinite: skip, stop with an error after this many non-finite steps in a row.", positive());
    enum_field(v, "resume", resume,
               "auto: continue from output_dir's latest complete checkpoint when there is one; never: refuse to "
               "start in an output_dir that holds checkpoints.",
               kResumes, changeable_on_resume(kResumes.rule()));
    v.field("resume_from", resume_from,
            "A checkpoint folder to continue from (weights, optimizer, data position, step) instead of "
            "output_dir's latest; new checkpoints go to output_dir.",
            changeable_on_resume());
    v.field("allow_config_change", allow_config_change,
            "On resume, accept a config that differs from the checkpoint's in keys that change training (lr, "
            "data, shape, ...); the change is logged and kept in output_dir/config-history/. Without it, such a "
            "difference stops the run. The keys whose allowed column says \"may change on resume\" (the run's "
            "length, save/eval/log cadence, eval.*, logging.*, where it runs, timeouts, how many sequences are "
            "generated or scored together) may always change, each change logged.",
            changeable_on_resume());
    v.field("profile_steps", profile_steps,
            "[first, last]: record a Kineto trace (torch profiler) of optimizer steps first..last on rank 0 and "
            "write output_dir/profile/: trace.json (chrome://tracing, Perfetto), summary.json and summary.txt "
            "(wall time per step, top kernels by GPU time or top ops by self CPU time, GPU busy fraction, "
            "kernel launches and host syncs per step). A rollout or other work an iteration does before its "
            "first step counts toward that step. [] = off. docs/benchmarks.md.",
            changeable_on_resume(at_least(1, "a list [first, last] of steps >= 1")));
  }
};

/// dist.sharding: what each rank holds (docs/distributed.md).
enum class Sharding { kNoShard, kShardGradOp, kFullShard };
inline const Choices<Sharding> kShardings{
    {"no_shard", Sharding::kNoShard}, {"shard_grad_op", Sharding::kShardGradOp}, {"full_shard", Sharding::kFullShard}};
/// dist.backend: the collective library.
enum class Backend { kAuto, kNccl, kMpi };
inline const Choices<Backend> kBackends{{"auto", Backend::kAuto}, {"nccl", Backend::kNccl}, {"mpi", Backend::kMpi}};
/// dist.context_parallel_mode: how attention reaches the keys and values of the other ranks' positions.
enum class ContextParallelMode { kAllGather, kRing };
inline const Choices<ContextParallelMode> kContextParallelModes{{"allgather", ContextParallelMode::kAllGather},
                                                                {"ring", ContextParallelMode::kRing}};

struct DistConfig {
  Sharding sharding = Sharding::kNoShard;
  Backend backend = Backend::kAuto;
  double timeout_s = 600;
  Dtype param_dtype = Dtype::kFloat32;
  Dtype reduce_dtype = Dtype::kFloat32;
  bool consolidated_checkpoints = true;
  bool cpu_offload = false;
  int64_t replicate = 1;
  int64_t tensor_parallel = 1;
  int64_t context_parallel = 1;
  ContextParallelMode context_parallel_mode = ContextParallelMode::kAllGather;
  bool sequence_parallel = false;
  bool vocab_parallel = false;

  template <class V>
  void visit(V& v) {
    enum_field(v, "sharding", sharding,
               "no_shard (every rank holds everything; gradients all-reduced, like DDP), shard_grad_op (ZeRO-2: "
               "gradients and optimizer state sharded) or full_shard (ZeRO-3/FSDP: parameters too, gathered per "
               "transformer block). docs/distributed.md.",
               kShardings, changeable_on_resume(kShardings.rule()));
    enum_field(v, "backend", backend,
               "Collective library: nccl (GPUs, through c10d's ProcessGroupNCCL), mpi (CPU, OpenMPI under "
               "mpirun) or auto (nccl on cuda, else mpi).",
               kBackends, changeable_on_resume(kBackends.rule()));
    v.field("timeout_s", timeout_s,
            "A collective that has not completed after this many seconds ends the rank with an error naming "
            "the rank and the collective (a peer died or hangs).",
            changeable_on_resume(positive()));
    enum_field(v, "param_dtype", param_dtype,
               "Dtype of the parameters the forward and backward run in; master weights and optimizer state "
               "stay float32 (mixed precision when not float32).",
               kDtypes, kDtypes.rule());
    enum_field(v, "reduce_dtype", reduce_dtype, "Dtype gradients are reduced across ranks in.", kDtypes,
               kDtypes.rule());
    v.field("consolidated_checkpoints", consolidated_checkpoints,
            "Also write the float32 model in HF layout into each sharded checkpoint, so it loads in "
            "transformers as is: on several ranks one model-K-of-N.safetensors per unit (and the index), each "
            "written by the rank that owns the unit, so a rank holds about 1/W of the model while saving. Turn "
            "off to write only the shards (anvil export consolidates later).",
            changeable_on_resume());
    v.field("replicate", replicate,
            "Hybrid sharding (HSDP): the ranks form this many replica groups of world_size / replicate consecutive "
            "ranks; dist.sharding applies within a group (one node's GPUs, say) and the groups hold the same shards, "
            "their reduced gradients all-reduced across groups. 1 = shard over every rank. docs/distributed.md.",
            changeable_on_resume(positive()));
    v.field("tensor_parallel", tensor_parallel,
            "Tensor parallelism (Megatron's column/row-parallel layers): each transformer block's attention heads "
            "and MLP features are split across groups of this many consecutive ranks (one node's GPUs), and "
            "dist.sharding applies over the world / tensor_parallel ranks that hold the same shares. 1 = off. ppo: "
            "not with its rollout ranks, environment or separate critic. The checkpoints are independent of it. "
            "docs/distributed.md.",
            read_if_declared(changeable_on_resume(positive()), 1));
    v.field("context_parallel", context_parallel,
            "Context parallelism for long rows: each row's positions are cut into 2 x context_parallel chunks and "
            "rank i of a group of this many ranks (inside dist.tensor_parallel's groups) holds chunks i and "
            "2 x context_parallel - 1 - i; attention gathers the group's keys and values. Packed rows need a "
            "data.max_length that divides by 2 x context_parallel (unpacked rows are padded to it). dist.sharding "
            "applies over world / tensor_parallel ranks. 1 = off. docs/distributed.md.",
            read_if_declared(changeable_on_resume(positive()), 1));
    enum_field(v, "context_parallel_mode", context_parallel_mode,
               "With dist.context_parallel > 1: allgather (each layer gathers the group's keys and values, then "
               "attends; backward reduce-scatters their gradients: torchtitan's allgather) or ring (ring attention, "
               "Liu et al. 2023: the key/value shares pass around the group, each rank attending to one share at a "
               "time and merging the partial outputs by their log-sum-exp; backward recomputes each block and "
               "passes the key/value gradients around with them, so a rank never holds more than two shares of "
               "keys and values). The same result within float round-off. docs/distributed.md.",
               kContextParallelModes, changeable_on_resume(kContextParallelModes.rule()));
    v.field("sequence_parallel", sequence_parallel,
            "With dist.tensor_parallel > 1: sequence parallelism (Korthikanti et al. 2022, Megatron's "
            "sequence_parallel): between the column- and row-parallel layers the residual stream, its norms and "
            "their activations are split along the sequence across the tensor-parallel group (all-gather before "
            "a column-parallel layer, reduce-scatter after a row-parallel one instead of all-reduces), so each rank "
            "holds 1/tensor_parallel of them. Training and scoring forwards only (generation with a KV cache runs "
            "plain tensor parallelism). Not with MoE families. docs/distributed.md.",
            changeable_on_resume());
    v.field("vocab_parallel", vocab_parallel,
            "With dist.tensor_parallel > 1: the input embedding and the LM head are split by vocabulary rows across "
            "the tensor-parallel group (Megatron's vocab-parallel embedding and cross entropy): each rank holds "
            "vocab_size / tensor_parallel rows, and the training loss runs on each rank's logit columns a chunk of "
            "rows at a time, the row maxima, sums of exponentials and target logits reduced over the group. The "
            "vocabulary size must divide by tensor_parallel. Evaluation and generation gather the logits. "
            "docs/distributed.md.",
            read_if_declared(changeable_on_resume(), 0));
    v.field("cpu_offload", cpu_offload,
            "full_shard only: each unit's float32 master shard, its gradient and AdamW's moments live in host "
            "memory (pinned on CUDA) and the fused CPU AdamW steps them; the device keeps the dist.param_dtype "
            "shard, the gathered units and the backward's gradients. Never run on a GPU yet, so off by default. "
            "docs/distributed.md.",
            changeable_on_resume());
  }
};

struct EvalConfig {
  int64_t batch_size = 16;
  int64_t max_batches = 0;
  int64_t generate_samples = 64;
  int64_t max_new_tokens = 32;
  int64_t table_rows = 4;

  template <class V>
  void visit(V& v) {
    v.field("batch_size", batch_size, "Samples per eval forward pass, and eval prompts generated for together.",
            changeable_on_resume(positive()));
    v.field("max_batches", max_batches, "Eval-loss batches per eval; 0 = the whole eval set.",
            read_if_declared(changeable_on_resume(non_negative())));
    v.field("generate_samples", generate_samples,
            "Eval prompts answered greedily for eval/exact_match (ilql: sampled as ilql.* says); 0 disables "
            "generation.",
            read_if_declared(changeable_on_resume(non_negative()), 0));
    v.field("max_new_tokens", max_new_tokens, "Generation budget per eval prompt (ilql: ilql.max_new_tokens).",
            read_if_declared(changeable_on_resume(positive())));
    v.field("table_rows", table_rows, "Prompt / generated / reference rows printed per eval.",
            read_if_declared(changeable_on_resume(non_negative()), 0));
  }
};

struct LoggingConfig {
  std::string level = "info";
  bool tensorboard = false;
  std::string tensorboard_dir;

  template <class V>
  void visit(V& v) {
    v.field("level", level, "Console log level.", changeable_on_resume(one_of({"debug", "info", "warn", "error"})));
    v.field("tensorboard", tensorboard,
            "Also write TensorBoard event files: every scalar of metrics.jsonl under the same names, eval sample "
            "tables and the run config as text (W&B: wandb sync --sync-tensorboard).",
            changeable_on_resume());
    v.field("tensorboard_dir", tensorboard_dir, "Folder of the event files; empty = <output_dir>/tensorboard.",
            changeable_on_resume());
  }
};

struct RunConfig {
  std::string output_dir;
  std::string algorithm = "sft";
  ModelConfig model;
  TokenizerConfig tokenizer;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainConfig train;
  DistConfig dist;
  EvalConfig eval;
  LoggingConfig logging;
  LoraConfig lora;
  /// The sections objectives registered (register_section): the built-in
  /// objectives' (sft, dpo, ppo, ...) and a linking program's. Read one with
  /// extensions.get<T>(name).
  Extensions extensions;

  template <class V>
  void visit(V& v) {
    v.field("output_dir", output_dir,
            "Run folder: checkpoints, metrics.jsonl and config.yaml. Re-running with the same "
            "output_dir resumes from its latest complete checkpoint.",
            changeable_on_resume(required()));
    v.field("algorithm", algorithm,
            "Training objective: one of the registered algorithms, the library's (docs/algorithms.md) or one a "
            "linking program registered (docs/library.md).",
            one_of(algorithm_names()));
    v.section("model", model, "Model architecture.");
    v.section("tokenizer", tokenizer, "Tokenizer.");
    v.section("data", data, "Datasets.");
    v.section("optimizer", optimizer, "Optimizer.");
    v.section("schedule", schedule, "Learning-rate schedule.");
    v.section("train", train, "Training loop.");
    v.section("dist", dist, "Multi-process training (docs/distributed.md).");
    v.section("eval", eval, "Evaluation.");
    v.section("logging", logging, "Logging.");
    v.section("lora", lora, "LoRA adapters: train a few low-rank matrices instead of every weight (docs/lora.md).");
    for (const auto& s : registered_sections()) {
      detail::ExtensionShim shim{extensions.at(s)};
      v.section(s.name.c_str(), shim, s.doc.c_str());
    }
  }
};

template <class T>
void register_section(const std::string& name, const std::string& doc, const std::string& algorithm,
                      std::function<void(const T& section, const RunConfig& cfg, const Checks& checks)> check,
                      std::vector<std::pair<std::string, std::string>> foreign_names) {
  RegisteredSection s{name, doc, [] { return std::unique_ptr<Extension>(std::make_unique<ExtensionOf<T>>()); },
                      algorithm};
  if (check)
    s.check = [name, check](const RunConfig& cfg, const Checks& checks) {
      check(cfg.extensions.get<T>(name), cfg, checks);
    };
  s.foreign_names = std::move(foreign_names);
  register_section(std::move(s));
}

/// Where each config value came from, for messages that point at it.
class ConfigSources;

/// Loads, merges (later wins) and validates config files and `key.path=value`
/// overrides. Throws ConfigError naming file:line, the key and what was
/// expected, before any work starts.
RunConfig load_config(const std::vector<std::string>& files, const std::vector<std::string>& overrides);

/// The resolved config as YAML (every key, defaults included).
std::string to_yaml(RunConfig cfg);

/// Markdown reference of every key: type, default, allowed values, doc.
std::string reference_markdown();

/// A key whose value differs between two configs (values as YAML text).
struct ConfigChange {
  std::string key, before, after;
};

/// The keys that differ between two config.yaml texts (to_yaml's output, a
/// saved run's or a checkpoint's config.yaml). A key absent on one side (a
/// config from an older version) counts as changed. Throws ConfigError if
/// either text is not YAML.
std::vector<ConfigChange> config_changes(const std::string& before_yaml, const std::string& after_yaml);

/// Whether `key` (as config_changes names it) may change when a run resumes
/// without allow_config_change: a key whose rule is changeable_on_resume,
/// one that extends, observes or says how a run executes (max_steps, the
/// save, eval and log cadence, eval.*, logging.*, the resume keys, device,
/// sharding strategy, a registered section's timeouts); a list item's key
/// (ppo.rewards[1].timeout_s) by its item's rule.
bool may_change_on_resume(const std::string& key);

}  // namespace anvil::config
