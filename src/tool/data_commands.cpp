#include "tool/data_commands.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "anvil/core/error.h"
#include "anvil/tokenizer/tokenizer.h"
#include "data/jsonl.h"
#include "data/token_shards.h"

int cmd_tokenize(const std::string& tok_path, const std::string& type, const std::string& input,
                 const std::string& output, bool decode, bool keep_special) {
  auto tok = anvil::tokenizer::load_tokenizer(type, tok_path);
  std::ifstream file;
  if (input != "-") {
    file.open(input);
    if (!file) throw anvil::Error(anvil::concat(input, ": cannot open"));
  }
  std::istream& in = input == "-" ? std::cin : file;  // "-": standard input
  std::ofstream file_out;
  if (output != "-") {
    file_out.open(output);
    if (!file_out) throw anvil::Error(anvil::concat(output, ": cannot open for writing"));
  }
  std::ostream& out = output == "-" ? std::cout : file_out;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!decode) {
      out << nlohmann::json(tok->encode(line)).dump() << "\n";
      continue;
    }
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_array() ||
        !std::all_of(j.begin(), j.end(), [](const auto& v) { return v.is_number_integer(); }))
      throw anvil::DataError(anvil::concat(input, ":", lineno, ": expected a JSON list of token ids"));
    out << tok->decode(j.get<std::vector<int64_t>>(), !keep_special) << "\n";
  }
  return 0;
}

int cmd_prepare(const std::string& tok_path, const std::string& type, const std::vector<std::string>& inputs,
                const std::string& output, const std::vector<std::string>& text_fields, int64_t shard_tokens,
                bool no_eos, const std::string& on_error, const std::string& format) {
  auto tok = anvil::tokenizer::load_tokenizer(type, tok_path);
  anvil::data::ShardWriterOptions wo;
  wo.shard_tokens = shard_tokens;
  wo.append_eos = !no_eos;
  std::optional<anvil::data::ShardWriter> shards;
  std::optional<anvil::data::MegatronWriter> megatron;
  if (format == "megatron")
    megatron.emplace(output, tok->vocab_size(), tok->eos_id(), !no_eos);
  else
    shards.emplace(output, tok->vocab_size(), tok->eos_id(), wo);
  struct {
    std::optional<anvil::data::ShardWriter>& s;
    std::optional<anvil::data::MegatronWriter>& m;
    void add(const std::vector<int64_t>& ids) { s ? s->add(ids) : m->add(ids); }
    int64_t num_docs() const { return s ? s->num_docs() : m->num_docs(); }
    int64_t num_tokens() const { return s ? s->num_tokens() : m->num_tokens(); }
  } writer{shards, megatron};
  const auto policy = anvil::data::parse_on_error(on_error);
  int64_t skipped = 0;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t bytes = 0;
  for (const auto& input : inputs) {
    if (std::filesystem::path(input).extension() == ".jsonl") {
      auto st = anvil::data::read_jsonl(input, policy, [&](const anvil::data::Record& r) {
        std::string text;
        for (const auto& f : text_fields) text += r.string(f);
        bytes += static_cast<int64_t>(text.size());
        auto ids = tok->encode(text);
        if (tok->add_bos() && tok->bos_id() >= 0) ids.insert(ids.begin(), tok->bos_id());
        writer.add(ids);
      });
      skipped += st.skipped;
      for (const auto& e : st.first_errors) std::cerr << "skipped: " << e << "\n";
      continue;
    }
    std::ifstream in(input);
    if (!in) throw anvil::DataError(anvil::concat(input, ": cannot open"));
    std::string line;
    while (std::getline(in, line)) {  // one document per non-blank line
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      bytes += static_cast<int64_t>(line.size());
      auto ids = tok->encode(line);
      if (tok->add_bos() && tok->bos_id() >= 0) ids.insert(ids.begin(), tok->bos_id());
      writer.add(ids);
    }
  }
  const auto docs = writer.num_docs();
  const auto tokens = writer.num_tokens();
  if (shards)
    shards->finish(tok->kind(), inputs, anvil::tokenizer::fingerprint(*tok));
  else
    megatron->finish();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "prepared " << output << ": " << docs << " documents, " << tokens << " tokens"
            << (skipped ? anvil::concat(", ", skipped, " malformed lines skipped") : std::string()) << " ("
            << static_cast<double>(bytes) / 1e6 / std::max(s, 1e-9) << " MB/s)\n";
  return 0;
}
