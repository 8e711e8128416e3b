#include "anvil/train/sft.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <deque>
#include <filesystem>

#include "anvil/core/error.h"
#include "core/device.h"
#include "core/logging.h"
#include "data/token_shards.h"
#include "distributed/comm.h"
#include "distributed/context_parallel.h"
#include "models/tensor_parallel.h"
#include "anvil/generation/generate.h"
#include "anvil/checkpoint/hf_model.h"
#include "anvil/models/registry.h"
#include "models/layers.h"
#include "train/objectives/lm_data.h"
#include "train/objectives/lm_loss.h"
#include "data/datasets.h"

namespace anvil::train {

namespace {

/// Dataset `d`'s format, auto resolved: a shard folder or Megatron dataset is pretrain, a file sft.
config::DataFormat resolve_format(const config::RunConfig& cfg, const config::DatasetConfig& d, const std::string& key,
                                  LmTask task) {
  using F = config::DataFormat;
  const bool shards = std::filesystem::is_directory(d.path) || data::is_megatron_dataset(d.path);
  if (d.format == F::kAuto && !shards && task == LmTask::pretrain)
    throw ConfigError(concat(key, ".path: algorithm ", cfg.algorithm,
                             " reads token shards (a folder of anvil prepare), a "
                             "Megatron indexed dataset (PREFIX.bin + PREFIX.idx) or an MDS folder; \"",
                             d.path, "\" is none of these (convert text with anvil prepare, see docs/data.md)"));
  const auto f = d.format != F::kAuto ? d.format : shards ? F::kPretrain : F::kSft;
  if (f != F::kSft && f != F::kPretrain)
    throw ConfigError(concat(key, ".format: algorithm ", cfg.algorithm, " reads sft or pretrain data, got ",
                             config::kDataFormats.name(f)));
  if (f == F::kSft && task == LmTask::pretrain)
    throw ConfigError(
        concat(key, ".format: algorithm ", cfg.algorithm, " reads token shards (format pretrain), got sft"));
  return f;
}

std::shared_ptr<const data::LmDataset> load_one(const config::RunConfig& cfg, const config::DatasetConfig& d,
                                                const std::string& key, const tokenizer::Tokenizer& tok,
                                                const chat::ChatTemplate& chat, LmTask task) {
  if (resolve_format(cfg, d, key, task) == config::DataFormat::kPretrain) {
    const bool megatron = !std::filesystem::is_directory(d.path) && data::is_megatron_dataset(d.path);
    const bool mds = !megatron && data::is_mds_dataset(d.path);
    auto shards = megatron ? data::TokenShards::open_megatron(d.path)
                  : mds    ? data::TokenShards::open_mds(d.path, data::MdsOptions{"tokens", d.token_dtype})
                           : data::TokenShards::open(d.path);
    const bool foreign = megatron || mds;  // no vocabulary recorded: the largest id is checked
    if (!foreign) data::check_shard_tokenizer(*shards, tok, d.path);
    if (shards->vocab_size() > tok.vocab_size())
      throw DataError(concat(d.path,
                             foreign ? ": holds token ids up to " : ": shards were written with a vocabulary of ",
                             foreign ? shards->vocab_size() - 1 : shards->vocab_size(), ", the tokenizer has ",
                             tok.vocab_size(), " tokens"));
    auto ds = std::make_shared<data::PretrainDataset>(shards, cfg.data.max_length, d.path);
    log::info(d.path, ": ", ds->size(), " windows of ", cfg.data.max_length, " tokens (", shards->num_tokens(),
              " tokens, ", shards->num_docs(), " documents, ", shards->shards().size(), " shards)");
    return ds;
  }
  auto ds = std::make_shared<data::SftDataset>(data::SftDataset::load(d.path, tok, read_options(cfg, d, chat)));
  const auto& s = ds->stats();
  log::info(d.path, ": ", ds->size(), " samples (", s.summary(), ")");
  for (const auto& e : s.first_errors) log::warn("skipped: ", e);
  return ds;
}

}  // namespace

at::Tensor causal_lm_loss_sum(const at::Tensor& logits, const at::Tensor& labels) {
  const auto V = logits.size(-1);
  auto shift_logits = logits.narrow(1, 0, logits.size(1) - 1).reshape({-1, V}).to(at::kFloat);  // (B*(T-1), V)
  auto shift_labels = labels.narrow(1, 1, labels.size(1) - 1).reshape({-1});                    // (B*(T-1))
  return at::cross_entropy_loss(shift_logits, shift_labels, {}, at::Reduction::Sum, chat::kIgnoreIndex);
}

namespace {

/// The fused loss of hidden states (B, T, C) against the targets of their positions (B, T), on the host.
at::Tensor fused_targets_loss_sum(models::CausalLM& model, const at::Tensor& hidden, const at::Tensor& targets,
                                  int64_t chunk) {
  const auto C = hidden.size(-1);
  const auto shifted = targets.reshape({-1});
  auto h = hidden.reshape({-1, C});
  auto y = shifted;
  // Rows without a target (prompts, padding) are not projected: found where
  // the labels are (the batch's are on the host, so no device sync), and
  // skipped only when they are worth an index_select. A share of rows without a target (a context-parallel
  // rank's chunks of a prompt) keeps them: its zero loss must still reach the model in the backward, whose
  // collectives every rank of the group runs.
  if (!targets.is_cuda()) {
    const auto valid = shifted.ne(chat::kIgnoreIndex);
    const int64_t n = valid.sum().item<int64_t>();
    if (n > 0 && n < shifted.size(0) * 9 / 10) {
      const auto rows = valid.nonzero().squeeze(1);
      h = h.index_select(0, to_device(rows, hidden.device()));
      y = shifted.index_select(0, rows);
    }
  }
  const auto head = model.output_head();
  if (model.vocab_parallel)  // the head's vocabulary rows split over the tensor-parallel group
    return model.vocab_parallel->vocab_parallel_loss_sum(h, head.weight, head.bias, to_device(y, hidden.device()),
                                                         chunk, chat::kIgnoreIndex);
  FusedLossOptions o;
  o.chunk = chunk;
  o.ignore_index = chat::kIgnoreIndex;
  return fused_linear_cross_entropy(h, head.weight, head.bias, to_device(y, hidden.device()), o);
}

/// lm_batch_loss_sum under context parallelism: each row padded to a multiple of 2 x cp positions (padding
/// predicts nothing and, after every real token, is seen by none), the targets taken on the whole row (a
/// position predicts the next one, which may sit on another rank), then this rank's share of positions run with
/// their global positions, attention gathering the group's keys and values (models/context_parallel.h).
at::Tensor context_parallel_loss_sum(models::CausalLM& model, const Batch& batch, const LmLossOptions& o) {
  TORCH_CHECK(model.num_experts() == 0, "context parallelism: a mixture of experts is refused at setup");
  const auto device = model.parameters().front().device();
  const int64_t cp = o.context->world_size();
  auto ids = batch.tensors.at("input_ids");
  auto targets = next_token_targets(batch.tensors.at("labels"), chat::kIgnoreIndex);
  const int64_t B = ids.size(0), T = ids.size(1), length = (T + 2 * cp - 1) / (2 * cp) * (2 * cp);
  const auto pad = [&](const at::Tensor& t, int64_t value) {
    return length == T ? t : at::cat({t, at::full({B, length - T}, value, t.options())}, 1);
  };
  const auto docs = batch.tensors.find("doc_ids");
  at::Tensor doc_ids, positions;
  // The padding's positions stay within the row's (what Phi-3's longrope reads is the row's furthest position).
  if (docs != batch.tensors.end()) {
    doc_ids = pad(docs->second, -1);
    positions = pad(batch.tensors.at("position_ids"), 0);
  } else {
    positions = at::arange(length, ids.options()).clamp_max(T - 1).unsqueeze(0).expand({B, length});
  }
  ids = pad(ids, 0);
  targets = pad(targets, chat::kIgnoreIndex);
  const auto slots = distributed::context_parallel_positions(length, o.context->rank(), cp, "data.max_length");
  models::ForwardArgs args;
  args.context = distributed::context_share(o.context, length, device, o.context_ring);
  const auto share = [&](const at::Tensor& t) { return t.index_select(1, slots); };
  args.position_ids = to_device(share(positions).contiguous(), device);
  if (doc_ids.defined())  // packed documents: query slot i sees key slot j <= i of its own document, over the row
    args.attention_mask = to_device(models::layers::document_causal_mask(doc_ids, slots), device);
  const auto mine_ids = to_device(share(ids), device);
  const auto mine_targets = share(targets);
  if (o.fused && model.final_logit_softcap() == 0)
    return fused_targets_loss_sum(model, model.hidden_states(mine_ids, args), mine_targets, o.chunk);
  const auto logits = model.forward(mine_ids, args);
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                to_device(mine_targets, device).reshape({-1}), {}, at::Reduction::Sum,
                                chat::kIgnoreIndex);
}

}  // namespace

