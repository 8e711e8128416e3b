#include "anvil/checkpoint/hf_model.h"

#include "checkpoint/peft.h"
#include "models/lora.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <functional>
#include <set>
#include <unistd.h>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "core/hub_cache.h"
#include "io/safetensors.h"
#include "anvil/models/registry.h"
#include "checkpoint/saved_parameters.h"
#include "models/init.h"

namespace anvil::checkpoint {
namespace {

namespace stdfs = std::filesystem;

nlohmann::json read_json(const stdfs::path& path) {
  auto j = nlohmann::json::parse(fs::read_file(path), nullptr, false);
  if (j.is_discarded()) throw CheckpointError(concat(path.string(), ": not valid JSON"));
  return j;
}

/// Adds the named heads `dir`/heads.json lists (none when it is absent).
void add_saved_heads(models::CausalLM& model, const stdfs::path& dir) {
  const auto path = dir / kHeadsConfig;
  if (!stdfs::exists(path)) return;
  const auto j = read_json(path);
  if (!j.is_object() || !j.contains("heads") || !j["heads"].is_object())
    throw CheckpointError(concat(path.string(),
                                 ": expected {\"heads\": {name: {\"out_features\": N, \"bias\": "
                                 "true|false}}}"));
  for (const auto& [name, h] : j["heads"].items()) {
    const auto where = concat(path.string(), ": heads.", name);
    if (!h.is_object() || !h.contains("out_features") || !h["out_features"].is_number_integer() ||
        h["out_features"].get<int64_t>() < 1 || h["out_features"].get<int64_t>() > (int64_t{1} << 24))
      throw CheckpointError(concat(where, ".out_features: expected an integer in [1, 2^24]"));
    if (h.contains("bias") && !h["bias"].is_boolean())
      throw CheckpointError(concat(where, ".bias: expected true or false"));
    if (h.contains("hidden_features") &&
        (!h["hidden_features"].is_number_integer() || h["hidden_features"].get<int64_t>() < 0 ||
         h["hidden_features"].get<int64_t>() > (int64_t{1} << 24)))
      throw CheckpointError(concat(where, ".hidden_features: expected an integer in [0, 2^24]"));
    if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
      throw CheckpointError(concat(where, ": expected a head name of a-z, 0-9 and _"));
    if (!model.has_head(name))
      model.add_head(
          name, models::CausalLM::HeadOptions{h["out_features"].get<int64_t>(), h.value("hidden_features", int64_t{0}),
                                              h.value("bias", true)});
  }
}

/// The safetensors files of a folder: the index's shards, or model.safetensors.
std::vector<stdfs::path> weight_files(const stdfs::path& dir) {
  const auto index = dir / "model.safetensors.index.json";
  if (stdfs::exists(index)) {
    auto j = read_json(index);
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw CheckpointError(concat(index.string(), ": weight_map: expected an object of tensor -> file"));
    std::set<std::string> files;
    for (const auto& [_, f] : j["weight_map"].items()) {
      if (!f.is_string()) throw CheckpointError(concat(index.string(), ": weight_map values must be file names"));
      files.insert(f.get<std::string>());
    }
    std::vector<stdfs::path> out;
    for (const auto& f : files) out.push_back(dir / f);
    return out;
  }
  const auto single = dir / "model.safetensors";
  if (!stdfs::exists(single)) {
    // A PyTorch pickle (pytorch_model.bin, or its shards' index): say why it is not read and how to convert it.
    for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json"})
      if (stdfs::exists(dir / pickle))
        throw CheckpointError(concat(
            dir.string(), ": no model.safetensors or model.safetensors.index.json, only ", pickle,
            ", a PyTorch pickle, which Anvil does not read (unpickling runs code from the file). Convert it once "
            "with transformers: AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, "
            "safe_serialization=True) (docs/models.md, \"Importing a Hugging Face model\")"));
    throw CheckpointError(concat(dir.string(), ": no model.safetensors or model.safetensors.index.json"));
  }
  return {single};
}

/// GPT2LMHeadModel -> GPT2ForSequenceClassification, LlamaForCausalLM ->
/// LlamaForSequenceClassification, GPTNeoXForCausalLM -> GPTNeoXForSequenceClassification.
std::string sequence_classification_class(const nlohmann::json& config) {
  auto arch = config.at("architectures").at(0).get<std::string>();
  for (const std::string suffix : {"LMHeadModel", "ForCausalLM"})
    if (arch.ends_with(suffix)) return arch.substr(0, arch.size() - suffix.size()) + "ForSequenceClassification";
  throw CheckpointError(concat("no sequence-classification class for architecture ", arch));
}

bool is_sequence_classification(const nlohmann::json& config) {
  if (!config.contains("architectures") || !config["architectures"].is_array() || config["architectures"].empty())
    return false;
  const auto& a = config["architectures"][0];
  return a.is_string() && a.get<std::string>().ends_with("ForSequenceClassification");
}

at::ScalarType export_dtype(const std::string& dtype) {
  if (dtype == "float32") return at::kFloat;
  if (dtype == "bfloat16") return at::kBFloat16;
  if (dtype == "float16") return at::kHalf;
  throw ConfigError(concat("--dtype: expected float32, bfloat16 or float16, got \"", dtype, "\""));
}

}  // namespace

std::function<bool(const std::string&)> saved_parameters(models::CausalLM& model) {
  // A reward model is saved as HF's ...ForSequenceClassification: the score
  // head, no LM head, one label, and the pad id that locates the scored token.
  std::set<std::string> omit;
  if (model.has_score_head())
    for (const auto& n : model.lm_head_parameters()) omit.insert(n);
  return [omit = std::move(omit), lora = models::has_lora(model)](const std::string& name) {
    return !omit.count(name) &&
           (is_head_parameter(name) || !lora || models::is_lora_parameter(name) || name.rfind("score.", 0) == 0);
  };
}

void save_weight_files(const stdfs::path& dir, models::CausalLM& model, const std::map<std::string, at::Tensor>& all) {
  const bool lora = models::has_lora(model);
  const auto saved = saved_parameters(model);
  io::TensorMap tensors, heads;
  for (const auto& [name, t] : all)
    if (is_head_parameter(name))
      heads.emplace(name, t);
    else if (saved(name))
      tensors.emplace(name, t);
  if (lora)
    save_peft_adapter(dir, model, tensors);
  else
    io::save_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});
  if (!heads.empty()) io::save_safetensors(dir / kHeadsFile, heads, {{"format", "pt"}});
}

