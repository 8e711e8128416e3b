// Chat templates as the trainer and `anvil chat` use them (data.template:
// hf): a model folder's tokenizer_config.json chat_template, rendered for a
// conversation, tokenized and masked. The input is the template, a NUL, one
// byte of options, the conversation, and optionally a NUL and the tools (a
// JSON array). The conversation is a JSON array of messages when it parses
// as one ({"role": ..., "content": ..., "tool_calls": ...}), else one message
// a line: the line's first byte picks the role, the rest is the content.
// Besides the contract of fuzz_util.h: the {% generation %} spans are
// ordered pairs, and the labels match the ids.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/chat/chat.h"
#include "anvil/tokenizer/tokenizer.h"
#include "chat/hf.h"
#include "jinja/limits.h"
#include "fuzz_util.h"

namespace {

using json = nlohmann::ordered_json;
using anvil::chat::Message;

// Renderings longer than this are not tokenized: a tokenizer under ASan
// takes seconds on megabytes, which is not what this target looks for.
constexpr size_t kMaxTokenized = 16 << 10;
// Each assistant turn renders the conversation twice more (chat/hf.cpp).
constexpr size_t kMaxMessages = 6;
// One input's renderings share one budget (jinja/limits.h), a tenth of
// one rendering's: an encode renders a dozen times, and the fuzzer's
// instrumentation makes a step several times slower, so with the real budget
// each input that loops would take seconds. The limits' own values are
// tested in tests/jinja/limits_test.cpp.
constexpr int64_t kSteps = anvil::jinja::kMaxSteps / 10;
constexpr int64_t kText = anvil::jinja::kMaxTextWork / 10;

// The hf tokenizer with ChatML's tokens, and an EOS and BOS for the templates' variables.
anvil::tokenizer::Tokenizer& tokenizer() {
  static const auto tok = [] {
    const auto dir = anvil::fuzz::scratch_dir() / "tok";
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(std::string(anvil::fuzz::source_dir()) + "/fuzz/data/chatml-tokenizer.json",
                               dir / "tokenizer.json", std::filesystem::copy_options::overwrite_existing);
    anvil::fuzz::write_file(dir / "tokenizer_config.json",
                            R"({"eos_token": "<|im_end|>", "bos_token": "<|endoftext|>"})");
    return anvil::tokenizer::load_tokenizer_from_model_dir(dir);
  }();
  return *tok;
}

std::vector<Message> json_messages(std::string_view text) {
  std::vector<Message> out;
  const auto j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return out;
  for (const auto& m : j) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return {};
    const bool plain = m.size() == 2 && m.contains("content") && m["content"].is_string();
    out.push_back({m["role"].get<std::string>(), plain ? m["content"].get<std::string>() : "", plain ? "" : m.dump()});
  }
  return out;
}

std::vector<Message> line_messages(std::string_view text) {
  static const char* const kRoles[] = {"system", "user", "assistant", "tool"};
  std::vector<Message> out;
  while (!text.empty()) {
    const auto k = text.find('\n');
    const auto line = text.substr(0, k);
    text = k == std::string_view::npos ? std::string_view{} : text.substr(k + 1);
    if (line.empty()) continue;
    out.push_back({kRoles[static_cast<unsigned char>(line[0]) % 4], std::string(line.substr(1))});
  }
  return out;
}

void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: %s\n", what);
  std::abort();
}

void run(const std::string& tmpl, uint8_t options, const std::vector<Message>& messages, const std::string& tools) {
  const anvil::jinja::Meter budget(kSteps, kText);
  auto& tok = tokenizer();
  tok.set_chat_template(tmpl);
  const auto r = anvil::chat::render_chat(tok, messages, options & 1, tools);
  // (A span may end past the text: a block inside a macro whose output is not written, as in transformers.)
  for (const auto& [b, e] : r.generation) check(0 <= b && b <= e, "a generation span that is not a range");
  if (r.text.size() > kMaxTokenized) return;
  const auto& hf = anvil::chat::hf_chat_template();
  const auto chat = hf.encode(tok, messages, options & 2, tools);
  check(chat.labels.size() == chat.input_ids.size(), "labels and ids differ in length");
  check(chat.prompt_tokens >= 0 && chat.prompt_tokens <= static_cast<int64_t>(chat.input_ids.size()),
        "prompt_tokens outside the ids");
  if (options & 4) hf.encode_prompt(tok, messages, tools);
  if (options & 8) hf.end_of_turn_id(tok);
  if (options & 16) hf.encode_reply(tok, "Hello there.");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto split = anvil::fuzz::split_at_nul(data, size);
  const std::string tmpl(split.first);
  std::string_view rest = split.second;
  const uint8_t options = rest.empty() ? 0 : static_cast<uint8_t>(rest[0]);
  if (!rest.empty()) rest.remove_prefix(1);
  std::string_view conv = rest, tools_text;
  if (const auto k = rest.find('\0'); k != std::string_view::npos) {
    conv = rest.substr(0, k);
    tools_text = rest.substr(k + 1);
  }
  auto messages = json_messages(conv);
  if (messages.empty()) messages = line_messages(conv);
  if (messages.size() > kMaxMessages) messages.resize(kMaxMessages);
  std::string tools;
  if (const auto t = json::parse(tools_text, nullptr, false); t.is_array()) tools = t.dump();
  return anvil::fuzz::guarded([&] { run(tmpl, options, messages, tools); });
}
