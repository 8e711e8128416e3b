#include "checkpoint/peft.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "io/safetensors.h"
#include "anvil/models/registry.h"

namespace anvil::checkpoint {
namespace {

namespace stdfs = std::filesystem;

constexpr const char* kPrefix = "base_model.model.";

bool is_score_parameter(const std::string& name) { return name.rfind("score.", 0) == 0; }

/// The parameters an adapter folder holds: the adapters and a score head.
bool in_adapter(const std::string& name) { return models::is_lora_parameter(name) || is_score_parameter(name); }

nlohmann::json read_json_file(const stdfs::path& path) {
  std::ifstream in(path);
  if (!in) throw CheckpointError(concat(path.string(), ": cannot be read"));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(concat(path.string(), ": not valid JSON: ", e.what()));
  }
}

/// Throws unless `j[key]` is absent, null, false or empty (a PEFT feature Anvil does not implement).
void require_unset(const nlohmann::json& j, const char* key, const stdfs::path& path, const char* what) {
  if (!j.contains(key)) return;
  const auto& v = j[key];
  const bool unset = v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_object() && v.empty()) ||
                     (v.is_array() && v.empty()) || (v.is_string() && v.get<std::string>().empty());
  if (!unset) throw CheckpointError(concat(path.string(), ": ", key, " is set (", v.dump(), "); ", what));
}

}  // namespace

bool is_peft_adapter_dir(const stdfs::path& dir) { return stdfs::is_regular_file(dir / kAdapterConfig); }

models::LoraOptions read_peft_config(const stdfs::path& dir) {
  const auto path = dir / kAdapterConfig;
  const auto j = read_json_file(path);
  auto need = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key)) throw CheckpointError(concat(path.string(), ": ", key, " is missing"));
    return j[key];
  };
  if (need("peft_type") != "LORA")
    throw CheckpointError(concat(path.string(), ": peft_type: expected \"LORA\", got ", j["peft_type"].dump()));
  if (j.contains("bias") && j["bias"] != "none")
    throw CheckpointError(
        concat(path.string(), ": bias: expected \"none\" (Anvil's adapters train no biases), got ", j["bias"].dump()));
  require_unset(j, "use_dora", path, "DoRA adapters are not supported");
  require_unset(j, "use_rslora", path, "rank-stabilised scaling is not supported");
  require_unset(j, "target_parameters", path,
                "adapters on parameters (a mixture of experts' 3-D expert weights and router, which PEFT's "
                "all-linear adds on transformers 5) are not supported; target linear modules such as q_proj");
  require_unset(j, "rank_pattern", path, "per-layer ranks are not supported");
  require_unset(j, "alpha_pattern", path, "per-layer alphas are not supported");
  require_unset(j, "layers_to_transform", path, "adapters on some layers only are not supported");
  require_unset(j, "lora_bias", path, "adapter biases are not supported");
  require_unset(j, "trainable_token_indices", path, "trainable token rows are not supported");
  models::LoraOptions o;
  const auto& r = need("r");
  const auto& alpha = need("lora_alpha");
  if (!r.is_number_integer() || r.get<int64_t>() <= 0)
    throw CheckpointError(concat(path.string(), ": r: expected a positive integer, got ", r.dump()));
  if (!alpha.is_number()) throw CheckpointError(concat(path.string(), ": lora_alpha: expected a number"));
  o.r = r.get<int64_t>();
  o.alpha = alpha.get<double>();
  if (j.contains("lora_dropout") && j["lora_dropout"].is_number()) o.dropout = j["lora_dropout"].get<double>();
  const auto& t = need("target_modules");
  if (t.is_string() && t.get<std::string>() == "all-linear") {
    o.target_modules = {"all-linear"};
  } else if (t.is_array() && !t.empty()) {
    for (const auto& x : t) {
      if (!x.is_string()) throw CheckpointError(concat(path.string(), ": target_modules: expected names"));
      o.target_modules.push_back(x.get<std::string>());
    }
  } else {
    throw CheckpointError(concat(path.string(),
                                 ": target_modules: expected a list of layer names or "
                                 "\"all-linear\" (a regular expression is not supported), got ",
                                 t.dump()));
  }
  if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
    o.base_model = j["base_model_name_or_path"].get<std::string>();
  return o;
}