void save_model_dir(const stdfs::path& dir, models::CausalLM& model, const tokenizer::Tokenizer* tokenizer) {
  io::TensorMap all;
  for (const auto& p : model.named_parameters()) all.emplace(p.key(), p.value());
  save_weight_files(dir, model, all);
  save_model_config(dir, model, tokenizer);
}

void save_model_config(const stdfs::path& dir, models::CausalLM& model, const tokenizer::Tokenizer* tokenizer,
                       std::optional<at::ScalarType> dtype_override) {
  const bool reward = model.has_score_head();
  auto config = model.hf_config();
  if (reward) {
    config["architectures"] = {sequence_classification_class(config)};
    config["num_labels"] = 1;
    config["id2label"] = {{"0", "LABEL_0"}};
    config["label2id"] = {{"LABEL_0", 0}};
  }
  const auto dtype = dtype_override.value_or(model.parameters().front().scalar_type());
  const char* dtype_name = dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
  config["torch_dtype"] = dtype_name;  // transformers 4
  config["dtype"] = dtype_name;        // transformers 5
  fs::write_file_atomic(dir / (models::has_lora(model) ? kAdapterModelConfig : "config.json"), config.dump(2) + "\n");
  nlohmann::json gen = {{"_from_model_config", true}};
  if (model.special_tokens.bos >= 0) gen["bos_token_id"] = model.special_tokens.bos;
  if (model.special_tokens.eos >= 0) gen["eos_token_id"] = model.special_tokens.eos;
  if (model.special_tokens.pad >= 0) gen["pad_token_id"] = model.special_tokens.pad;
  fs::write_file_atomic(dir / "generation_config.json", gen.dump(2) + "\n");
  if (!model.head_names().empty()) {
    nlohmann::json heads = nlohmann::json::object();
    for (const auto& name : model.head_names()) {
      const auto h = model.head_options(name);
      heads[name] = {{"out_features", h.out_features}, {"bias", h.bias}};
      if (h.hidden_features > 0) heads[name]["hidden_features"] = h.hidden_features;
    }
    fs::write_file_atomic(dir / kHeadsConfig, nlohmann::json({{"format_version", 1}, {"heads", heads}}).dump(2) + "\n");
  }
  if (tokenizer) tokenizer->save(dir);
}

