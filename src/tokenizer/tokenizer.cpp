// The public tokenizer factory: picks a backend for a file or model folder and
// reads the special-token settings saved beside it.
#include <nlohmann/json.hpp>

#include "anvil/core/error.h"
#include "core/fs.h"
#include "core/hub_cache.h"
#include "core/logging.h"
#include "anvil/tokenizer/tokenizer.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include "backends.h"

namespace anvil::tokenizer {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

constexpr const char* kHfFile = "tokenizer.json";
constexpr const char* kSentencePieceFile = "tokenizer.model";
constexpr const char* kConfigFile = "tokenizer_config.json";
constexpr const char* kSpecialTokensMapFile = "special_tokens_map.json";

json read_json_object(const stdfs::path& file) {
  json j;
  try {
    j = json::parse(fs::read_file(file));
  } catch (const json::exception& e) {
    throw Error(concat(file.string(), ": not valid JSON: ", e.what()));
  }
  if (!j.is_object()) throw Error(concat(file.string(), ": expected a JSON object"));
  return j;
}

// A token is written as a string, as an AddedToken object {"content": ...},
// or as null (none).
std::optional<std::string> token_entry(const json& j, const char* key, const stdfs::path& file) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  throw Error(concat(file.string(), ": ", key, ": expected a token string, an object with \"content\", or null"));
}

std::optional<bool> bool_entry(const json& j, const char* key, const stdfs::path& file) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) throw Error(concat(file.string(), ": ", key, ": expected true, false or null"));
  return it->get<bool>();
}

std::unique_ptr<Tokenizer> load_hf_file(const stdfs::path& file) {
  const auto cfg = detail::read_special_token_config(file.parent_path());
  auto tok = detail::make_hf_tokenizer(file, cfg);
  tok->set_chat_template(cfg.chat_template);
  return tok;
}

std::unique_ptr<Tokenizer> load_sentencepiece_file(const stdfs::path& file) {
  const auto cfg = detail::read_special_token_config(file.parent_path());
  auto tok = detail::make_sentencepiece_tokenizer(file, cfg);
  tok->set_chat_template(cfg.chat_template);
  return detail::with_saved_special_tokens(std::move(tok), file.parent_path());
}

// chat_template: a string, or (transformers' multi-template form) a list of
// {"name", "template"} of which "default" is the one used.
std::string chat_template_entry(const json& j, const stdfs::path& file) {
  const auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& t : *it)
      if (t.is_object() && t.value("name", json()) == "default" && t.contains("template") && t["template"].is_string())
        return t["template"].get<std::string>();
    return "";
  }
  throw Error(concat(file.string(),
                     ": chat_template: expected a Jinja template string or a list of "
                     "{\"name\", \"template\"}"));
}

}  // namespace

namespace detail {

SpecialTokenConfig read_special_token_config(const stdfs::path& dir) {
  SpecialTokenConfig cfg;
  const auto config_file = dir / kConfigFile;
  const auto map_file = dir / kSpecialTokensMapFile;
  const bool has_config = stdfs::is_regular_file(config_file);
  const bool has_map = stdfs::is_regular_file(map_file);
  const json config = has_config ? read_json_object(config_file) : json::object();
  const json map = has_map ? read_json_object(map_file) : json::object();
  cfg.source = has_config ? config_file : (has_map ? map_file : stdfs::path());
  const auto token = [&](const char* key) {
    auto v = token_entry(config, key, config_file);
    return v ? v : token_entry(map, key, map_file);
  };
  cfg.bos = token("bos_token");
  cfg.eos = token("eos_token");
  cfg.pad = token("pad_token");
  cfg.add_bos = bool_entry(config, "add_bos_token", config_file);
  cfg.add_eos = bool_entry(config, "add_eos_token", config_file);
  if (has_config) cfg.config_json = config.dump();
  cfg.chat_template = chat_template_entry(config, config_file);
  // transformers >= 4.43 may keep the template in its own file.
  if (cfg.chat_template.empty() && stdfs::is_regular_file(dir / "chat_template.jinja"))
    cfg.chat_template = fs::read_file(dir / "chat_template.jinja");
  return cfg;
}

std::string tokenizer_config_text(const nlohmann::json& config) {
  // nlohmann::json holds such a number as a double; each is swapped for a
  // string marker the text does not hold, and the marker for the integer's digits.
  auto j = config;
  const auto plain = config.dump(2);
  std::vector<std::pair<std::string, std::string>> swaps;
  const std::function<void(json&)> walk = [&](json& v) {
    if (v.is_structured()) {
      for (auto& item : v) walk(item);
    } else if (v.is_number_float()) {
      const double x = v.get<double>();
      if (!std::isfinite(x) || std::floor(x) != x || std::fabs(x) < 9223372036854775808.0) return;
      char digits[400];
      std::snprintf(digits, sizeof digits, "%.0f", x);  // glibc prints a double's exact value
      std::string marker;
      for (int k = static_cast<int>(swaps.size());; ++k)
        if (marker = concat("anvil-whole-number-", k); plain.find(marker) == std::string::npos) break;
      swaps.emplace_back("\"" + marker + "\"", digits);
      v = marker;
    }
  };
  walk(j);
  auto text = j.dump(2);
  for (const auto& [marker, digits] : swaps) text.replace(text.find(marker), marker.size(), digits);
  return text + "\n";
}

void write_tokenizer_config(const stdfs::path& dir, const Tokenizer& tok, const std::string& source_config,
                            const char* default_class) {
  json j = source_config.empty() ? json::object() : json::parse(source_config, nullptr, false);
  if (!j.is_object()) j = json::object();  // checked when it was read
  if (!j.contains("tokenizer_class") || !j["tokenizer_class"].is_string()) j["tokenizer_class"] = default_class;
  const auto token = [&](const char* key, int64_t id) {
    if (id >= 0) j[key] = tok.decode({id}, /*skip_special_tokens=*/false);
  };
  token("bos_token", tok.bos_id());
  token("eos_token", tok.eos_id());
  token("pad_token", tok.pad_id());
  j["add_bos_token"] = tok.add_bos();
  if (!j.contains("add_eos_token")) j["add_eos_token"] = false;
  if (tok.chat_template().empty())
    j.erase("chat_template");
  else
    j["chat_template"] = tok.chat_template();
  fs::write_file_atomic(dir / kConfigFile, tokenizer_config_text(j));
}

}  // namespace detail