at::Tensor fused_lm_loss_sum(models::CausalLM& model, const at::Tensor& hidden, const at::Tensor& labels,
                             int64_t chunk) {
  return fused_targets_loss_sum(model, hidden, next_token_targets(labels, chat::kIgnoreIndex), chunk);
}

at::Tensor lm_batch_loss_sum(models::CausalLM& model, const Batch& batch, const LmLossOptions& o) {
  if (o.context && o.context->world_size() > 1) return context_parallel_loss_sum(model, batch, o);
  const auto device = model.parameters().front().device();
  auto ids = to_device(batch.tensors.at("input_ids"), device);
  const auto& labels = batch.tensors.at("labels");
  models::ForwardArgs args;
  // Padding takes no part in a mixture of experts' load-balancing loss (transformers' attention_mask):
  // packed rows mark it with doc_ids < 0, padded ones with their attention_mask.
  const bool experts = model.num_experts() > 0;
  if (auto it = batch.tensors.find("doc_ids"); it != batch.tensors.end()) {
    const auto doc_ids = to_device(it->second, device);
    args.position_ids = to_device(batch.tensors.at("position_ids"), device);
    args.documents.doc_ids = doc_ids;
    // On CUDA the documents' cumulative lengths let attention run flash attention without a mask;
    // they come from the host's doc ids, so finding them reads nothing back from the device.
    if (device.is_cuda() && !it->second.is_cuda()) {
      if (auto offsets = data::document_offsets(it->second)) {
        args.documents.cu_seqlens = to_device(offsets->cu_seqlens, device);
        args.documents.max_seqlen = offsets->max_seqlen;
      }
    }
    if (!args.documents.cu_seqlens.defined()) args.attention_mask = models::layers::document_causal_mask(doc_ids);
    if (experts) args.token_mask = doc_ids.ge(0);
  } else if (auto m = batch.tensors.find("attention_mask"); experts && m != batch.tensors.end()) {
    args.token_mask = to_device(m->second, device);
  }
  if (o.fused && model.final_logit_softcap() == 0)  // soft-capped logits (Gemma) take the plain head
    return fused_lm_loss_sum(model, model.hidden_states(ids, args), labels, o.chunk);
  return causal_lm_loss_sum(model.forward(ids, args), to_device(labels, device));
}

