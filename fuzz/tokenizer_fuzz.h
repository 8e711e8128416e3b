#pragma once
// What both tokenizer targets do with a tokenizer that loaded: encode and
// decode the kinds of text training meets.

#include <algorithm>
#include <string_view>
#include <vector>

#include "anvil/tokenizer/tokenizer.h"

namespace anvil::fuzz {

inline void exercise_tokenizer(const tokenizer::Tokenizer& tok) {
  constexpr std::string_view kTexts[] = {
      "Hello world",
      "  12 + 7 = 19\n\n",
      "h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\xa4\x96",
      "<|endoftext|><s></s><|im_start|>user\nhi<|im_end|>",
      "",
      "\xff\xfe broken utf-8 \xc3",
      "a\tb\r\nc",
  };
  for (const auto text : kTexts) {
    const auto ids = tok.encode(text);
    (void)tok.decode(ids, true);
    (void)tok.decode(ids, false);
  }
  std::vector<int64_t> first;
  for (int64_t i = 0; i < std::min<int64_t>(tok.vocab_size(), 64); ++i) first.push_back(i);
  (void)tok.decode(first, false);
  (void)tok.token_to_id("a");
  (void)tok.token_to_id("<|endoftext|>");
  for (const auto id : {tok.bos_id(), tok.eos_id(), tok.pad_id()})
    if (id >= 0) (void)tok.decode({id}, false);
}

}  // namespace anvil::fuzz
