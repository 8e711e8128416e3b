#pragma once
// Reading a Hugging Face config.json into a family's options, with messages
// that name the file and the key. Internal to src/models/.

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "anvil/core/error.h"
#include "anvil/models/causal_lm.h"
#include "models/layers.h"

namespace anvil::models {

class HfConfigReader {
 public:
  HfConfigReader(const nlohmann::json& j, std::string where, std::string family)
      : j_(j), where_(std::move(where)), family_(std::move(family)) {}

  /// The value under `key`, or nullptr when missing or null.
  const nlohmann::json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw CheckpointError(concat(where_, ": ", key, ": ", what));
  }
  /// Required when `def` is nullopt.
  int64_t integer(const char* key, std::optional<int64_t> def = std::nullopt) const {
    const auto* v = find(key);
    if (!v) {
      if (!def) fail(key, concat("required ", family_, " field is missing"));
      return *def;
    }
    if (!v->is_number_integer()) fail(key, concat("expected an integer, got ", v->dump()));
    // Sizes and counts: at least 1, or 0 where 0 is the field's "derive it" default.
    const int64_t x = v->get<int64_t>(), lo = def && *def == 0 ? 0 : 1;
    if (x < lo) fail(key, concat("expected an integer >= ", lo, ", got ", x));
    return x;
  }
  /// What a real-valued field may hold.
  enum class Bound { non_negative, positive, probability };
  double number(const char* key, double def, Bound bound = Bound::non_negative) const {
    const auto* v = find(key);
    if (!v) return def;
    if (!v->is_number()) fail(key, concat("expected a number, got ", v->dump()));
    const double x = v->get<double>();
    const bool ok =
        std::isfinite(x) && (bound == Bound::positive ? x > 0 : x >= 0) && (bound != Bound::probability || x < 1);
    if (!ok)
      fail(key, concat(bound == Bound::positive      ? "expected a number > 0"
                       : bound == Bound::probability ? "expected a probability in [0, 1)"
                                                     : "expected a number >= 0",
                       ", got ", v->dump()));
    return x;
  }
  bool boolean(const char* key, bool def) const {
    const auto* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) fail(key, concat("expected true or false, got ", v->dump()));
    return v->get<bool>();
  }
  std::string string(const char* key, const std::string& def) const {
    const auto* v = find(key);
    if (!v) return def;
    if (!v->is_string()) fail(key, concat("expected a string, got ", v->dump()));
    return v->get<std::string>();
  }
  /// `layer_types`: one "full_attention" or "sliding_attention" per layer;
  /// empty when the key is missing.
  std::vector<std::string> layer_types(int64_t layers) const {
    std::vector<std::string> types;
    const auto* lt = find("layer_types");
    if (!lt) return types;
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != layers)
      fail("layer_types", concat("expected a list of ", layers, " layer types, got ", lt->dump()));
    for (const auto& t : *lt) {
      if (t != "full_attention" && t != "sliding_attention")
        fail("layer_types", concat("layer type ", t.dump(),
                                   " is not supported; expected \"full_attention\" or \"sliding_attention\""));
      types.push_back(t.get<std::string>());
    }
    return types;
  }
  /// The embedding's padding_idx, transformers' nn.Embedding(..., pad_token_id): -1 without one.
  int64_t padding_idx(const SpecialTokens& special, int64_t vocab_size) const {
    if (special.pad >= vocab_size) fail("pad_token_id", concat(special.pad, " is not below vocab_size ", vocab_size));
    return special.pad;
  }
  /// bos/eos/pad ids; a list of EOS ids (LLaMA 3) keeps its first.
  SpecialTokens special_tokens() const {
    auto id = [&](const char* key) -> int64_t {
      const auto* v = find(key);
      if (!v) return -1;
      if (v->is_array() && !v->empty() && (*v)[0].is_number_integer()) return (*v)[0].get<int64_t>();
      if (!v->is_number_integer()) fail(key, concat("expected a token id, got ", v->dump()));
      return v->get<int64_t>();
    };
    return {id("bos_token_id"), id("eos_token_id"), id("pad_token_id")};
  }
  /// Rotary settings from transformers 5's `rope_parameters` or the older
  /// rope_theta / rope_scaling / rotary_pct / rotary_emb_base fields.
  /// LongRoPE (Phi-3) takes its factor, when not given, from max_positions /
  /// original_max (the config's top-level original_max_position_embeddings).
  layers::RopeOptions rope(int64_t head_dim, double default_theta, double default_partial, int64_t max_positions = 0,
                           int64_t original_max = 0) const {
    layers::RopeOptions o;
    o.head_dim(head_dim);
    double theta = number("rope_theta", number("rotary_emb_base", default_theta, Bound::positive), Bound::positive);
    double partial = number("partial_rotary_factor", number("rotary_pct", default_partial));
    // The key the fraction came from, for messages (transformers 5's name, or Pythia's rotary_pct).
    const char* partial_key =
        find("partial_rotary_factor") || !find("rotary_pct") ? "partial_rotary_factor" : "rotary_pct";
    const nlohmann::json* scaling = find("rope_parameters");
    std::string key = "rope_parameters";
    if (!scaling) scaling = find("rope_scaling"), key = "rope_scaling";
    if (scaling) {
      if (!scaling->is_object()) fail(key, concat("expected an object, got ", scaling->dump()));
      HfConfigReader sub(*scaling, concat(where_, ": ", key), family_);
      theta = sub.number("rope_theta", theta, Bound::positive);
      partial = sub.number("partial_rotary_factor", partial);
      const auto type = sub.string("rope_type", sub.string("type", "default"));
      if (type == "llama3") {
        o.type("llama3")
            .factor(sub.number("factor", 8.0, Bound::positive))
            .low_freq_factor(sub.number("low_freq_factor", 1.0, Bound::positive))
            .high_freq_factor(sub.number("high_freq_factor", 4.0, Bound::positive))
            .original_max_positions(sub.integer("original_max_position_embeddings", 8192));
      } else if (type == "longrope" || type == "su") {  // "su": Phi-3's first name for it
        // HF _compute_longrope_parameters.
        const auto factors = [&](const char* k) {
          const auto* v = sub.find(k);
          if (!v || !v->is_array()) sub.fail(k, "expected a list of numbers");
          std::vector<double> out;
          for (const auto& x : *v) {
            if (!x.is_number() || !(x.get<double>() > 0)) sub.fail(k, concat("expected numbers > 0, got ", x.dump()));
            out.push_back(x.get<double>());
          }
          return out;
        };
        const auto orig = sub.integer("original_max_position_embeddings", original_max > 0 ? original_max : 4096);
        double factor = sub.number("factor", 0.0);
        if (factor == 0.0) factor = static_cast<double>(max_positions) / static_cast<double>(orig);
        const double attention =
            sub.number("attention_factor",
                       factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(static_cast<double>(orig))),
                       Bound::positive);
        o.type("longrope")
            .short_factor(factors("short_factor"))
            .long_factor(factors("long_factor"))
            .original_max_positions(orig)
            .attention_factor(attention);
      } else if (type != "default") {
        fail(key + ".rope_type", concat("\"", type, "\" is not supported; supported: default, llama3, longrope"));
      }
    }
    if (!(partial > 0 && partial <= 1)) fail(partial_key, concat("expected a fraction in (0, 1], got ", partial));
    o.theta(theta).rotary_dim(static_cast<int64_t>(static_cast<double>(head_dim) * partial));
    if (o.rotary_dim() % 2 != 0) fail(partial_key, concat("gives an odd rotary dimension ", o.rotary_dim()));
    if (o.type() == "longrope")
      for (const auto* f : {&o.short_factor(), &o.long_factor()})
        if (static_cast<int64_t>(f->size()) != o.rotary_dim() / 2)
          fail(key + (f == &o.short_factor() ? ".short_factor" : ".long_factor"),
               concat("expected ", o.rotary_dim() / 2, " numbers (rotary dims / 2), got ", f->size()));
    return o;
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
  std::string family_;
};

