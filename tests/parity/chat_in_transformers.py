"""What transformers makes of an exported folder's chat format.

Usage: chat_in_transformers.py FOLDER CONVERSATIONS.jsonl

Loads FOLDER with AutoTokenizer (which must succeed from the folder's own
tokenizer_config.json) and, for each line {"messages": [...]} of
CONVERSATIONS.jsonl, prints one JSON line:
  ids         apply_chat_template(messages, tokenize=True)
  mask        its assistant_masks ({% generation %}), fast tokenizers only
  prompt_ids  apply_chat_template(messages up to the first assistant turn,
              add_generation_prompt=True)
The first line printed is {"class": ..., "has_chat_template": ...}.
"""
import json
import sys

from transformers import AutoTokenizer


def main():
    folder, convs = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(folder)
    print(json.dumps({"class": type(tok).__name__, "has_chat_template": bool(tok.chat_template),
                      "is_fast": bool(tok.is_fast)}))
    with open(convs, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            msgs = json.loads(line)["messages"]
            out = {}
            if tok.is_fast:
                r = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
                out["mask"] = list(r["assistant_masks"])
            else:
                r = tok.apply_chat_template(msgs, tokenize=True, return_dict=True)
            out["ids"] = list(r["input_ids"])
            first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
            p = tok.apply_chat_template(msgs[:first], tokenize=True, return_dict=True, add_generation_prompt=True)
            out["prompt_ids"] = list(p["input_ids"])
            print(json.dumps(out))


if __name__ == "__main__":
    main()
