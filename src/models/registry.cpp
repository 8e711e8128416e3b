#include "anvil/models/registry.h"

#include "anvil/core/error.h"

namespace anvil::models {
namespace gpt2 { ModelFamily family(); }
namespace llama { ModelFamily family(); }
namespace neox { ModelFamily family(); }

namespace {
// One line per family.
const std::vector<ModelFamily>& families() {
  static const std::vector<ModelFamily> all = {
      gpt2::family(),
      llama::family(),
      neox::family(),
  };
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

std::vector<std::string> family_names() {
  std::vector<std::string> out;
  for (const auto& f : families()) out.push_back(f.name);
  return out;
}

}  // namespace anvil::models