namespace {

bool weight_files_absent(const stdfs::path& dir) {
  return !stdfs::exists(dir / "model.safetensors") && !stdfs::exists(dir / "model.safetensors.index.json");
}

/// The values of a model's deferred parameters (models/init.h): each one's
/// tensor in the folder's files, kept mapped, read a range at a time.
class FolderSource final : public models::ParameterSource {
 public:
  void add(std::shared_ptr<const io::SafetensorsFile> file, const std::string& param, const std::string& stored) {
    where_[param] = {std::move(file), stored};
  }
  at::Tensor read(const std::string& name, int64_t begin, int64_t count) const override {
    const auto it = where_.find(name);
    // A parameter the folder may lack (a reward model's unused LM head) reads as zeros.
    if (it == where_.end()) return at::zeros({count});
    return it->second.first->get_elements(it->second.second, begin, count);
  }

 private:
  std::map<std::string, std::pair<std::shared_ptr<const io::SafetensorsFile>, std::string>> where_;
};

/// Copies the tensors of `files` into the model's parameters of their names,
/// or, for a deferred parameter, records in `deferred` where its values are;
/// returns the parameters loaded.
std::set<std::string> copy_tensors(models::CausalLM& model, const std::vector<stdfs::path>& files,
                                   FolderSource* deferred = nullptr) {
  std::map<std::string, at::Tensor> params;
  for (const auto& p : model.named_parameters()) params.emplace(p.key(), p.value());
  std::set<std::string> loaded;
  at::NoGradGuard no_grad;
  for (const auto& file : files) {
    auto opened = std::make_shared<const io::SafetensorsFile>(file);
    const auto& f = *opened;
    for (const auto& stored : f.names()) {
      const auto name = model.checkpoint_key(stored);
      if (name.empty()) continue;  // tied head, legacy buffer
      auto it = params.find(name);
      if (it == params.end())
        throw CheckpointError(
            concat(file.string(), ": tensor \"", stored, "\" is not a parameter of this ", model.family(), " model"));
      if (loaded.count(name))
        throw CheckpointError(concat(file.string(), ": tensor \"", stored, "\" duplicates parameter \"", name, "\""));
      const auto shape = f.shape(stored);
      if (at::IntArrayRef(shape) != it->second.sizes())
        throw CheckpointError(concat(file.string(), ": tensor \"", stored, "\" has shape ", at::IntArrayRef(shape),
                                     ", the model expects ", it->second.sizes()));
      if (deferred && models::is_deferred(it->second))
        deferred->add(opened, name, stored);
      else
        it->second.copy_(f.get(stored));
      loaded.insert(name);
    }
  }
  return loaded;
}

/// Throws unless every parameter but those `may_miss` accepts was loaded.
void check_complete(models::CausalLM& model, const stdfs::path& dir, const std::set<std::string>& loaded,
                    const std::function<bool(const std::string&)>& may_miss) {
  // A sequence-classification folder has no LM head; the reward model never uses it.
  std::set<std::string> optional;
  if (model.has_score_head())
    for (const auto& n : model.lm_head_parameters()) optional.insert(n);
  for (const auto& p : model.named_parameters()) {
    const auto& name = p.key();
    if (!loaded.count(name) && !optional.count(name) && !models::is_lora_parameter(name) && !may_miss(name)) {
      // Name the files that should have held it: the index's shards, or model.safetensors.
      std::string where;
      if (const auto index = dir / "model.safetensors.index.json"; stdfs::exists(index)) {
        const auto shards = weight_files(dir);
        where = concat("none of the ", shards.size(), " files that model.safetensors.index.json lists (");
        for (size_t i = 0; i < shards.size(); ++i) where += (i ? ", " : "") + shards[i].filename().string();
        where += ") holds it";
      } else {
        where = "model.safetensors has no such tensor";
      }
      throw CheckpointError(concat(dir.string(), ": parameter \"", name, "\" is missing from the weights: ", where));
    }
  }
}

/// A LoRA adapter's base: everything but the adapters, the score head and
/// named heads, which the adapter folder holds.
void load_base_weights(models::CausalLM& model, const stdfs::path& dir) {
  const auto loaded = copy_tensors(model, weight_files(dir));
  check_complete(model, dir, loaded,
                 [](const std::string& n) { return is_head_parameter(n) || n.rfind("score.", 0) == 0; });
}

/// A PEFT adapter folder: its base (with the folder's config.json when it has
/// one: a reward model's, heads), then the adapters.
std::shared_ptr<models::CausalLM> load_adapter_dir(const stdfs::path& dir, const stdfs::path& base) {
  auto o = read_peft_config(dir);
  const std::string named = base.empty() ? o.base_model : base.string();
  const stdfs::path from = hub::local_path(named);  // a folder, or a Hub id's cached snapshot
  if (named.empty() || !stdfs::exists(from / "config.json"))
    throw CheckpointError(
        concat(dir.string(), ": a LoRA adapter whose base model ",
               named.empty() ? std::string("is not named") : "\"" + named + "\" is not a model folder",
               " (adapter_config.json's base_model_name_or_path); give the base folder with --base",
               hub::is_repo_id(named) && !stdfs::exists(named)
                   ? concat("; as a Hugging Face model id: ", hub::explain_missing(named))
                   : std::string()));
  const bool own_config = stdfs::exists(dir / "config.json") || stdfs::exists(dir / kAdapterModelConfig);
  auto model = model_from_config(own_config ? dir : from);
  load_base_weights(*model, from);
  o.base_model = stdfs::exists(named) ? stdfs::absolute(named).string() : named;  // an id stays one, as in PEFT
  models::add_lora(*model, o, (dir / kAdapterConfig).string() + ": target_modules");
  load_peft_weights(*model, dir);
  if (stdfs::exists(dir / kHeadsFile)) copy_tensors(*model, {dir / kHeadsFile});
  return model;
}

}  // namespace