std::vector<Batch> LmObjective::split_rows(const Batch& batch, int64_t parts) const {
  const int64_t rows = batch.tensors.at("input_ids").size(0);
  const int64_t per = (rows + std::max<int64_t>(parts, 1) - 1) / std::max<int64_t>(parts, 1);
  std::vector<Batch> out;
  for (int64_t b = 0; b < rows; b += per) {
    const int64_t n = std::min(per, rows - b);
    Batch part;
    for (const auto& [key, t] : batch.tensors) part.tensors[key] = t.narrow(0, b, n);
    // As the collation counts them: label positions after the first that are not ignored; real tokens.
    const auto& labels = part.tensors.at("labels");
    part.num_targets =
        labels.size(1) > 1 ? labels.narrow(1, 1, labels.size(1) - 1).ne(chat::kIgnoreIndex).sum().item<int64_t>() : 0;
    if (auto m = part.tensors.find("attention_mask"); m != part.tensors.end())
      part.num_tokens = m->second.sum().item<int64_t>();
    else if (auto d = part.tensors.find("doc_ids"); d != part.tensors.end())
      part.num_tokens = d->second.ge(0).sum().item<int64_t>();
    else
      part.num_tokens = batch.num_tokens * n / std::max<int64_t>(rows, 1);
    out.push_back(std::move(part));
  }
  return out;
}

