// Cross-field checks of a parsed config (the registered sections' own among
// them), and the keys a run's algorithm does not read (read_if_declared): every problem is reported with the file and
// line of the key, all of them together (config_internal.h).
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <variant>

#include "core/hub_cache.h"
#include "config_internal.h"

namespace anvil::config {
namespace {

using Fail = std::function<void(const std::string& key, const std::string& what)>;

/// keys_read_by(algorithm), or none when no such algorithm is registered
/// (algorithm's own rule reports that).
std::vector<std::string> keys_read_by_if_registered(const std::string& algorithm) {
  const auto names = algorithm_names();
  if (std::find(names.begin(), names.end(), algorithm) == names.end()) return {};
  return keys_read_by(algorithm);
}

/// The hub half of a "not found" message: empty unless `path` has the form of a Hub model id.
std::string hub_note(const std::string& path) {
  if (!hub::is_repo_id(path)) return "";
  return concat(", nor a Hugging Face model id in the local cache: ", hub::explain_missing(path));
}

void check_model(const RunConfig& c, const FlatConfig& flat, const Fail& fail) {
  if (!c.model.from.empty()) {
    // The shape of a loaded model is its config.json's; a second source of
    // truth would be silently ignored.
    for (const auto& [k, entry] : flat)
      if (k.rfind("model.", 0) == 0 && k != "model.from" && k != "model.family" && k != "model.lora_from" &&
          k != "model.router_aux_loss_coef")
        fail(k, concat("cannot be set together with model.from (the model's shape and dropout come from ", c.model.from,
                       "/config.json)"));
  }
  for (const auto& t : c.tokenizer.add_special_tokens)
    if (t.empty()) fail("tokenizer.add_special_tokens", "expected non-empty token strings");
}

void check_lora(const RunConfig& c, const FlatConfig& flat, const Fail& fail) {
  (void)flat;  // a printed config sets every lora key, so unused keys are not errors
  if (c.lora.r == 0 && c.model.lora_from.empty()) return;
  const char* key = c.model.lora_from.empty() ? "lora.r" : "model.lora_from";
  if (c.model.from.empty()) fail(key, "LoRA adapts a pretrained model: set model.from to the base model's folder");
  if (!c.tokenizer.add_special_tokens.empty())
    fail("tokenizer.add_special_tokens",
         "cannot be used with LoRA: the new tokens' embedding rows would stay frozen at their initial mean");
  if (!c.model.lora_from.empty() &&
      !std::filesystem::is_regular_file(hub::local_path(c.model.lora_from) / "adapter_config.json"))
    fail("model.lora_from", concat("expected a PEFT adapter folder (with adapter_config.json), got \"",
                                   c.model.lora_from, "\"", hub_note(c.model.lora_from)));
}

void check_training(const RunConfig& c, const FlatConfig& flat, const Fail& fail) {
  if (c.train.micro_batch_size == TrainConfig::kAutoMicroBatch) {
    // auto: one micro-batch of the whole step, halved as memory requires (train::TrainLoop).
    if (c.train.global_batch_size == 0)
      fail("train.micro_batch_size",
           "auto starts from the step's whole batch: set train.global_batch_size (samples per optimizer step)");
    if (flat.count("train.grad_accum_steps") && c.train.grad_accum_steps != 1)
      fail("train.grad_accum_steps", concat("cannot be set with train.micro_batch_size: auto, which chooses the "
                                            "accumulation; got ",
                                            c.train.grad_accum_steps));
  } else if (c.train.global_batch_size > 0) {
    if (c.train.global_batch_size % c.train.micro_batch_size != 0)
      fail("train.global_batch_size", concat("expected a multiple of train.micro_batch_size (",
                                             c.train.micro_batch_size, "), got ", c.train.global_batch_size));
    if (flat.count("train.grad_accum_steps") &&
        c.train.grad_accum_steps * c.train.micro_batch_size != c.train.global_batch_size)
      fail("train.grad_accum_steps", concat("conflicts with train.global_batch_size (", c.train.global_batch_size,
                                            " samples = ", c.train.global_batch_size / c.train.micro_batch_size,
                                            " micro-batches of ", c.train.micro_batch_size, "); set one of the two"));
  }
  // The run's length: steps, or epochs for an algorithm whose steps read data.train (resolved once it is loaded).
  if (c.train.max_steps == 0 && c.train.num_train_epochs == 0) {
    const auto reads = keys_read_by_if_registered(c.algorithm);
    const bool epochs = std::find(reads.begin(), reads.end(), "train.num_train_epochs") != reads.end();
    const auto alternative = epochs ? std::string(", or train.num_train_epochs") : std::string();
    fail("train.max_steps", flat.count("train.max_steps")
                                ? concat("expected a positive integer", alternative, ", got 0")
                                : concat("required key is missing; expected a positive integer (set it in a config "
                                         "file or as train.max_steps=...)",
                                         alternative));
  }
  if (c.schedule.warmup_steps > 0 && c.schedule.warmup_ratio > 0)
    fail("schedule.warmup_ratio", concat("cannot be set together with schedule.warmup_steps (", c.schedule.warmup_steps,
                                         "): set one of the two"));
  if (c.optimizer.betas.size() != 2)
    fail("optimizer.betas", concat("expected a list of 2 numbers, got ", c.optimizer.betas.size()));
  if (c.optimizer.state_dtype != Dtype::kFloat32 && !c.optimizer.fused)
    fail("optimizer.state_dtype", concat("is ", kStateDtypes.name(c.optimizer.state_dtype),
                                         ", which the fused AdamW keeps; set optimizer.fused: true (it is false)"));
  if (c.dist.replicate > 1 && c.dist.sharding == Sharding::kNoShard)
    fail("dist.replicate", concat("replicates shards across groups of ranks; set dist.sharding: full_shard or "
                                  "shard_grad_op (it is no_shard, which replicates everything already)"));
  if (c.dist.tensor_parallel > 1 && (c.lora.r > 0 || !c.model.lora_from.empty()))
    fail("dist.tensor_parallel", "tensor parallelism with LoRA adapters is not supported yet");
  if (c.dist.sequence_parallel && c.dist.tensor_parallel < 2)
    fail("dist.sequence_parallel", concat("splits the positions across a tensor-parallel group; set "
                                          "dist.tensor_parallel to 2 or more (it is ",
                                          c.dist.tensor_parallel, ")"));
  if (c.dist.vocab_parallel && c.dist.tensor_parallel < 2)
    fail("dist.vocab_parallel", concat("splits the vocabulary across a tensor-parallel group; set "
                                       "dist.tensor_parallel to 2 or more (it is ",
                                       c.dist.tensor_parallel, ")"));
  if (c.dist.context_parallel > 1 && (c.lora.r > 0 || !c.model.lora_from.empty()))
    fail("dist.context_parallel", "context parallelism with LoRA adapters is not supported yet");
  if (c.dist.cpu_offload && c.dist.sharding != Sharding::kFullShard)
    fail("dist.cpu_offload", concat("offloads the shards of full_shard; set dist.sharding: full_shard (it is ",
                                    kShardings.name(c.dist.sharding), ")"));
  if (const auto& p = c.train.profile_steps; !p.empty() && (p.size() != 2 || p[0] > p[1])) {
    std::string given;
    for (const auto s : p) given += (given.empty() ? "" : ", ") + std::to_string(s);
    fail("train.profile_steps", concat("expected [first, last] with first <= last, got [", given, "]"));
  }
  if (c.model.from.empty() && c.tokenizer.path.empty())
    fail("tokenizer.path", "required key is missing; expected a tokenizer file (or set model.from)");
}

/// What a path key names; kModel and kTokenizer (a model folder, a tokenizer
/// file or folder) may also be Hub ids read from the local cache.
enum Kind { kFile, kFolder, kModel, kTokenizer };

void must_exist(const Fail& fail, const char* key, const std::string& path, Kind kind) {
  if (path.empty()) return;
  std::error_code ec;
  const bool hub = kind == kModel || kind == kTokenizer;
  const auto local = hub ? hub::local_path(path) : std::filesystem::path(path);
  const bool file = std::filesystem::is_regular_file(local, ec), folder = std::filesystem::is_directory(local, ec);
  const bool ok = kind == kFile ? file : kind == kFolder || kind == kModel ? folder : file || folder;
  if (!ok)
    fail(key, concat("expected an existing ",
                     kind == kFile                       ? "file"
                     : kind == kFolder || kind == kModel ? "folder"
                                                         : "file or folder",
                     ", got \"", path, "\" (paths are relative to the working directory)",
                     hub ? hub_note(path) : std::string()));
}

void check_data(const RunConfig& c, const Fail& fail) {
  if (c.data.train.empty())
    fail("data.train", "required key is missing; expected a list of datasets (- path: train.jsonl)");
  auto check_list = [&](const char* key, const std::vector<DatasetConfig>& list, bool train) {
    size_t weighted = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& d = list[i];
      const auto item = concat(key, "[", i, "]");
      std::error_code ec;
      if (!std::filesystem::exists(d.path, ec) &&
          !std::filesystem::exists(d.path + ".idx", ec))  // or a Megatron PREFIX
        fail(item + ".path", concat("expected an existing file or folder, got \"", d.path,
                                    "\" (paths are relative to the working directory)"));
      const int modes = (d.fraction > 0) + (d.size > 0) + (d.weight > 0);
      if (train && modes > 1) fail(item + ".fraction", "set at most one of fraction, size and weight for a dataset");
      weighted += d.weight > 0;
    }
    if (train && weighted > 0 && weighted != list.size())
      fail(concat(key, "[0].weight"), concat("either every dataset of ", key, " has a weight or none has; ", weighted,
                                             " of ", list.size(), " do"));
  };
  check_list("data.train", c.data.train, true);
  check_list("data.eval", c.data.eval, false);
  must_exist(fail, "tokenizer.path", c.tokenizer.path, kTokenizer);
  if (!c.model.from.empty() && !std::filesystem::is_directory(hub::local_path(c.model.from))) {
    // A Hub name ("Qwen/Qwen2.5-0.5B") is read from the local Hugging Face cache; no hub is reached at run time.
    fail("model.from", concat("expected an existing model folder, got \"", c.model.from,
                              "\" (paths are relative to the working directory)", hub_note(c.model.from)));
  }
}

void check_run(const RunConfig& c, const Fail& fail) {
  must_exist(fail, "train.resume_from", c.train.resume_from, kFolder);
  if (!c.train.resume_from.empty() && c.train.resume == Resume::kNever)
    fail("train.resume_from", "cannot be set together with train.resume: never");
  const auto& d = c.train.device;
  if (!(d == "cpu" || d == "cuda" || d.rfind("cuda:", 0) == 0))
    fail("train.device", concat("expected cpu, cuda or cuda:N, got \"", d, "\""));
}

// ---- keys that only some algorithms read (read_if_declared) -----------------

using Value = std::variant<bool, int64_t, double, std::string, std::vector<double>, std::vector<int64_t>,
                           std::vector<std::string>>;

/// One key of a config: where it is (data.train[1].size), the name the
/// reference gives it (data.train[].size), its value and who reads it.
struct Key {
  std::string path, name;
  Value value;
  bool declared = false;
  std::optional<double> off;
  bool changeable_on_resume = false;
  std::string old_name = {};  // the key's former name (renamed_from), as `name` is written
};

/// Lists every key of a config, a list's items one by one; with `one_item`,
/// each list as one default item (the keys as the reference names them).
class KeyLister {
 public:
  explicit KeyLister(bool one_item) : one_item_(one_item) {}
  template <class T>
  void field(const char* key, T& value, const char*, const Rule& rule = {}) {
    keys.push_back({path_ + key, name_ + key, Value(std::in_place_type<T>, value), rule.declared, rule.off,
                    rule.changeable_on_resume, rule.old_name.empty() ? "" : name_ + rule.old_name});
  }
  template <class S>
  void section(const char* key, S& s, const char*) {
    const auto saved = std::make_pair(path_, name_);
    path_ += std::string(key) + ".";
    name_ += std::string(key) + ".";
    s.visit(*this);
    std::tie(path_, name_) = saved;
  }
  template <class S>
  void list(const char* key, std::vector<S>& items, const char* doc) {
    list_of(key, ListRef::of(items), doc);
  }
  void list_of(const char* key, const ListRef& items, const char*) {
    const auto saved = std::make_pair(path_, name_);
    name_ += std::string(key) + "[].";
    detail::FieldVisitorFor<KeyLister> fields(*this);
    if (one_item_) {
      path_ = name_;
      items.visit_default(fields);
    }
    for (size_t i = 0; !one_item_ && i < items.size(); ++i) {
      path_ = concat(saved.first, key, "[", i, "].");
      items.visit(i, fields);
    }
    std::tie(path_, name_) = saved;
  }
  std::vector<Key> keys;

