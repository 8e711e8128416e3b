#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets into fuzz/corpus/<target>/seed-*.

Seeds are small valid files of each format, written with the ecosystem's own
libraries where one exists (safetensors, tokenizers, sentencepiece), so the
fuzzer starts from what users' files look like. Run from the repository root
with the project venv: .venv/bin/python fuzz/make_seeds.py [TARGET...]
(every target when none is named).
"""
import io
import json
import os
import struct
import sys
import tempfile

import numpy as np
from safetensors.numpy import save
import sentencepiece as spm
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, normalizers, processors

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = ["hello world", "add: 12+7\n19", "reverse: abc\ncba", "upper: ksqba\nKSQBA",
        "sort: kjxwf\nfjkwx", "h\u00e9llo \u65e5\u672c", "the quick brown fox jumps over the lazy dog"] * 20


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# safetensors
def seeds_safetensors():
    put("safetensors", "empty", save({}))
    put("safetensors", "f32", save({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, metadata={"format": "pt"}))
    put("safetensors", "mixed", save({"a": np.ones((2,), np.float16), "b": np.zeros((3, 1), np.int64),
                                      "c": np.array([True, False]), "z": np.zeros((0, 4), np.float32)}))


# trainer_state.json
def seeds_trainer_state():
    state = {"data": {"epoch": 2, "epoch_length": 13, "offset": 10}, "format_version": 1, "step": 1500}
    put("trainer_state", "resume", json.dumps(state, indent=2))
    put("trainer_state", "nonfinite", json.dumps(dict(state, nonfinite_steps=3, data={"epoch": 0, "offset": 5})))
    put("trainer_state", "no-data", json.dumps({"format_version": 1, "step": 0}))


# token shards: [meta len u16][idx len u16] meta idx bin
def seeds_token_shards():
    def shards(tokens, starts, dtype="uint16", vocab=100):
        meta = json.dumps({"format": "anvil-token-shards", "version": 1, "dtype": dtype, "vocab_size": vocab,
                           "eos_id": 0, "eos_appended": True, "num_docs": len(starts) - 1, "num_tokens": len(tokens),
                           "tokenizer": "hf", "sources": ["a.txt"],
                           "shards": [{"name": "shard_00000", "tokens": len(tokens), "docs": len(starts) - 1}]}).encode()
        idx = struct.pack("<%dq" % len(starts), *starts)
        binary = struct.pack("<%d%s" % (len(tokens), "H" if dtype == "uint16" else "I"), *tokens)
        return struct.pack("<HH", len(meta), len(idx)) + meta + idx + binary

    put("token_shards", "u16", shards([5, 6, 7, 0, 8, 9, 0, 10, 11, 12, 13, 0], [0, 4, 7, 12]))
    put("token_shards", "u32", shards([70000, 1, 0, 2, 3, 4, 0, 9, 9], [0, 3, 7, 9], "uint32", 70001))


# JSONL: the first byte picks the reader and options (see jsonl_fuzz.cpp)
def seeds_jsonl():
    sft = '{"prompt": "sort: kdpw\\n", "response": "dkpw"}\n{"prompt": "upper: ruluf\\n", "response": "RULUF"}\n'
    msgs = json.dumps({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add: 2+2"},
                                    {"role": "assistant", "content": "4"}]}) + "\n"
    pref = '{"prompt": "add: 49+7\\n", "chosen": "56", "rejected": "6"}\n'
    ranked = '{"prompt": "reverse: nyz\\n", "ranked": ["zyn", "zynn", "zynnn"]}\n'
    pref_msgs = json.dumps({"prompt": [{"role": "user", "content": "hi"}], "chosen": "hello", "rejected": "x",
                            "margin": 1.5}) + "\n"
    put("jsonl", "sft-plain", b"\x00" + sft.encode())
    put("jsonl", "sft-chatml-messages", b"\x02" + (sft + msgs).encode())
    put("jsonl", "sft-skip", b"\x04" + (sft + "not json\n" + msgs).encode())
    put("jsonl", "sft-truncate", b"\x08" + sft.encode())
    put("jsonl", "pref-plain", b"\x01" + (pref + ranked).encode())
    put("jsonl", "pref-chatml", b"\x03" + (pref + pref_msgs).encode())
    put("jsonl", "pref-skip", b"\x05" + (pref + "{}\n" + ranked).encode())


# run configs: YAML, then NUL-separated overrides
def seeds_config():
    for name in ["quickstart.yaml", "pretrain_tiny.yaml"]:
        with open(os.path.join(REPO, "configs", name)) as f:
            text = f.read()
        put("config", name.replace(".yaml", ""), text)
        put("config", name.replace(".yaml", "") + "-overrides",
            text + "\0train.max_steps=70\0optimizer.lr=1e-4\0schedule.warmup_steps=5\0data.max_length=64")


# Hugging Face tokenizer.json (+ NUL + tokenizer_config.json)
def seeds_hf_tokenizer():
    def hf_bytelevel():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        return tok

    def hf_split_regex():
        """Qwen/LLaMA-3 style: a Split regex pre-tokenizer, then ByteLevel without its own regex."""
        tok = Tokenizer(models.BPE())
        pattern = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|begin_of_text|>", "<|eot_id|>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                           special_tokens=[("<|begin_of_text|>", 0)])
        return tok

    put("hf_tokenizer", "bytelevel", hf_bytelevel().to_str())
    # The JSONL target's tokenizer for the chatml template (it needs <|im_start|> and <|im_end|>).
    chatml = hf_bytelevel()
    chatml.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    os.makedirs(os.path.join(os.path.dirname(ROOT), "data"), exist_ok=True)
    with open(os.path.join(os.path.dirname(ROOT), "data", "chatml-tokenizer.json"), "w") as f:
        f.write(chatml.to_str())
    put("hf_tokenizer", "chatml", chatml.to_str())
    put("hf_tokenizer", "bytelevel-config", hf_bytelevel().to_str() + "\0" + json.dumps(
        {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "add_bos_token": False}))
    put("hf_tokenizer", "split-regex", hf_split_regex().to_str() + "\0" + json.dumps(
        {"bos_token": {"content": "<|begin_of_text|>"}, "eos_token": "<|eot_id|>", "add_bos_token": True,
         "pad_token": None}))


# SentencePiece models (small ones: the fuzzer mutates every byte)
def seeds_sentencepiece():
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "text.txt"), "w") as f:
            f.write("\n".join(TEXT))
        for kind, vocab in [("bpe", 48), ("unigram", 48)]:
            out = io.BytesIO()
            spm.SentencePieceTrainer.train(input=os.path.join(d, "text.txt"), model_writer=out, vocab_size=vocab,
                                           model_type=kind, byte_fallback=False, minloglevel=2,
                                           normalization_rule_name="identity")
            put("sentencepiece", kind, out.getvalue())
    with open(os.path.join(REPO, "data", "tokenizer.model"), "rb") as f:
        put("sentencepiece", "quickstart", f.read())


# Chat templates: the template, NUL, an options byte (see chat_template_fuzz.cpp), the
# conversation as JSON (or one message a line), then NUL and the tools. The test suite's
# real-world formats, and templates that once crashed or hung the interpreter.
def seeds_chat_template():
    sys.path.insert(0, os.path.join(REPO, "tests", "parity"))
    from apply_chat_template import TEMPLATES, CONVERSATIONS, TOOL_CONVERSATIONS

    def seed(name, template, messages, options=0x1F, tools=None):
        data = template.encode() + b"\0" + bytes([options]) + json.dumps(messages, ensure_ascii=False).encode()
        if tools is not None:
            data += b"\0" + json.dumps(tools).encode()
        put("chat_template", name, data)

    for name, (template, _) in TEMPLATES.items():
        if name == "tools":
            messages, tools = TOOL_CONVERSATIONS[1]
            seed(name, template, messages, tools=tools)
        else:
            seed(name, template, CONVERSATIONS[2])
    # The conversation one message a line: the first byte picks the role (system, user, assistant, tool).
    put("chat_template", "chatml-lines", TEMPLATES["chatml"][0].encode() + b"\0\x03" +
        "\x04You are terse.\n\x01Name a colour.\n\x02Blue.\n\x01Another?\n\x02Gr\u00fcn.\n".encode())
    hostile = {
        "macro-recursive": "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
        "macro-mutual": "{% macro a(n) %}{{ b(n + 1) }}{% endmacro %}{% macro b(n) %}{{ a(n + 1) }}{% endmacro %}"
                        "{{ a(0) }}",
        # Past the limits, not much further: mutations of a large input run slowly.
        "parentheses": "{{ " + "(" * 300 + "1" + ")" * 300 + " }}",
        "if-blocks": "{% if true %}" * 300 + "x" + "{% endif %}" * 300,
        "nested-loops": "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
        "namespace-cycle": "{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}",
    }
    for name, template in hostile.items():
        seed("hostile-" + name, template, CONVERSATIONS[0])


SEEDS = {"safetensors": seeds_safetensors, "trainer_state": seeds_trainer_state, "token_shards": seeds_token_shards,
         "jsonl": seeds_jsonl, "config": seeds_config, "hf_tokenizer": seeds_hf_tokenizer,
         "sentencepiece": seeds_sentencepiece, "chat_template": seeds_chat_template}

if __name__ == "__main__":
    for target in sys.argv[1:] or SEEDS:
        SEEDS[target]()
