#include "anvil/models/registry.h"

#include <optional>

#include "models/init.h"

#include <ATen/ATen.h>

#include "anvil/core/error.h"

namespace anvil::models {
namespace gpt2 {
ModelFamily family();
}
namespace llama {
std::vector<ModelFamily> families();  // a row each (llama/variants.cpp)
}  // namespace llama
namespace gemma {
ModelFamily gemma2_family();
ModelFamily gemma3_family();
}  // namespace gemma
namespace neox {
ModelFamily family();
}
namespace opt {
ModelFamily family();
}

namespace {
// One line per family; LLaMA's variants are rows of llama/variants.cpp, one line for all.
const std::vector<ModelFamily>& families() {
  static const std::vector<ModelFamily> all = [] {
    std::vector<ModelFamily> out = {gpt2::family()};
    // LLaMA, Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm), Mistral (sliding windows), Phi-3 (fused
    // projections, LongRoPE), Mixtral and Qwen3-MoE (experts): a row each of llama::variants().
    for (auto& f : llama::families()) out.push_back(std::move(f));
    for (auto f : {gemma::gemma2_family(), gemma::gemma3_family(), neox::family(), opt::family()})
      out.push_back(std::move(f));
    return out;
  }();
  return all;
}
}  // namespace

const ModelFamily& family_by_name(const std::string& name) {
  for (const auto& f : families())
    if (f.name == name) return f;
  std::string known;
  for (const auto& n : family_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError(concat("model.family: unknown family \"", name, "\"; expected one of ", known));
}

const ModelFamily& family_by_hf_model_type(const std::string& model_type, const std::string& where) {
  for (const auto& f : families())
    if (f.model_type == model_type) return f;
  std::string known;
  for (const auto& f : families()) known += (known.empty() ? "" : ", ") + f.model_type;
  throw CheckpointError(concat(where, ": model_type \"", model_type, "\" is not supported; supported: ", known));
}

// The config layer learns the families, their keys and checks from here:
// model.family accepts these names and no others (config/ names none).
const bool kRegisteredWithConfig = [] {
  for (const auto& f : families()) config::add_model_family({f.name, f.config_keys, f.check, f.own_keys});
  return true;
}();

std::vector<std::string> family_names() {
  std::vector<std::string> out;
  for (const auto& f : families()) out.push_back(f.name);
  return out;
}

std::shared_ptr<CausalLM> clone_model(CausalLM& model) {
  const auto config = model.hf_config();
  const auto ref = model.parameters().front();
  // Every value is copied (or, for a model built without storage, read from the same source when sharded):
  // nothing is drawn.
  const bool deferred = has_deferred(model);
  std::optional<DeferredInitGuard> defer;
  std::optional<SkipInitGuard> skip;
  if (deferred)
    defer.emplace(ref.device());
  else
    skip.emplace();
  auto copy = family_by_hf_model_type(config.at("model_type").get<std::string>(), "clone_model")
                  .from_hf_config(config, "clone_model");
  if (model.has_score_head()) copy->add_score_head();
  auto src = model.named_parameters();
  at::NoGradGuard no_grad;
  if (deferred) {
    copy->parameter_source = model.parameter_source;
    for (auto& p : copy->named_parameters())  // the score head: LibTorch's, real
      if (!is_deferred(p.value())) p.value().copy_(src[p.key()]);
  } else {
    copy->to(ref.device(), ref.scalar_type());
    for (auto& p : copy->named_parameters()) p.value().copy_(src[p.key()]);
  }
  copy->special_tokens = model.special_tokens;
  copy->train(model.is_training());
  return copy;
}

}  // namespace anvil::models
