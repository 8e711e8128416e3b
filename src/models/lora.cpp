#include "models/lora.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <map>
#include <set>

#include "anvil/core/error.h"
#include "anvil/models/causal_lm.h"
#include "models/layers.h"

namespace anvil::models {
namespace {

struct Adaptable {
  std::string name;  // full module name ("model.layers.0.self_attn.q_proj")
  std::string last;  // "q_proj"
  torch::nn::Module* module;
  LoraLayer* layer;
};

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string last_part(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

/// The block-level linear layers that can carry an adapter, in module order.
std::vector<Adaptable> adaptable_layers(CausalLM& model) {
  std::vector<std::string> prefixes;
  for (int64_t i = 0; i < model.num_layers(); ++i) prefixes.push_back(model.block_prefix(i) + ".");
  std::vector<Adaptable> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* layer = dynamic_cast<LoraLayer*>(item.value().get());
    if (layer == nullptr) continue;
    const auto& name = item.key();
    const bool in_block =
        std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return name.rfind(p, 0) == 0; });
    if (in_block) out.push_back({name, last_part(name), item.value().get(), layer});
  }
  return out;
}

/// PEFT's rule: a target names a layer by its last name part, its full name,
/// or a dotted suffix of it.
bool matches(const Adaptable& a, const std::string& target) {
  if (a.last == target || a.name == target) return true;
  return a.name.size() > target.size() && a.name.compare(a.name.size() - target.size(), target.size(), target) == 0 &&
         a.name[a.name.size() - target.size() - 1] == '.';
}

}  // namespace

at::Tensor LoraLayer::with_adapter(const at::Tensor& x, const at::Tensor& base, bool training) const {
  if (lora_A.is_empty() || !lora_enabled) return base;
  auto h = x.to(lora_A->weight.scalar_type());
  if (lora_dropout > 0 && training) h = at::dropout(h, lora_dropout, /*train=*/true);
  return base + (at::linear(at::linear(h, lora_A->weight), lora_B->weight) * lora_scaling).to(base.scalar_type());
}

std::vector<std::string> lora_target_names(CausalLM& model) {
  std::set<std::string> names;
  for (const auto& a : adaptable_layers(model)) names.insert(a.last);
  return {names.begin(), names.end()};
}

std::vector<std::string> add_lora(CausalLM& model, LoraOptions o, const std::string& key) {
  if (o.r <= 0) throw ConfigError(concat("lora.r must be positive to add adapters, got ", o.r));
  if (has_lora(model)) throw ConfigError("the model already has LoRA adapters");
  if (o.target_modules.empty()) o.target_modules = model.default_lora_targets();
  const auto layers = adaptable_layers(model);
  const auto available = lora_target_names(model);
  const bool all = o.target_modules.size() == 1 && o.target_modules[0] == "all-linear";
  if (!all)
    for (const auto& t : o.target_modules)
      if (std::none_of(layers.begin(), layers.end(), [&](const Adaptable& a) { return matches(a, t); }))
        throw ConfigError(concat(key, ": \"", t, "\" is not a linear layer of this ", model.family(),
                                 " model's blocks; expected some of: ", joined(available), ", or all-linear"));
  std::set<std::string> used;
  for (const auto& a : layers) {
    // all-linear as PEFT sees a transformers 5 mixture of experts: its experts are 3-D tensors, not linear
    // modules, so they get no adapter unless named.
    if (all && a.name.find(".experts.") != std::string::npos) continue;
    if (!all && std::none_of(o.target_modules.begin(), o.target_modules.end(),
                             [&](const std::string& t) { return matches(a, t); }))
      continue;
    const auto device = a.module->parameters().front().device();
    auto A = torch::nn::Linear(torch::nn::LinearOptions(a.layer->in_features(), o.r).bias(false));
    auto B = torch::nn::Linear(torch::nn::LinearOptions(o.r, a.layer->out_features()).bias(false));
    {
      at::NoGradGuard no_grad;
      B->weight.zero_();
    }
    A->to(device);
    B->to(device);
    a.layer->lora_A = a.module->register_module("lora_A", A);
    a.layer->lora_B = a.module->register_module("lora_B", B);
    a.layer->lora_scaling = o.alpha / static_cast<double>(o.r);
    a.layer->lora_dropout = o.dropout;
    a.layer->lora_enabled = true;
    a.layer->lora_base_model = o.base_model;
    used.insert(a.last);
  }
  return {used.begin(), used.end()};
}

bool has_lora(CausalLM& model) {
  for (const auto& a : adaptable_layers(model))
    if (a.layer->has_adapter()) return true;
  return false;
}

LoraOptions lora_options(CausalLM& model) {
  LoraOptions o;
  o.r = 0;
  // A layer name part when every layer of that name has an adapter, else the full names.
  std::map<std::string, std::vector<std::string>> with, without;
  for (const auto& a : adaptable_layers(model)) {
    if (!a.layer->has_adapter()) {
      without[a.last].push_back(a.name);
      continue;
    }
    with[a.last].push_back(a.name);
    o.r = a.layer->lora_A->weight.size(0);
    o.alpha = a.layer->lora_scaling * static_cast<double>(o.r);
    o.dropout = a.layer->lora_dropout;
    o.base_model = a.layer->lora_base_model;
  }
  for (const auto& [last, names] : with)
    if (!without.count(last))
      o.target_modules.push_back(last);
    else
      o.target_modules.insert(o.target_modules.end(), names.begin(), names.end());
  return o;
}

bool is_lora_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

bool lora_trains(const std::string& name) {
  return is_lora_parameter(name) || name.rfind("heads.", 0) == 0 || name.rfind("score.", 0) == 0;
}

void set_lora_enabled(CausalLM& model, bool enabled) {
  for (const auto& a : adaptable_layers(model)) a.layer->lora_enabled = enabled;
}

LoraDisabled::LoraDisabled(CausalLM& model) : model_(&model), active_(has_lora(model)) {
  if (active_) set_lora_enabled(model, false);
}

LoraDisabled::~LoraDisabled() {
  if (active_) set_lora_enabled(*model_, true);
}

void merge_lora(CausalLM& model) {
  at::NoGradGuard no_grad;
  for (const auto& a : adaptable_layers(model)) {
    if (!a.layer->has_adapter()) continue;
    const auto delta = at::matmul(a.layer->lora_B->weight.to(at::kFloat), a.layer->lora_A->weight.to(at::kFloat)) *
                       a.layer->lora_scaling;
    a.layer->add_to_weight(delta);
    a.module->unregister_module("lora_A");
    a.module->unregister_module("lora_B");
    a.layer->lora_A = torch::nn::Linear{nullptr};
    a.layer->lora_B = torch::nn::Linear{nullptr};
  }
}

namespace layers {
void LinearImpl::add_to_weight(const at::Tensor& delta_out_in) {
  at::NoGradGuard no_grad;
  weight.add_(delta_out_in.to(weight.dtype()));
}
}  // namespace layers

}  // namespace anvil::models