Batch to_batch(data::LmBatch b) {
  Batch out;
  out.tensors["input_ids"] = std::move(b.input_ids);
  out.tensors["labels"] = std::move(b.labels);
  if (b.attention_mask.defined()) out.tensors["attention_mask"] = std::move(b.attention_mask);
  if (b.doc_ids.defined()) {
    out.tensors["position_ids"] = std::move(b.position_ids);
    out.tensors["doc_ids"] = std::move(b.doc_ids);
  }
  out.num_targets = b.num_targets;
  out.num_tokens = b.num_tokens;
  return out;
}

LmBatchSource::LmBatchSource(std::vector<std::shared_ptr<const data::LmDataset>> datasets, data::MixtureSampler sampler,
                             Options opt)
    : datasets_(std::move(datasets)), sampler_(std::move(sampler)), opt_(opt) {
  TORCH_CHECK(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "LmBatchSource: bad rank/world");
  TORCH_CHECK(!opt_.packing || opt_.max_length > 0, "LmBatchSource: packing needs max_length");
}

Batch LmBatchSource::next() {
  const auto m = opt_.micro_batch_size;
  auto length = [&](const data::SampleRef& r) { return datasets_[static_cast<size_t>(r.dataset)]->length(r.index); };
  std::vector<std::vector<data::SampleRef>> mine;
  for (int64_t g = 0; g < opt_.world * m; ++g) {
    std::vector<data::SampleRef> row{sampler_.next()};
    if (opt_.packing) {
      int64_t used = length(row[0]);
      while (used + length(sampler_.peek()) <= opt_.max_length) {
        row.push_back(sampler_.next());
        used += length(row.back());
      }
    }
    if (g / m == opt_.rank) mine.push_back(std::move(row));
  }
  std::deque<data::LmSample> store;  // stable addresses
  std::vector<std::vector<const data::LmSample*>> rows;
  for (const auto& refs : mine) {
    rows.emplace_back();
    for (const auto& r : refs) {
      datasets_[static_cast<size_t>(r.dataset)]->get(r.index, store.emplace_back());
      rows.back().push_back(&store.back());
    }
  }
  if (opt_.packing) return to_batch(data::collate_packed(rows, opt_.max_length, opt_.pad_id));
  std::vector<const data::LmSample*> flat;
  for (const auto& r : rows) flat.push_back(r[0]);
  return to_batch(data::collate_unpacked(flat, opt_.pad_id, opt_.pad_to_multiple_of, opt_.max_length));
}

int64_t LmBatchSource::rows_per_epoch() const {
  if (!opt_.packing) return samples_per_epoch();
  auto first = sampler_;
  first.set_state({});
  const auto& order = first.plan();
  auto length = [&](size_t i) { return datasets_[static_cast<size_t>(order[i].dataset)]->length(order[i].index); };
  int64_t rows = 0;
  for (size_t i = 0; i < order.size(); ++rows) {
    int64_t used = length(i++);
    while (i < order.size() && used + length(i) <= opt_.max_length) used += length(i++);
  }
  return rows;
}

nlohmann::json sampler_state(const data::MixtureSampler& sampler) {
  return {
      {"epoch", sampler.state().epoch}, {"offset", sampler.state().offset}, {"epoch_length", sampler.epoch_length()}};
}

void restore_sampler(data::MixtureSampler& sampler, const nlohmann::json& state) {
  sampler.set_state(data::sampler_state_of(state));
  if (state.contains("epoch_length") && state["epoch_length"].is_number_integer() &&
      state["epoch_length"].get<int64_t>() != sampler.epoch_length())
    log::warn("the data changed since the checkpoint (an epoch held ", state["epoch_length"].get<int64_t>(),
              " samples, now ", sampler.epoch_length(),
              "): the stream continues at the saved position of the new data");
}

nlohmann::json LmBatchSource::state() const { return sampler_state(sampler_); }

void LmBatchSource::restore(const nlohmann::json& state) { restore_sampler(sampler_, state); }

