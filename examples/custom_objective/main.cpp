// weighted_trainer: Anvil's `trainer`, plus one objective of our own.
//
// algorithm: weighted_sft is supervised fine-tuning whose loss weighs some
// target tokens more than others: here the digits of the answers, by
// weighted_sft.digit_weight (its own config section). It reports its own
// metric, loss/digits. Everything else (config files and overrides,
// checkpoints, resume, eval, metrics.jsonl, sharding) is the trainer's.
//
//   weighted_trainer --config weighted_sft.yaml [key=value ...]
#include <anvil/config/config.h>
#include <anvil/core/error.h>
#include <anvil/train/objective.h>
#include <anvil/train/sft.h>
#include <anvil/train/trainer.h>

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

namespace {

/// The section `weighted_sft:` of a config.
struct WeightedSftConfig {
  double digit_weight = 2.0;

  void visit(anvil::config::FieldVisitor& v) {
    v.field("digit_weight", digit_weight, "Loss weight of a target token that is a digit (other tokens weigh 1).",
            anvil::config::positive());
  }
};

class WeightedSft final : public anvil::train::Objective {
 public:
  WeightedSft(const anvil::config::RunConfig& cfg, const anvil::tokenizer::Tokenizer& tok,
              const anvil::chat::ChatTemplate& chat)
      : lm_(cfg, tok, chat, anvil::train::LmTask::sft),
        weight_(cfg.extensions.get<WeightedSftConfig>("weighted_sft").digit_weight) {
    for (char c = '0'; c <= '9'; ++c)
      if (auto id = tok.token_to_id(std::string(1, c))) digits_.push_back(*id);
    if (digits_.empty()) throw anvil::ConfigError("weighted_sft: the tokenizer has no single-digit tokens");
  }

  std::string name() const override { return "weighted_sft"; }
  // Data, batches and evaluation are the built-in SFT objective's.
  void prepare(anvil::models::CausalLM& model, const anvil::train::RunContext& ctx) override {
    lm_.prepare(model, ctx);
  }
  anvil::train::BatchSource& train_source() override { return lm_.train_source(); }
  anvil::train::EvalResult evaluate(anvil::models::CausalLM& model) override { return lm_.evaluate(model); }

  /// Summed over the batch's target tokens: cross-entropy x weight.
  at::Tensor loss_sum(anvil::models::CausalLM& model, const anvil::train::Batch& batch,
                      anvil::train::Sums& sums) override {
    if (batch.tensors.count("doc_ids")) throw anvil::ConfigError("weighted_sft: data.packing is not supported");
    const auto device = model.parameters().front().device();
    const auto ids = batch.tensors.at("input_ids").to(device);
    const auto labels = batch.tensors.at("labels").to(device).narrow(1, 1, ids.size(1) - 1);
    const auto logits = model.forward(ids).narrow(1, 0, ids.size(1) - 1);
    const auto ce = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), labels.reshape({-1}),
                                           {}, at::Reduction::None, -100)
                        .view(labels.sizes());
    const auto is_digit = at::isin(labels, at::tensor(digits_, labels.options()));
    const auto weights = at::where(is_digit, at::scalar_tensor(weight_, ce.options()), at::ones_like(ce));
    anvil::train::add_sum(sums, "digit_tokens", is_digit.sum());
    anvil::train::add_sum(sums, "digit_loss", (ce * is_digit).sum());
    return (ce * weights).sum();
  }

  /// Our own metric: the mean cross-entropy of the digit tokens of the step.
  anvil::Metrics step_metrics(const anvil::train::Sums& sums) const override {
    const double n = sums.at("digit_tokens").item<double>();
    return n > 0 ? anvil::Metrics{{"loss/digits", sums.at("digit_loss").item<double>() / n}} : anvil::Metrics{};
  }

 private:
  anvil::train::LmObjective lm_;
  double weight_;
  std::vector<int64_t> digits_;
};

}  // namespace

int main(int argc, char** argv) {
  anvil::config::register_section<WeightedSftConfig>("weighted_sft", "Digit-weighted SFT (algorithm: weighted_sft).",
                                                     "weighted_sft");
  // It reads what sft reads (data, eval generation), except the keys of sft's
  // own loss: setting those in a weighted_sft config is an error, not a no-op.
  auto reads = anvil::config::keys_read_by("sft");
  std::erase_if(reads, [](const std::string& k) {
    return k == "train.loss_chunk_size" || k == "train.fused_loss" || k == "data.packing";
  });
  anvil::train::register_objective(
      "weighted_sft",
      [](const anvil::config::RunConfig& cfg, const anvil::tokenizer::Tokenizer& tok,
         const anvil::chat::ChatTemplate& chat) { return std::make_unique<WeightedSft>(cfg, tok, chat); },
      reads);
  return anvil::train::trainer_main(argc, argv);
}
