#pragma once
// The tokenizer backends behind anvil/tokenizer/tokenizer.h's factory, and
// the special-token settings a model folder keeps beside its tokenizer file.

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "anvil/tokenizer/tokenizer.h"

namespace anvil::tokenizer::detail {

/// tokenizer_config.json / special_tokens_map.json beside a tokenizer file.
/// Each token comes from tokenizer_config.json, or from special_tokens_map.json
/// when tokenizer_config.json does not name it.
struct SpecialTokenConfig {
  std::optional<std::string> bos, eos, pad;  // token strings
  std::optional<bool> add_bos, add_eos;
  std::filesystem::path source;  // the file they came from, for messages ("" if none)
  std::string config_json;       // tokenizer_config.json's text, when there is one (kept for save())
  std::string chat_template;     // tokenizer_config.json's chat_template, or chat_template.jinja
};

/// Reads `dir`/tokenizer_config.json and `dir`/special_tokens_map.json; either
/// may be missing. Throws Error naming the file and key on malformed content.
SpecialTokenConfig read_special_token_config(const std::filesystem::path& dir);

/// Writes `dir`/tokenizer_config.json for `tok`: the keys of `source_config`
/// (a JSON object's text, or "") with tokenizer_class (`default_class` when the source
/// names none), the special tokens, add_bos_token and the chat template set.
void write_tokenizer_config(const std::filesystem::path& dir, const Tokenizer& tok, const std::string& source_config,
                            const char* default_class);

/// `config` as tokenizer_config.json's text (indented, with a final newline).
/// A whole number past int64's range is written as the integer it is, as
/// Python's json writes it: transformers' VERY_LARGE_INTEGER, int(1e30),
/// saved as model_max_length = 1000000000000000019884624838656 when a
/// tokenizer records no limit, is read back as a double and would otherwise
/// come out as the float 1e+30.
std::string tokenizer_config_text(const nlohmann::json& config);

std::unique_ptr<Tokenizer> make_hf_tokenizer(const std::filesystem::path& tokenizer_json,
                                             const SpecialTokenConfig& cfg);
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::filesystem::path& model_file,
                                                        const SpecialTokenConfig& cfg);

/// `base` with the special tokens `dir`/added_tokens.json lists (a saved
/// SentencePiece folder's added tokens), or `base` itself when there is none.
std::unique_ptr<Tokenizer> with_saved_special_tokens(std::unique_ptr<Tokenizer> base, const std::filesystem::path& dir);

}  // namespace anvil::tokenizer::detail