void load_weights(models::CausalLM& model, const stdfs::path& dir) {
  if (models::has_lora(model) && is_peft_adapter_dir(dir) && weight_files_absent(dir)) {
    load_peft_weights(model, dir);
    if (stdfs::exists(dir / kHeadsFile)) copy_tensors(model, {dir / kHeadsFile});
    return;
  }
  auto files = weight_files(dir);
  if (stdfs::exists(dir / kHeadsFile)) files.push_back(dir / kHeadsFile);
  check_complete(model, dir, copy_tensors(model, files), [](const std::string&) { return false; });
}

void export_model_dir(const stdfs::path& checkpoint, const stdfs::path& output, const std::string& dtype) {
  check_export_target(output, dtype);
  auto model = load_model_dir(checkpoint);
  std::unique_ptr<tokenizer::Tokenizer> tok;
  if (tokenizer::has_tokenizer(checkpoint)) tok = tokenizer::load_tokenizer_from_model_dir(checkpoint);
  write_model_dir_atomic(*model, tok.get(), output, dtype);
}

void check_export_target(const stdfs::path& output, const std::string& dtype) {
  (void)export_dtype(dtype);
  if (stdfs::exists(output) && !(stdfs::is_directory(output) && stdfs::is_empty(output)))
    throw IoError(concat(output.string(), ": already exists and is not an empty folder; choose a new path"));
}

