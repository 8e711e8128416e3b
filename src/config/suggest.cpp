// Did-you-mean for a key no section has: another trainer's name for one of
// ours first (transformers' and TRL's argument names), then a known key of
// the same section a few edits away or one the key begins. A suggestion
// stays in the key's section when that section exists: ppo.beta is GRPO's
// KL coefficient (ppo.kl_coef), not dpo.beta one letter away.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "config_internal.h"
#include "config/hf_names.h"

namespace anvil::config {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

/// The top-level section of a key: "data" for data.train[0].path.
std::string top_section(const std::string& key) { return key.substr(0, key.find_first_of(".[")); }

/// transformers' TrainingArguments names (and those every TRL trainer
/// shares) -> our keys, in whatever section they are written. "key=value"
/// where their switch is one value of our key.
const std::map<std::string, std::string>& common_foreign_names() {
  static const std::map<std::string, std::string> names = {
      {"learning_rate", "optimizer.lr"},
      {"adam_epsilon", "optimizer.eps"},
      {"epsilon", "optimizer.eps"},
      {"adam_beta1", "optimizer.betas"},
      {"adam_beta2", "optimizer.betas"},
      {"optim", "optimizer.name"},
      {"weight_decay", "optimizer.weight_decay"},
      {"per_device_train_batch_size", "train.micro_batch_size"},
      {"batch_size", "train.micro_batch_size"},
      {"train_batch_size", "train.micro_batch_size"},
      {"gradient_accumulation_steps", "train.grad_accum_steps"},
      {"max_grad_norm", "train.grad_clip"},
      {"logging_steps", "train.log_every"},
      {"save_steps", "train.save_every"},
      {"eval_steps", "train.eval_every"},
      {"save_total_limit", "train.keep_checkpoints"},
      {"gradient_checkpointing", "train.activation_checkpointing"},
      {"bf16", "dist.param_dtype=bfloat16"},
      {"fp16", "dist.param_dtype=float16"},
      {"per_device_eval_batch_size", "eval.batch_size"},
      {"warmup_steps", "schedule.warmup_steps"},
      {"warmup_ratio", "schedule.warmup_ratio"},
      {"num_train_epochs", "train.num_train_epochs"},
      {"lr_scheduler_type", "schedule.decay"},
      {"max_seq_length", "data.max_length"},
      {"max_length", "data.max_length"},
      {"packing", "data.packing"},
      {"logging_dir", "logging.tensorboard_dir"},
      {"lora_alpha", "lora.alpha"},
      {"lora_dropout", "lora.dropout"},
      {"lora_r", "lora.r"},
  };
  return names;
}

/// Our key (or key=value) that `name`, the last part of the unknown key
/// `path`, means in another trainer's words; "" when none. `own`: the names
/// a registered section gave for its keys, in that section (TRL's GRPOConfig
/// beta there is ppo.kl_coef), then transformers' common names anywhere;
/// otherwise the names of every registered section, for a key outside all of
/// them (train.num_generations), since in another algorithm's section they
/// would point at the wrong one (kto.loss_type is not ppo.loss_aggregation).
std::string foreign_key(const std::string& path, const std::string& name, const std::set<std::string>& known,
                        bool own) {
  const auto section = top_section(path);
  const auto fits = [&](const std::string& ours) {
    return ours != path && known.count(ours.substr(0, ours.find('=')));
  };
  const auto sections = registered_sections();
  const bool registered =
      std::any_of(sections.begin(), sections.end(), [&](const RegisteredSection& s) { return s.name == section; });
  for (const auto& s : sections) {
    if (own != (s.name == section) || (!own && registered)) continue;
    for (const auto& [theirs, ours] : s.foreign_names)
      if (theirs == name && fits(ours)) return ours;
  }
  if (!own) return "";
  const auto it = common_foreign_names().find(name);
  return it != common_foreign_names().end() && fits(it->second) ? it->second : "";
}

/// The known key nearest to `path` (fewer than 4 edits), or the shortest one
/// it begins (train.micro_batch -> train.micro_batch_size); within `path`'s
/// section when the config has that section. "" when none.
std::string nearest_key(const std::string& path, const std::set<std::string>& known) {
  const auto section = top_section(path);
  const bool known_section =
      std::any_of(known.begin(), known.end(), [&](const std::string& k) { return top_section(k) == section; });
  std::string best;
  size_t best_d = 4;
  for (const auto& k : known) {
    if (known_section && top_section(k) != section) continue;
    const auto d = edit_distance(path, k);
    if (d < best_d) best_d = d, best = k;
  }
  if (best.empty())
    for (const auto& k : known)
      if (k.size() > path.size() && k.rfind(path, 0) == 0 && k.find('.', path.size()) == std::string::npos &&
          (best.empty() || k.size() < best.size()))
        best = k;
  return best;
}

}  // namespace

std::string unknown_key_hint(const std::string& path, const std::set<std::string>& known) {
  const auto dot = path.rfind('.');
  const auto name = dot == std::string::npos ? path : path.substr(dot + 1);
  const auto foreign = [&](const std::string& ours) {
    return concat("; did you mean ", ours, "? (", name, " is the TRL / transformers name)");
  };
  if (top_section(path) == "model")
    for (const auto& n : model_hf_names())
      if (name == n.name && known.count(concat("model.", n.key)))
        return concat("; did you mean model.", n.key, "? (", name, " is ", n.whose, " config.json name)");
  if (const auto ours = foreign_key(path, name, known, /*own=*/true); !ours.empty()) return foreign(ours);
  if (const auto best = nearest_key(path, known); !best.empty()) return concat("; did you mean ", best, "?");
  if (const auto ours = foreign_key(path, name, known, /*own=*/false); !ours.empty()) return foreign(ours);
  return "";
}

}  // namespace anvil::config