EvalSplit split_eval(int64_t n, double eval_fraction, uint64_t seed, size_t dataset_index, const std::string& key) {
  const auto k = std::max<int64_t>(1, std::llround(eval_fraction * static_cast<double>(n)));
  if (k >= n)
    throw ConfigError(concat(key, ".eval_fraction: holding out ", k, " of ", n, " samples leaves none to train on"));
  const auto perm = data::permutation(n, seed * 0x9E3779B97F4A7C15ull + 0xE7A1 + dataset_index);
  EvalSplit out;
  out.train.assign(perm.begin() + k, perm.end());
  out.held.assign(perm.begin(), perm.begin() + k);
  std::sort(out.train.begin(), out.train.end());
  std::sort(out.held.begin(), out.held.end());
  return out;
}

void exact_match_eval(models::CausalLM& model, const tokenizer::Tokenizer& tok, const config::EvalConfig& eval,
                      int64_t stop_id, const std::vector<std::vector<int64_t>>& prompts,
                      const std::vector<std::string>& prompt_texts, const std::vector<std::string>& references,
                      EvalResult& r, const RankContext& ranks) {
  if (prompts.empty()) return;
  // Several ranks answer every world-th prompt each.
  const bool split = ranks.splits(static_cast<int64_t>(prompts.size()));
  std::vector<size_t> mine;
  std::vector<std::vector<int64_t>> my_prompts;
  for (size_t i = 0; i < prompts.size(); ++i)
    if (!split || ranks.mine(static_cast<int64_t>(i))) {
      mine.push_back(i);
      my_prompts.push_back(prompts[i]);
    }
  generation::SamplingOptions g;
  g.max_new_tokens = eval.max_new_tokens;
  g.greedy = true;
  g.eos_id = stop_id;
  g.batch_size = eval.batch_size;
  const auto outs = generation::generate(model, my_prompts, g);
  std::vector<double> exact{0};
  for (size_t k = 0; k < mine.size(); ++k) {
    const auto i = mine[k];
    auto text = tok.decode(outs[k]);
    exact[0] += text == references[i];
    if (static_cast<int64_t>(r.samples.size()) < eval.table_rows)
      r.samples.push_back({prompt_texts[i], text, references[i]});
  }
  if (split) ranks.all_sum(exact);
  r.metrics["eval/exact_match"] = exact[0] / static_cast<double>(prompts.size());
}

std::shared_ptr<models::CausalLM> load_reference(const std::string& path, const std::string& key,
                                                 models::CausalLM& policy) {
  if (path.empty()) return models::clone_model(policy);
  auto reference = checkpoint::load_model_dir(path);
  if (reference->has_score_head())
    throw ConfigError(concat(key, ": ", path, " is a reward model; the reference must be a causal LM"));
  if (reference->vocab_size() != policy.vocab_size())
    throw ConfigError(concat(key, ": ", path, " has a vocabulary of ", reference->vocab_size(), " tokens, the policy ",
                             policy.vocab_size()));
  return reference;
}

LmData load_lm_data(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat,
                    LmTask task) {
  return load_mixture<data::LmDataset>(cfg, [&](const config::DatasetConfig& d, const std::string& key) {
    return load_one(cfg, d, key, tok, chat, task);
  });
}

struct LmObjective::State {
  State(std::string n, config::EvalConfig e, const tokenizer::Tokenizer& t)
      : name(std::move(n)), eval_cfg(std::move(e)), tok(t) {}
  std::string name;
  config::EvalConfig eval_cfg;
  const tokenizer::Tokenizer& tok;
  int64_t stop_id = -1;  // end of an assistant turn
  bool packing = false;
  int64_t pad_id = 0;  // the tokenizer's PAD, else EOS
  LmLossOptions loss;  // train.fused_loss, train.loss_chunk_size
  LmData data;
  std::unique_ptr<LmBatchSource> source;
};

