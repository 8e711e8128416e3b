#include "anvil/train/sft.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "anvil/core/logging.h"
#include "anvil/data/collate.h"
#include "anvil/generation/generate.h"

namespace anvil::train {
namespace {

data::SftOptions sft_options(const config::RunConfig& cfg, int64_t max_length) {
  data::SftOptions o;
  o.prompt_field = cfg.data.prompt_field;
  o.response_field = cfg.data.response_field;
  o.max_length = max_length;
  o.drop_overflow = cfg.data.on_overflow == "drop";
  o.train_on_prompt = cfg.sft.train_on_prompt;
  o.add_eos = cfg.sft.add_eos;
  return o;
}

std::shared_ptr<const data::SftDataset> load_reported(const std::string& path, const tokenizer::Tokenizer& tok,
                                                      const data::SftOptions& o) {
  auto ds = std::make_shared<data::SftDataset>(data::SftDataset::load(path, tok, o));
  const auto& s = ds->stats();
  log::info(path, ": ", ds->size(), " samples from ", s.lines, " lines (truncated ", s.truncated,
            ", dropped as too long ", s.dropped_overflow, ", dropped with no target left ", s.dropped_no_target, ")");
  return ds;
}

Batch to_batch(data::SftBatch b) {
  Batch out;
  out.tensors["input_ids"] = std::move(b.input_ids);
  out.tensors["labels"] = std::move(b.labels);
  out.num_targets = b.num_targets;
  out.num_tokens = b.num_tokens;
  return out;
}

}  // namespace

at::Tensor causal_lm_loss_sum(const at::Tensor& logits, const at::Tensor& labels) {
  const auto V = logits.size(-1);
  auto shift_logits = logits.narrow(1, 0, logits.size(1) - 1).reshape({-1, V}).to(at::kFloat);  // (B*(T-1), V)
  auto shift_labels = labels.narrow(1, 1, labels.size(1) - 1).reshape({-1});                   // (B*(T-1))
  return at::cross_entropy_loss(shift_logits, shift_labels, {}, at::Reduction::Sum, data::kIgnoreIndex);
}

SftBatchSource::SftBatchSource(std::shared_ptr<const data::SftDataset> ds, int64_t micro_batch_size, uint64_t seed,
                               int64_t pad_id)
    : ds_(std::move(ds)), sampler_(ds_->size(), seed), micro_batch_size_(micro_batch_size), pad_id_(pad_id) {}

Batch SftBatchSource::next() {
  std::vector<const data::SftSample*> samples;
  samples.reserve(static_cast<size_t>(micro_batch_size_));
  for (int64_t i = 0; i < micro_batch_size_; ++i) samples.push_back(&(*ds_)[sampler_.next()]);
  return to_batch(data::collate_sft(samples, pad_id_));
}

nlohmann::json SftBatchSource::state() const {
  return {{"epoch", sampler_.state().epoch}, {"offset", sampler_.state().offset}};
}

void SftBatchSource::restore(const nlohmann::json& state) {
  sampler_.set_state({state.at("epoch").get<int64_t>(), state.at("offset").get<int64_t>()});
}

SftObjective::SftObjective(const config::RunConfig& cfg, const tokenizer::Tokenizer& tok)
    : eval_cfg_(cfg.eval), tok_(tok) {
  const auto max_len = cfg.data.max_length > 0 ? cfg.data.max_length : cfg.model.max_position_embeddings;
  const auto opts = sft_options(cfg, max_len);
  auto train = load_reported(cfg.data.train_file, tok, opts);
  if (!cfg.data.eval_file.empty()) eval_ = load_reported(cfg.data.eval_file, tok, opts);
  source_ = std::make_unique<SftBatchSource>(train, cfg.train.micro_batch_size,
                                             static_cast<uint64_t>(cfg.train.seed), tok.pad_id());
}

at::Tensor SftObjective::loss_sum(models::CausalLM& model, const Batch& batch) {
  const auto device = model.parameters().front().device();
  auto ids = batch.tensors.at("input_ids").to(device);
  auto labels = batch.tensors.at("labels").to(device);
  return causal_lm_loss_sum(model.forward(ids), labels);
}

EvalResult SftObjective::evaluate(models::CausalLM& model) {
  EvalResult r;
  if (!eval_) return r;
  const bool was_training = model.is_training();
  model.eval();
  {
    torch::NoGradGuard no_grad;
    double loss = 0;
    int64_t targets = 0, batches = 0;
    for (int64_t i = 0; i < eval_->size(); i += eval_cfg_.batch_size) {
      if (eval_cfg_.max_batches > 0 && batches++ >= eval_cfg_.max_batches) break;
      std::vector<const data::SftSample*> samples;
      for (int64_t j = i; j < std::min(eval_->size(), i + eval_cfg_.batch_size); ++j) samples.push_back(&(*eval_)[j]);
      auto b = to_batch(data::collate_sft(samples, tok_.pad_id()));
      loss += loss_sum(model, b).item<double>();
      targets += b.num_targets;
    }
    r.metrics["eval/loss"] = loss / static_cast<double>(std::max<int64_t>(1, targets));
  }
  const auto n = std::min(eval_->size(), eval_cfg_.generate_samples);
  if (n > 0) {
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t i = 0; i < n; ++i) {
      const auto& s = (*eval_)[i];
      prompts.emplace_back(s.input_ids.begin(), s.input_ids.begin() + s.prompt_tokens);
    }
    generation::SamplingOptions g;
    g.max_new_tokens = eval_cfg_.max_new_tokens;
    g.greedy = true;
    g.eos_id = tok_.eos_id();
    g.batch_size = eval_cfg_.batch_size;
    const auto outs = generation::generate(model, prompts, g);
    int64_t exact = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto& s = (*eval_)[i];
      auto text = tok_.decode(outs[static_cast<size_t>(i)]);
      exact += text == s.response;
      if (i < eval_cfg_.table_rows) r.samples.push_back({s.prompt, text, s.response});
    }
    r.metrics["eval/exact_match"] = static_cast<double>(exact) / static_cast<double>(n);
  }
  if (was_training) model.train();
  return r;
}

}  // namespace anvil::train