/// Writes both transformers 5's `rope_parameters` and the older keys, so the
/// folder loads in either generation of transformers.
inline void write_hf_rope(nlohmann::json& j, const layers::RopeOptions& o, bool write_partial) {
  nlohmann::json params = {{"rope_type", o.type()}, {"rope_theta", o.theta()}};
  if (write_partial)
    params["partial_rotary_factor"] = static_cast<double>(o.rotary_dim()) / static_cast<double>(o.head_dim());
  j["rope_theta"] = o.theta();
  j["rope_scaling"] = nullptr;
  if (o.type() == "llama3") {
    nlohmann::json s = {{"rope_type", "llama3"},
                        {"factor", o.factor()},
                        {"low_freq_factor", o.low_freq_factor()},
                        {"high_freq_factor", o.high_freq_factor()},
                        {"original_max_position_embeddings", o.original_max_positions()}};
    j["rope_scaling"] = s;
    params.update(s);
  }
  if (o.type() == "longrope") {
    nlohmann::json s = {{"rope_type", "longrope"},
                        {"type", "longrope"},
                        {"short_factor", o.short_factor()},
                        {"long_factor", o.long_factor()},
                        {"attention_factor", o.attention_factor()},
                        {"original_max_position_embeddings", o.original_max_positions()}};
    j["rope_scaling"] = s;
    s.erase("type");
    params.update(s);
  }
  j["rope_parameters"] = params;
}

inline void write_hf_special_tokens(nlohmann::json& j, const SpecialTokens& t) {
  if (t.bos >= 0) j["bos_token_id"] = t.bos;
  if (t.eos >= 0) j["eos_token_id"] = t.eos;
  if (t.pad >= 0) j["pad_token_id"] = t.pad;
}

}  // namespace anvil::models