LmObjective::LmObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat,
                         LmTask task)
    : s_(std::make_unique<State>(cfg.algorithm, cfg.eval, tok)) {
  if (cfg.data.max_length <= 0) throw ConfigError("data.max_length: expected a positive row length");
  s_->data = load_lm_data(cfg, tok, chat, task);
  if (task == LmTask::sft) s_->stop_id = chat.end_of_turn_id(tok);
  data::MixtureSampler sampler(s_->data.mixture, static_cast<uint64_t>(cfg.train.seed), s_->data.shuffle);
  if (s_->data.train.size() > 1) {
    std::vector<int64_t> per(s_->data.train.size(), 0);
    for (const auto& r : sampler.plan()) ++per[static_cast<size_t>(r.dataset)];
    std::string parts;
    for (size_t i = 0; i < per.size(); ++i) parts += concat(i ? ", " : "", s_->data.train[i]->name(), " ", per[i]);
    log::info("mixture: an epoch is ", sampler.epoch_length(), " samples (", parts, ")");
  }
  LmBatchSource::Options o;
  o.micro_batch_size = cfg.train.micro_batch_size;
  o.max_length = cfg.data.max_length;
  o.packing = cfg.data.packing;
  o.pad_to_multiple_of = cfg.data.pad_to_multiple_of;
  s_->packing = cfg.data.packing;
  s_->pad_id = tok.padding_id();
  s_->loss.fused = cfg.train.fused_loss;
  s_->loss.chunk = cfg.train.loss_chunk_size;
  s_->loss.context_ring = cfg.dist.context_parallel_mode == config::ContextParallelMode::kRing;
  if (!cfg.train.fused_loss && cfg.train.loss_chunk_size > 0)
    throw ConfigError("train.loss_chunk_size: chunks are the fused loss's; set train.fused_loss: true or remove it");
  o.pad_id = s_->pad_id;
  s_->source = std::make_unique<LmBatchSource>(s_->data.train, std::move(sampler), o);
}

LmObjective::~LmObjective() = default;

std::string LmObjective::name() const { return s_->name; }

BatchSource& LmObjective::train_source() { return *s_->source; }

void LmObjective::prepare(models::CausalLM& model, const RunContext& ctx) {
  if (model.has_score_head())
    throw ConfigError(concat("model.from: algorithm ", s_->name,
                             " trains a language model, but the model is a reward model (it has a score head and no "
                             "LM head); start from a causal LM"));
  if (ctx.context_comm && ctx.context_comm->world_size() > 1) {
    // A router's load-balancing statistics are a micro-batch's; a share of its positions would give others.
    if (model.num_experts() > 0)
      throw ConfigError(concat("dist.context_parallel: ", ctx.context_comm->world_size(),
                               " with a mixture of experts (", model.num_experts(),
                               " experts) is not supported yet; set dist.context_parallel: 1"));
    if (s_->loss.context_ring)  // ring attention merges exact partial softmaxes: no dropout of the probabilities
      for (const char* key : {"attn_pdrop", "attention_dropout"})
        if (const auto c = model.hf_config(); c.contains(key) && c[key].is_number() && c[key].get<double>() > 0)
          throw ConfigError(concat("dist.context_parallel_mode: ring attention has no attention dropout (the model's ",
                                   key, " is ", c[key].get<double>(),
                                   "); set model.dropout: 0 or dist.context_parallel_mode: allgather"));
    s_->loss.context = ctx.context_comm;
  }
}

at::Tensor LmObjective::loss_sum(models::CausalLM& model, const Batch& batch, Sums&) {
  return lm_batch_loss_sum(model, batch, s_->loss);
}