void save_peft_adapter(const stdfs::path& dir, models::CausalLM& model,
                       const std::map<std::string, at::Tensor>& tensors) {
  const auto o = models::lora_options(model);
  io::TensorMap out;
  if (tensors.empty()) {
    for (const auto& p : model.named_parameters())
      if (in_adapter(p.key())) out.emplace(kPrefix + p.key(), p.value().detach());
  } else {
    for (const auto& [name, t] : tensors)
      if (in_adapter(name)) out.emplace(kPrefix + name, t);
  }
  io::save_safetensors(dir / kAdapterWeights, out, {{"format", "pt"}});
  const bool reward = model.has_score_head();
  nlohmann::json c = {
      {"peft_type", "LORA"},
      {"task_type", reward ? "SEQ_CLS" : "CAUSAL_LM"},
      {"base_model_name_or_path", o.base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.base_model)},
      {"r", o.r},
      {"lora_alpha", o.alpha},
      {"lora_dropout", o.dropout},
      {"target_modules", o.target_modules},
      {"bias", "none"},
      {"fan_in_fan_out", models::family_by_name(model.family()).conv1d_weights},
      {"modules_to_save", reward ? nlohmann::json::array({"score"}) : nlohmann::json(nullptr)},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"use_rslora", false},
      {"use_dora", false},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"revision", nullptr}};
  fs::write_file_atomic(dir / kAdapterConfig, c.dump(2) + "\n");
}

void load_peft_weights(models::CausalLM& model, const stdfs::path& dir) {
  const auto file = dir / kAdapterWeights;
  if (!stdfs::exists(file)) throw CheckpointError(concat(dir.string(), ": no ", kAdapterWeights));
  io::SafetensorsFile f(file);
  auto key = [](std::string name) {
    if (name.rfind(kPrefix, 0) == 0) name = name.substr(std::string(kPrefix).size());
    // PEFT names a saved module copy "<module>.modules_to_save.<adapter>." in some versions.
    if (const auto m = name.find(".modules_to_save."); m != std::string::npos)
      name = name.substr(0, m) + name.substr(name.find('.', m + 17));
    if (const auto d = name.find(".default."); d != std::string::npos) name.erase(d, 8);  // "lora_A.default.weight"
    return name;
  };
  // A sequence-classification adapter (PEFT's SEQ_CLS) holds the score head.
  for (const auto& stored : f.names())
    if (is_score_parameter(key(stored)) && !model.has_score_head()) model.add_score_head();
  std::map<std::string, at::Tensor> params;
  for (const auto& p : model.named_parameters())
    if (in_adapter(p.key())) params.emplace(p.key(), p.value());
  std::set<std::string> loaded;
  at::NoGradGuard no_grad;
  for (const auto& stored : f.names()) {
    const auto name = key(stored);
    auto it = params.find(name);
    if (it == params.end())
      throw CheckpointError(
          concat(file.string(), ": tensor \"", stored, "\" is not an adapter parameter of this ", model.family(),
                 " model (adapters on: ", nlohmann::json(models::lora_options(model).target_modules).dump(), ")"));
    const auto shape = f.shape(stored);
    if (at::IntArrayRef(shape) != it->second.sizes())
      throw CheckpointError(concat(file.string(), ": tensor \"", stored, "\" has shape ", at::IntArrayRef(shape),
                                   ", the adapter expects ", it->second.sizes()));
    it->second.copy_(f.get(stored));
    loaded.insert(name);
  }
  for (const auto& [name, _] : params)
    if (!loaded.count(name) && models::is_lora_parameter(name))
      throw CheckpointError(concat(file.string(), ": adapter parameter \"", kPrefix, name, "\" is missing"));
}

models::LoraOptions load_peft_adapter(models::CausalLM& model, const stdfs::path& dir) {
  auto o = read_peft_config(dir);
  models::add_lora(model, o, (dir / kAdapterConfig).string() + ": target_modules");
  load_peft_weights(model, dir);
  return o;
}

}  // namespace anvil::checkpoint