std::string fingerprint(const Tokenizer& tok) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  const auto mix = [&h](std::string_view bytes) {
    for (const unsigned char c : bytes) {
      h ^= c;
      h *= 1099511628211ull;
    }
  };
  const auto number = [&](int64_t v) { mix(std::to_string(v) + ";"); };
  number(tok.vocab_size());
  number(tok.bos_id());
  number(tok.eos_id());
  number(tok.pad_id());
  for (int64_t id = 0; id < tok.vocab_size(); ++id) {
    const auto text = tok.decode({id}, /*skip_special_tokens=*/false);
    number(static_cast<int64_t>(text.size()));
    mix(text);
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(h));
  return out;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& type, const stdfs::path& path_or_id) {
  const auto path = hub::local_path(path_or_id.string());  // a Hub id names its cached snapshot
  if (type != "auto" && type != "hf" && type != "sentencepiece")
    throw ConfigError(
        concat("tokenizer.type: unknown tokenizer type \"", type, "\"; expected auto, hf or sentencepiece"));
  if (!stdfs::exists(path)) throw Error(concat(path.string(), ": tokenizer file or folder not found"));
  const bool dir = stdfs::is_directory(path);
  if (type == "hf") return load_hf_file(dir ? path / kHfFile : path);
  if (type == "sentencepiece") return load_sentencepiece_file(dir ? path / kSentencePieceFile : path);
  if (dir) return load_tokenizer_from_model_dir(path);
  if (path.extension() == ".json") return load_hf_file(path);
  return load_sentencepiece_file(path);
}

bool has_tokenizer(const stdfs::path& dir) {
  return stdfs::is_regular_file(dir / kHfFile) || stdfs::is_regular_file(dir / kSentencePieceFile);
}

std::unique_ptr<Tokenizer> load_tokenizer_from_model_dir(const stdfs::path& dir_or_id) {
  const auto dir = hub::local_path(dir_or_id.string());
  const bool has_sp = stdfs::is_regular_file(dir / kSentencePieceFile);
  if (stdfs::is_regular_file(dir / kHfFile)) {
    if (!has_sp) return load_hf_file(dir / kHfFile);
    // Both, as in LLaMA-2 folders: tokenizer.json, as transformers'
    // AutoTokenizer does, unless its pipeline is one the HF backend does not
    // read (a Unigram model): then the original tokenizer.model.
    try {
      return load_hf_file(dir / kHfFile);
    } catch (const Error& e) {
      log::warn("using ", (dir / kSentencePieceFile).string(), " because ", e.what());
    }
  }
  if (has_sp) return load_sentencepiece_file(dir / kSentencePieceFile);
  throw Error(concat(dir.string(), ": no tokenizer found (expected ", kHfFile, " or ", kSentencePieceFile, ")"));
}

}  // namespace anvil::tokenizer
