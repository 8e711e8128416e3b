"""Chat-template references from transformers itself.

Usage: make_chat_references.py WORKDIR

Trains a small byte-level BPE tokenizer (HF `tokenizers`) whose special tokens
cover the ChatML, LLaMA-3 and Open-Assistant markers (and whose EOS ends plain replies), saves it to
WORKDIR/tok/, and for each template renders conversations with
`apply_chat_template(..., return_assistant_tokens_mask=True)`, using Jinja
templates that mark the trained part with {% generation %}. Writes
WORKDIR/<template>.jsonl: {"messages", "ids", "mask"} per conversation.
"""
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL = ["</s>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>", "<|prompter|>", "<|assistant|>", "<|system|>"]

TEMPLATES = {
    # Anvil's plain format as docs/data.md states it: turns as written, a user
    # or system turn ending in a newline (added when missing), a reply in EOS.
    "plain": (
        "{% for m in messages %}"
        "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + eos_token }}{% endgeneration %}"
        "{% elif m['content'][-1:] == '\n' %}{{ m['content'] }}"
        "{% else %}{{ m['content'] + '\n' }}{% endif %}"
        "{% endfor %}"),
    "chatml": (
        "{% for m in messages %}"
        "{% if m['role'] == 'assistant' %}"
        "{{ '<|im_start|>assistant\n' }}{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
        "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}"
        "{% endfor %}"),
    "llama3": (
        "{{ '<|begin_of_text|>' }}"
        "{% for m in messages %}"
        "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' }}"
        "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
        "{% else %}{{ m['content'] | trim + '<|eot_id|>' }}{% endif %}"
        "{% endfor %}"),
    "oasst": (
        "{% for m in messages %}"
        "{% if m['role'] == 'assistant' %}{{ '<|assistant|>' }}{% generation %}{{ m['content'] + eos_token }}{% endgeneration %}"
        "{% elif m['role'] == 'user' %}{{ '<|prompter|>' + m['content'] + eos_token }}"
        "{% else %}{{ '<|system|>' + m['content'] + eos_token }}{% endif %}"
        "{% endfor %}"),
}

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": " Blue, like the sky. "},
     {"role": "user", "content": "Another one, in German?"},
     {"role": "assistant", "content": "Grün — ein schönes Wort 🌿"}],
    [{"role": "user", "content": "  leading spaces\tand tabs  "},
     {"role": "assistant", "content": "\nnewline first\n\nand paragraphs"}],
    [{"role": "user", "content": "Zähle: 1, 22, 333, 4444"}, {"role": "assistant", "content": "I'm counting: 10000!"}],
    [{"role": "user", "content": "日本語で答えて"}, {"role": "assistant", "content": "はい、わかりました。"}],
]


def main():
    work = sys.argv[1]
    os.makedirs(os.path.join(work, "tok"), exist_ok=True)
    corpus = []
    for conv in CONVERSATIONS:
        for m in conv:
            corpus.append(m["content"])
    corpus += ["user assistant system", "The quick brown fox jumps over the lazy dog."] * 20

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.save(os.path.join(work, "tok", "tokenizer.json"))
    with open(os.path.join(work, "tok", "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast"}, f)

    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(work, "tok", "tokenizer.json"), eos_token="</s>")
    for name, template in TEMPLATES.items():
        with open(os.path.join(work, name + ".jsonl"), "w") as f:
            for conv in CONVERSATIONS:
                out = hf.apply_chat_template(conv, chat_template=template, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True)
                f.write(json.dumps({"messages": conv, "ids": list(out["input_ids"]),
                                    "mask": list(out["assistant_masks"])}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