EvalResult LmObjective::evaluate(models::CausalLM& model) {
  EvalResult r;
  if (s_->data.eval.empty()) return r;
  const bool was_training = model.is_training();
  model.eval();
  const auto n_eval = static_cast<int64_t>(s_->data.eval.size());
  {
    torch::NoGradGuard no_grad;
    int64_t n_batches = (n_eval + s_->eval_cfg.batch_size - 1) / s_->eval_cfg.batch_size;
    if (s_->eval_cfg.max_batches > 0) n_batches = std::min(n_batches, s_->eval_cfg.max_batches);
    const bool split = ranks_.splits(n_batches);  // several ranks take every world-th batch
    std::vector<double> sums{0, 0};               // loss, targets
    for (int64_t k = 0; k < n_batches; ++k) {
      if (split && !ranks_.runs(k, n_batches)) continue;
      const bool counted = !split || ranks_.mine(k);  // the uneven tail runs on every rank, counts on one
      const int64_t i = k * s_->eval_cfg.batch_size;
      std::deque<data::LmSample> store;
      std::vector<const data::LmSample*> samples;
      for (int64_t j = i; j < std::min(n_eval, i + s_->eval_cfg.batch_size); ++j) {
        const auto& ref = s_->data.eval[static_cast<size_t>(j)];
        s_->data.eval_sets[static_cast<size_t>(ref.dataset)]->get(ref.index, store.emplace_back());
        samples.push_back(&store.back());
      }
      // Packed runs are evaluated as they train: documents inside a sample
      // (pretraining windows) restart positions and do not see each other.
      size_t longest = 0;
      for (const auto* smp : samples) longest = std::max(longest, smp->input_ids.size());
      std::vector<std::vector<const data::LmSample*>> rows;
      for (const auto* smp : samples) rows.push_back({smp});
      auto b = s_->packing ? to_batch(data::collate_packed(rows, static_cast<int64_t>(longest), s_->pad_id))
                           : to_batch(data::collate_unpacked(samples, s_->pad_id));
      const double loss = lm_batch_loss_sum(model, b, s_->loss).item<double>();
      if (!counted) continue;
      sums[0] += loss;
      sums[1] += static_cast<double>(b.num_targets);
    }
    if (s_->loss.context) {  // each rank of a context-parallel group summed its share of the rows' positions
      auto t = at::tensor({sums[0]}, at::kDouble).to(model.parameters().front().device());
      s_->loss.context->all_reduce_sum(t, "evaluation loss over the context-parallel group");
      sums[0] = t.item<double>();
    }
    if (split) ranks_.all_sum(sums);
    r.metrics["eval/loss"] = sums[0] / std::max(1.0, sums[1]);
  }
  // Greedy answers to held-out prompts (SFT data only).
  std::vector<const data::SftSample*> gen;
  for (const auto& ref : s_->data.eval) {
    if (static_cast<int64_t>(gen.size()) >= s_->eval_cfg.generate_samples) break;
    if (auto* sft = dynamic_cast<const data::SftDataset*>(s_->data.eval_sets[static_cast<size_t>(ref.dataset)].get()))
      gen.push_back(&(*sft)[ref.index]);
  }
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::string> prompt_texts, references;
  for (const auto* s : gen) {
    prompts.emplace_back(s->input_ids.begin(), s->input_ids.begin() + s->prompt_tokens);
    prompt_texts.push_back(s->prompt);
    references.push_back(s->response);
  }
  exact_match_eval(model, s_->tok, s_->eval_cfg, s_->stop_id, prompts, prompt_texts, references, r, ranks_);
  if (was_training) model.train();
  return r;
}

// sft and pretrain, with the keys each reads of those only some do: registered through register_objective as a
// linking program registers its own (examples/custom_objective), from the list of built-in objectives
// (objective_registry.cpp).
void register_lm_objectives() {
  config::register_section<SftConfig>("sft", "Supervised fine-tuning (algorithm: sft).", "sft");
  auto sft = config::dataset_keys({"eval_fraction", "prompt_field", "response_field", "token_dtype"});
  sft.insert(sft.end(), {"data.template", "data.split_turns", "data.on_overflow", "data.on_error", "data.packing",
                         "data.pad_to_multiple_of", "train.fused_loss", "train.loss_chunk_size", "eval.max_batches",
                         "eval.generate_samples", "eval.max_new_tokens", "eval.table_rows", "train.num_train_epochs",
                         "dist.tensor_parallel", "dist.context_parallel", "dist.vocab_parallel"});
  register_objective(
      "sft",
      [](const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat) {
        return std::make_unique<LmObjective>(cfg, tok, chat, LmTask::sft);
      },
      sft);
  auto pretrain = config::dataset_keys({"eval_fraction", "token_dtype"});
  pretrain.insert(pretrain.end(), {"data.packing", "data.pad_to_multiple_of", "train.fused_loss",
                                   "train.loss_chunk_size", "eval.max_batches", "train.num_train_epochs",
                                   "dist.tensor_parallel", "dist.context_parallel", "dist.vocab_parallel"});
  register_objective(
      "pretrain",
      [](const config::RunConfig& cfg, const tokenizer::Tokenizer& tok, const chat::ChatTemplate& chat) {
        return std::make_unique<LmObjective>(cfg, tok, chat, LmTask::pretrain);
      },
      pretrain);
}

}  // namespace anvil::train