 private:
  bool one_item_;
  std::string path_, name_;
};

std::vector<Key> keys_of(RunConfig& cfg, bool one_item) {
  KeyLister lister(one_item);
  cfg.visit(lister);
  return std::move(lister.keys);
}

/// Every key with its default value, named as the reference names it.
std::vector<Key> default_keys() {
  RunConfig defaults;
  return keys_of(defaults, true);
}

std::string section_of(const std::string& key) { return key.substr(0, key.find_first_of(".[")); }

// The algorithms registered with the keys they read (add_algorithm_name).
struct DeclaredReads {
  std::mutex mutex;
  std::map<std::string, std::set<std::string>> by_algorithm;
};
DeclaredReads& declared_reads() {
  static DeclaredReads d;
  return d;
}

bool algorithm_reads(const std::string& algorithm, const Key& key) {
  if (!key.declared) return true;
  auto& d = declared_reads();
  std::lock_guard<std::mutex> lock(d.mutex);
  // One registered without a list is taken to read every key.
  const auto it = d.by_algorithm.find(algorithm);
  return it == d.by_algorithm.end() || it->second.count(key.name);
}

std::string readers(const Key& key) {
  std::string out;
  for (const auto& a : readers_of(key.name)) out += (out.empty() ? "" : ", ") + a;
  return out;
}

bool is_off(const Key& key) {
  if (!key.off) return false;
  if (const auto* i = std::get_if<int64_t>(&key.value)) return static_cast<double>(*i) == *key.off;
  if (const auto* x = std::get_if<double>(&key.value)) return *x == *key.off;
  if (const auto* b = std::get_if<bool>(&key.value)) return (*b ? 1.0 : 0.0) == *key.off;
  return false;
}

/// A key the run's algorithm does not read, set to another value than its
/// default (a printed config sets every key, to its default), is an error.
void check_unread_keys(const RunConfig& c, const Fail& fail) {
  std::map<std::string, Value> defaults;
  for (auto& k : default_keys()) defaults.emplace(k.name, std::move(k.value));
  RunConfig given = c;
  for (const auto& k : keys_of(given, false)) {
    // A section of another algorithm is an error of its own (config.cpp).
    if (const auto owner = section_algorithm(section_of(k.path)); !owner.empty() && owner != c.algorithm) continue;
    const auto d = defaults.find(k.name);
    if (algorithm_reads(c.algorithm, k) || is_off(k) || (d != defaults.end() && d->second == k.value)) continue;
    fail(k.path, concat("not read by algorithm ", c.algorithm, " (read by ", readers(k), "); remove it"));
  }
}

// ---- model keys that only some families read (FamilyKeys) -----------------

struct FamilyRegistry {
  std::mutex mutex;
  std::vector<ModelKeyGroup> groups;
  std::vector<FamilyKeys> families;
};
FamilyRegistry& family_registry() {
  static FamilyRegistry r;
  return r;
}

std::vector<FamilyKeys> families() {
  auto& r = family_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.families;
}

std::vector<ModelKeyGroup> key_groups() {
  auto& r = family_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.groups;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

/// A model built from keys (not model.from, whose keys check_model refuses):
/// a key that only some families read, set to another value than its default
/// for a family that does not read it, is an error; then the key groups' and
/// the family's own checks.
void check_family_keys(const RunConfig& c, const Fail& fail) {
  if (!c.model.from.empty()) return;
  const auto all = families();
  const auto family =
      std::find_if(all.begin(), all.end(), [&](const FamilyKeys& f) { return f.name == c.model.family; });
  if (family == all.end()) return;  // model.family's own rule reports it
  std::map<std::string, Value> defaults;
  for (auto& k : default_keys())
    if (k.name.rfind("model.", 0) == 0) defaults.emplace(k.name, std::move(k.value));
  RunConfig given = c;
  for (const auto& k : keys_of(given, false)) {
    const auto readers = model_families_reading(k.name);
    if (readers.empty() || std::count(family->reads.begin(), family->reads.end(), k.name)) continue;
    if (const auto d = defaults.find(k.name); d != defaults.end() && d->second == k.value) continue;
    fail(k.path, concat("applies to model.family ", joined(readers), " only, not ", c.model.family));
  }
  for (const auto& g : key_groups())
    if (g.check) g.check(c.model, Checks(fail));
  if (family->check) family->check(c.model, Checks(fail));
}

}  // namespace

void add_algorithm_name(const std::string& name, const std::vector<std::string>& reads) {
  std::set<std::string> known;
  for (const auto& k : default_keys()) known.insert(k.name);
  for (const auto& key : reads)
    if (!known.count(key))
      throw ConfigError(concat("algorithm ", name, ": reads \"", key,
                               "\", which is not a config key (keys are named "
                               "as keys_read_by names them, e.g. data.train[].response_field)"));
  add_algorithm_name(name);
  auto& d = declared_reads();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.by_algorithm[name] = std::set<std::string>(reads.begin(), reads.end());
}

namespace {

/// The model section's keys (model.*) as registered so far.
std::set<std::string> model_keys() {
  std::set<std::string> known;
  for (const auto& k : default_keys())
    if (k.name.rfind("model.", 0) == 0) known.insert(k.name);
  return known;
}

/// The keys of `make`'s struct, as model.* names.
std::vector<std::string> keys_of_group(const std::function<std::unique_ptr<Extension>()>& make) {
  KeyLister lister(true);
  auto defaults = make();
  detail::ExtensionShim shim{*defaults};
  shim.visit(lister);
  std::vector<std::string> out;
  for (const auto& k : lister.keys) out.push_back("model." + k.name);
  return out;
}

bool is_group_or_family(const FamilyRegistry& r, const std::string& name) {
  for (const auto& g : r.groups)
    if (g.name == name) return true;
  for (const auto& f : r.families)
    if (f.name == name) return true;
  return false;
}

void check_name(const std::string& what, const std::string& name) {
  if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
    throw ConfigError(concat(what, " \"", name, "\": expected a name of a-z, 0-9 and _"));
}

}  // namespace

void add_model_key_group(ModelKeyGroup group) {
  check_name("model key group", group.name);
  if (!group.keys) throw ConfigError(concat("model key group ", group.name, ": it has no keys"));
  const auto known = model_keys();
  for (const auto& key : keys_of_group(group.keys))
    if (known.count(key))
      throw ConfigError(concat("model key group ", group.name, ": its key \"", key, "\" is already a model key"));
  auto& r = family_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (is_group_or_family(r, group.name))
    throw ConfigError(concat("model key group \"", group.name, "\": the name is already registered"));
  r.groups.push_back(std::move(group));
}

std::vector<ModelKeyGroup> model_key_groups() { return key_groups(); }

void add_model_family(FamilyKeys family) {
  check_name("model family", family.name);
  const auto known = model_keys();
  for (const auto& key : family.reads)
    if (!known.count(key))
      throw ConfigError(concat("model family ", family.name, ": reads \"", key,
                               "\", which is not a key of the model section (e.g. model.sliding_window)"));
  // Its own keys: new keys of the model section, read by it alone.
  if (family.own_keys) {
    for (const auto& key : keys_of_group(family.own_keys)) {
      if (known.count(key))
        throw ConfigError(concat("model family ", family.name, ": its own key \"", key, "\" is already a model key"));
      family.reads.push_back(key);
    }
  }
  auto& r = family_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (is_group_or_family(r, family.name))
    throw ConfigError(concat("model family \"", family.name, "\" is already registered"));
  r.families.push_back(std::move(family));
}

std::vector<FamilyKeys> model_families() { return families(); }

std::vector<std::string> model_family_names() {
  std::vector<std::string> out;
  for (const auto& f : families()) out.push_back(f.name);
  return out;
}

std::vector<std::string> model_families_reading(const std::string& key) {
  std::vector<std::string> out;
  for (const auto& f : families())
    if (std::count(f.reads.begin(), f.reads.end(), key)) out.push_back(f.name);
  return out;
}

std::vector<std::string> keys_read_by(const std::string& algorithm) {
  const auto names = algorithm_names();
  if (std::find(names.begin(), names.end(), algorithm) == names.end())
    throw ConfigError(concat("keys_read_by: no algorithm \"", algorithm, "\" is registered"));
  std::vector<std::string> out;
  for (const auto& k : default_keys()) {
    const auto owner = section_algorithm(section_of(k.name));
    if ((owner.empty() || owner == algorithm) && algorithm_reads(algorithm, k)) out.push_back(k.name);
  }
  return out;
}

std::vector<std::string> dataset_keys(const std::vector<std::string>& fields) {
  std::vector<std::string> out;
  for (const char* list : {"data.train[].", "data.eval[]."})
    for (const auto& f : fields) out.push_back(list + f);
  return out;
}

std::vector<std::string> readers_of(const std::string& key) {
  std::vector<std::string> out;
  const auto names = algorithm_names();
  auto& d = declared_reads();
  std::lock_guard<std::mutex> lock(d.mutex);
  for (const auto& a : names)
    if (const auto it = d.by_algorithm.find(a); it != d.by_algorithm.end() && it->second.count(key)) out.push_back(a);
  return out;
}

void Checks::model_folder(const std::string& key, const std::string& path) const {
  std::error_code ec;
  const auto local = path.empty() ? std::filesystem::path() : hub::local_path(path);
  if (path.empty() || !std::filesystem::is_directory(local, ec)) return must_exist(fail_, key.c_str(), path, kModel);
  // The folder is read only once the run has loaded its data; a folder that cannot be a model fails here.
  if (!std::filesystem::is_regular_file(local / "config.json", ec) &&
      !std::filesystem::is_regular_file(local / "adapter_config.json", ec))
    fail_(key, concat("expected a model folder, got \"", path,
                      "\", which holds neither config.json (a Hugging Face model folder, an Anvil checkpoint or "
                      "export) nor adapter_config.json (a LoRA adapter folder)"));
}

bool may_change_on_resume(const std::string& key) {
  // A list item's key by the list's: ppo.rewards[1].timeout_s is ppo.rewards[].timeout_s.
  std::string name;
  for (size_t i = 0; i < key.size(); ++i) {
    name += key[i];
    if (key[i] != '[') continue;
    const auto close = key.find(']', i);
    if (close == std::string::npos) return false;
    i = close - 1;
  }
  for (const auto& k : default_keys())
    if (k.name == name) return k.changeable_on_resume;
  return false;
}

std::map<std::string, std::string> old_key_names() {
  std::map<std::string, std::string> out;
  for (const auto& k : default_keys())
    if (!k.old_name.empty()) out.emplace(k.old_name, k.name);
  return out;
}

bool follows_from_failed(const std::string& message, const std::set<std::string>& failed) {
  const auto word = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (const auto& key : failed)
    for (auto at = message.find(key); at != std::string::npos; at = message.find(key, at + 1)) {
      const auto end = at + key.size();
      // The key itself or a key inside it (data.train[0].path in data.train), not one that ends or starts like it.
      if ((at == 0 || !(word(message[at - 1]) || message[at - 1] == '.')) &&
          (end == message.size() || !word(message[end])))
        return true;
    }
  return false;
}

void validate(const RunConfig& c, const FlatConfig& flat, const std::string& sources,
              const std::set<std::string>& failed, Errors& errors) {
  const Fail fail = [&](const std::string& key, const std::string& what) {
    if (follows_from_failed(concat(key, ": ", what), failed)) return;
    auto it = flat.find(key);
    auto where = it == flat.end() ? sources : it->second.where;
    auto place = it == flat.end() ? Place{} : place_of(it->second);
    // A key inside a list item (data.train[1].path): point at the item's line.
    if (const auto lb = key.find('['); it == flat.end() && lb != std::string::npos) {
      if (auto base = flat.find(key.substr(0, lb)); base != flat.end() && base->second.node.IsSequence()) {
        const auto idx = std::stoul(key.substr(lb + 1));
        const auto dot = key.find("].");
        const YAML::Node item = base->second.node[idx];
        YAML::Node n = item;
        if (dot != std::string::npos && item.IsMap() && item[key.substr(dot + 2)]) n = item[key.substr(dot + 2)];
        where = base->second.file.rfind("command line", 0) == 0 ? base->second.where : where_of(base->second.file, n);
        place = {base->second.order, line_of(n)};
      }
    }
    errors.add(concat(where, ": ", key, ": ", what), place);
  };
  check_model(c, flat, fail);
  check_family_keys(c, fail);
  check_training(c, flat, fail);
  check_lora(c, flat, fail);
  check_data(c, fail);
  check_run(c, fail);
  // The registered sections' own checks (the built-in objectives' among them),
  // for the sections this run reads.
  const Checks checks(fail);
  for (const auto& s : registered_sections())
    if (s.check && (s.algorithm.empty() || s.algorithm == c.algorithm)) s.check(c, checks);
  check_unread_keys(c, fail);
}

}  // namespace anvil::config