void write_model_dir_atomic(models::CausalLM& model, const tokenizer::Tokenizer* tok, const stdfs::path& output,
                            const std::string& dtype) {
  check_export_target(output, dtype);
  model.to(export_dtype(dtype));
  const auto abs_out = stdfs::absolute(output);
  const auto tmp = abs_out.parent_path() / concat(".", abs_out.filename().string(), ".tmp-", ::getpid());
  stdfs::remove_all(tmp);
  stdfs::create_directories(tmp);
  try {
    save_model_dir(tmp, model, tok);
    fs::fsync_tree(tmp);
    if (stdfs::exists(abs_out)) stdfs::remove(abs_out);  // the empty folder
    stdfs::rename(tmp, abs_out);
    fs::fsync_path(abs_out.parent_path());
  } catch (...) {
    stdfs::remove_all(tmp);
    throw;
  }
}

std::shared_ptr<models::CausalLM> model_from_config(const stdfs::path& dir) {
  auto cfg_path = dir / "config.json";
  if (!stdfs::exists(cfg_path) && stdfs::exists(dir / kAdapterModelConfig)) cfg_path = dir / kAdapterModelConfig;
  if (!stdfs::exists(cfg_path)) throw CheckpointError(concat(dir.string(), ": not a model folder (no config.json)"));
  const auto j = read_json(cfg_path);
  if (!j.contains("model_type") || !j["model_type"].is_string())
    throw CheckpointError(concat(cfg_path.string(), ": model_type: expected a string"));
  const auto& family = models::family_by_hf_model_type(j["model_type"].get<std::string>(), cfg_path.string());
  auto model = family.from_hf_config(j, cfg_path.string());
  if (is_sequence_classification(j)) {
    const auto labels = j.contains("id2label") && j["id2label"].is_object() ? j["id2label"].size()
                        : j.contains("num_labels") && j["num_labels"].is_number_integer()
                            ? j["num_labels"].get<size_t>()
                            : 2;
    if (labels != 1)
      throw CheckpointError(concat(cfg_path.string(), ": a sequence-classification model with ", labels,
                                   " labels; Anvil reads reward models (num_labels 1)"));
    model->add_score_head();
  }
  add_saved_heads(*model, dir);
  return model;
}

std::shared_ptr<models::CausalLM> load_model_dir(const stdfs::path& dir_or_id, const stdfs::path& base) {
  const auto dir = hub::local_path(dir_or_id.string());  // a Hub id names its cached snapshot
  if (stdfs::exists(dir / "sharding.json") && weight_files_absent(dir) && !is_peft_adapter_dir(dir))
    throw CheckpointError(concat(dir.string(),
                                 ": a sharded checkpoint (written by a multi-process or sharded run); "
                                 "consolidate it first with: anvil export --checkpoint ",
                                 dir.string(), " --out DIR"));
  if (is_peft_adapter_dir(dir) && weight_files_absent(dir)) return load_adapter_dir(dir, base);
  auto model = [&] {
    models::SkipInitGuard loading;  // every parameter comes from the folder (load_weights checks it)
    return model_from_config(dir);
  }();
  load_weights(*model, dir);
  return model;
}

std::shared_ptr<models::CausalLM> open_model_dir(const stdfs::path& dir_or_id, const at::Device& device) {
  const auto dir = hub::local_path(dir_or_id.string());
  // A sharded checkpoint or a PEFT adapter folder: load_model_dir says why, or loads its base whole.
  if ((stdfs::exists(dir / "sharding.json") && weight_files_absent(dir)) ||
      (is_peft_adapter_dir(dir) && weight_files_absent(dir))) {
    auto model = load_model_dir(dir_or_id);
    model->to(device);
    return model;
  }
  auto model = [&] {
    models::DeferredInitGuard deferred(device);
    return model_from_config(dir);
  }();
  auto source = std::make_shared<FolderSource>();
  auto files = weight_files(dir);
  if (stdfs::exists(dir / kHeadsFile)) files.push_back(dir / kHeadsFile);
  check_complete(*model, dir, copy_tensors(*model, files, source.get()), [](const std::string&) { return false; });
  model->to(device);  // the real parameters (a score head); the deferred ones are already there
  model->parameter_source = std::move(source);
  return model;
}

}  // namespace anvil::checkpoint
