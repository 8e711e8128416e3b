"""Reference tokenizations from Hugging Face `tokenizers` and `sentencepiece`
themselves, for the C++ parity tests (tests/tokenizer/tokenizer_parity_test.cpp).

Writes into WORKDIR:
  corpus.txt     a deterministic multilingual corpus, one example per line
                 ("\n" only: lines hold \r, \u2028, \x85 and the like)
  gpt2/          ByteLevel BPE as GPT-2 (no normalizer), with added tokens
  neox/          as GPT-NeoX / Pythia: NFC normalizer + ByteLevel, space-run
                 added tokens that match after normalization
  llama3/        as LLaMA-3: Split(LLaMA-3 regex) + ByteLevel(use_regex=False),
                 ignore_merges, TemplateProcessing adding <|begin_of_text|>
  galactica/     as facebook/galactica-*: NFKC, Split(marker, removed) +
                 Digits(individual) + Split(punctuation runs) + Split("\n") +
                 ByteLevel, its markers as added tokens; an empty
                 special_tokens_map.json and a config naming no special token
  opt/           as facebook/opt-*: GPT-2 byte-level BPE over the fairseq
                 specials, a TemplateProcessing that prepends </s>
  qwen2/          as Qwen2 / Qwen2.5 / Qwen3: transformers' own Qwen2TokenizerFast
                 pipeline (NFC, Split(Qwen regex, single digits) + ByteLevel
                 without its regex) over a trained byte-level vocabulary, the
                 ChatML specials and Qwen3's non-special <think> / <tool_call>
                 added tokens
  gemma/         as Gemma 2 / 3: transformers' own GemmaTokenizerFast pipeline
                 (Replace " " -> U+2581, Split(" ", merged with previous), BPE
                 with byte fallback; Replace / ByteFallback / Fuse decoders)
                 over sp_bpe's vocabulary, <bos> added; for gemma/ also
                 "ids_special" (add_special_tokens=True)
  sp_unigram/    sentencepiece unigram (tokenizer.model)
  sp_bpe/        sentencepiece BPE with byte_fallback (tokenizer.model)
  llama_first/   sp_bpe converted by transformers' LlamaTokenizerFast
                 (legacy=False): Metaspace(prepend_scheme=first), byte fallback,
                 Replace/ByteFallback/Fuse/Strip decoders
  llama_always/  the same with legacy=True: Metaspace(prepend_scheme=always)
  llama2/        as Llama-2's own tokenizer.json (the older converter):
                 Prepend + Replace normalizers, no pre-tokenizer, <s> template
  metaspace_never/ Metaspace(never, split) and a ByteFallback + Metaspace decoder
  metaspace_old/   the older Metaspace form: add_prefix_space, no prepend_scheme
and in each tokenizer folder:
  expected.jsonl one {"ids", "decoded"} per corpus line, from the library:
                 encode(line, add_special_tokens=False).ids and
                 decode(ids, skip_special_tokens=False) (sentencepiece:
                 sp.encode(line), sp.decode(ids)); for opt/ also "ids_special",
                 transformers' AutoTokenizer ids with add_special_tokens=True
  meta.json      {"bos", "eos", "pad", "add_bos"} as transformers' AutoTokenizer
                 reports them (-1 for none); sentencepiece: the model's ids;
                 galactica: the fairseq ids Galactica's own code uses

Training is single-threaded and deterministic (the corpus comes from a fixed seed),
so every run writes the same files.
usage: make_tokenizer_references.py WORKDIR
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402

import sentencepiece as spm  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402
from tokenizers import processors, trainers  # noqa: E402

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
VOCAB_SIZE = 2000

EN = ("the of and to in is was for that with as on by at from it be this are an which or have not had but were "
      "they his one all there their has been would more when will who so if out no up about into than them can "
      "only other new some could time these two may then first any like over such after our most make also "
      "tokenizer model training gradient learning rate batch sequence attention layer weights checkpoint").split()
DE = "Straße Mädchen über schön Größe Äpfel Öl Übung Fußgänger Brötchen Käse weiß heißen Bäume Grüße".split()
FR = "été déjà où naïve garçon français à côté Noël cœur œuvre élève mère frère hôpital château".split()
RU = "привет мир язык модель обучение данные текст слово Москва ёлка съешь ещё этих мягких булок".split()
EL = "Καλημέρα κόσμε γλώσσα μοντέλο ΑΘΗΝΑ ψυχή ωραίο ένα δύο τρία".split()
ZH = ["我们", "学习", "语言模型", "今天天气很好", "中华人民共和国", "机器学习", "你好世界", "数据集", "分词器"]
JA = ["こんにちは", "世界", "東京都", "カタカナ", "ひらがな", "日本語の文章です", "ｶﾀｶﾅ", "ラーメン"]
KO = ["안녕하세요", "세계", "한국어", "모델", "학습", "데이터"]
AR = ["مرحبا", "بالعالم", "اللغة", "العربية", "نموذج", "تعلم"]
HI = ["नमस्ते", "दुनिया", "हिन्दी", "भाषा", "मॉडल", "क्षत्रिय"]
EMOJI = ["😀", "🤖", "🚀", "❤️", "👍🏽", "👩🏿‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇩🇪", "🇯🇵", "🇺🇸", "🫠", "✨", "🔥", "1️⃣"]
CODE = ["def f(x):\treturn x ** 2  # square", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
        "if (x != nullptr && x->next) return -1;", "    print(f\"{name!r}: {value:>10.3f}\")",
        "std::vector<int64_t> ids{1, 2, 3};", "SELECT * FROM users WHERE id = 42;",
        "x = {'a': [1, 2, 3], \"b\": None}", "<div class=\"row\">&nbsp;</div>", "    \t  return;  "]
CONTRACTIONS = ["I'm", "DON'T", "you're", "We'VE", "they'll", "He'd", "it's", "IT'S", "can't", "O'Neill", "rock'n'roll"]
SPACES = [" ", "  ", "   ", "\t", " \t ", "\u00a0", "\u3000", "\u2028", "\r", "\u0085", "\u200b", "\u000b",
          "\u000c", "     ", "\u2009", "\u180e"]
SPECIAL_TEXT = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>",
                "<|start_header_id|>user<|end_header_id|>", "<tool>", " <tool>", "foo_bar", "<|endoftext", "<|im_",
                "[START_REF] Attention Is All You Need[END_REF]", "[START_AMINO]MSPL1T-TH1S-Pl3A5EKSPL1T-TH1S-Pl3A5EV"
                "[END_AMINO]", "<work>", "</work>", "[START_I_SMILES]CC(=O)OC1=CC=CC=C1C(=O)O[END_I_SMILES]",
                "SPL1T-TH1S-Pl3A5E", "!!!", "...", "((x))", "--", "<s>", "</s>", "<0x41>", "▁x ▁▁y"]
GALACTICA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0..3, the fairseq dictionary's order
GALACTICA_MARKERS = ["[START_REF]", "[END_REF]", "[IMAGE]", "<fragments>", "</fragments>", "<work>", "</work>",
                     "[START_SUP]", "[END_SUP]", "[START_SUB]", "[END_SUB]", "[START_DNA]", "[END_DNA]",
                     "[START_AMINO]", "[END_AMINO]", "[START_SMILES]", "[END_SMILES]", "[START_I_SMILES]",
                     "[END_I_SMILES]"]
GALACTICA_SPLIT_MARKER = "SPL1T-TH1S-Pl3A5E"
# Brackets alone, other ASCII punctuation as runs of one character (a backreference).
GALACTICA_PUNCTUATION = r"""[\(\)\[\]\{\}]|([!"\#\$%\&'\*\+,\-\./:;<=>\?\\\^_`\|\~])\1*"""


def word(rng):
    pick = rng.random()
    if pick < 0.55:
        w = rng.choice(EN)
        return w.capitalize() if rng.random() < 0.15 else (w.upper() if rng.random() < 0.03 else w)
    pools = [DE, FR, RU, EL, ZH, JA, KO, AR, HI, EMOJI, CONTRACTIONS]
    return rng.choice(rng.choice(pools))


def number(rng):
    kind = rng.randrange(5)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randrange(1, 25)))
    if kind == 1:
        return f"{rng.uniform(-1e4, 1e4):.{rng.randrange(0, 6)}f}"
    if kind == 2:
        return f"{rng.randrange(1, 29)}.{rng.randrange(1, 13)}.{rng.randrange(1900, 2100)}"
    if kind == 3:
        return "".join(rng.choice("0123456789٠١٢٣४५६७௮³½") for _ in range(rng.randrange(1, 8)))
    return f"{rng.randrange(100)}%"


def line(rng, i):
    kind = rng.random()
    if i % 97 == 0:
        return ""
    if i % 89 == 0:
        return rng.choice([" ", "\t", "   ", "\r", "\u00a0", "  \t  "])
    if kind < 0.06:
        return rng.choice(CODE)
    if kind < 0.10:  # decomposed accents and other combining sequences (NFC changes them)
        return rng.choice(["Cafe\u0301 ", "re\u0301sume\u0301", "A\u030angstro\u0308m", "n\u0303 ", "\u1100\u1161\u11a8",
                           "e\u0301\u0301", "Zoe\u0308 ", "\u212b", "\ufb01le", "x\u0327\u0301"]) + " " + word(rng)
    if kind < 0.13:  # long unbroken runs: long-word BPE, the cache bypass
        return rng.choice(["a", "ab", "9", "-", "=", "字", "😀", " "]) * rng.randrange(50, 400)
    parts = []
    for _ in range(rng.randrange(1, 25)):
        r = rng.random()
        if r < 0.08:
            parts.append(number(rng))
        elif r < 0.12:
            parts.append(rng.choice(SPECIAL_TEXT))
        elif r < 0.17:
            parts.append(rng.choice(".,;:!?()[]{}\"'-—…«»¿¡/\\@#$%^&*+=<>|~`"))
        else:
            parts.append(word(rng))
    out = ""
    for p in parts:
        sep = rng.choice(SPACES) if rng.random() < 0.15 else (" " if rng.random() < 0.9 else "")
        out += sep + p
    if rng.random() < 0.1:
        out = rng.choice(SPACES) + out
    if rng.random() < 0.1:
        out += rng.choice(SPACES)
    return out.lstrip(" ") if rng.random() < 0.7 else out


def make_corpus(n=2000):
    rng = random.Random(20240531)
    lines = [line(rng, i) for i in range(n)]
    assert all("\n" not in l for l in lines)
    return lines


def byte_level_bpe(lines, normalizer, pre_tokenizer, specials, ignore_merges=False):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=trainer)
    if ignore_merges:
        spec = json.loads(tok.to_str())
        spec["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(spec))
    return tok


def save_hf(tok, d, bos=None, eos=None, pad=None, extra=None, legacy_merges=False):
    """Saves tokenizer.json plus the tokenizer_config.json transformers reads."""
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    if legacy_merges:  # the older "left right" form of the merges list, as in GPT-2's and Pythia's files
        with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
            spec = json.load(f)
        spec["model"]["merges"] = [" ".join(m) for m in spec["model"]["merges"]]
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False, indent=2)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "pad_token": pad,
              "model_max_length": 1 << 20}
    config.update(extra or {})
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)


def write_hf_expected(d, lines, with_special_tokens=False, meta_override=None):
    from transformers import AutoTokenizer
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(d)
    with open(os.path.join(d, "expected.jsonl"), "w", encoding="utf-8") as f:
        for l in lines:
            ids = tok.encode(l, add_special_tokens=False).ids
            row = {"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)}
            if with_special_tokens:
                row["ids_special"] = auto(l, add_special_tokens=True)["input_ids"]
            f.write(json.dumps(row) + "\n")
    none = lambda v: -1 if v is None else v  # noqa: E731
    bos = none(auto.bos_token_id)
    with_specials = auto("hello world")["input_ids"]
    add_bos = bos >= 0 and with_specials[:1] == [bos] and auto("hello world", add_special_tokens=False)[
        "input_ids"][:1] != [bos]
    meta = {"bos": bos, "eos": none(auto.eos_token_id), "pad": none(auto.pad_token_id), "add_bos": add_bos}
    meta.update(meta_override or {})
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)


def train_sentencepiece(lines, d, **kwargs):
    import io
    os.makedirs(d, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter([l for l in lines if l.strip()]), model_writer=model,
                                   vocab_size=VOCAB_SIZE, num_threads=1, minloglevel=2, hard_vocab_limit=False,
                                   **kwargs)
    with open(os.path.join(d, "tokenizer.model"), "wb") as f:
        f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
    with open(os.path.join(d, "expected.jsonl"), "w", encoding="utf-8") as f:
        for l in lines:
            ids = sp.encode(l)
            f.write(json.dumps({"ids": ids, "decoded": sp.decode(ids)}) + "\n")
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"bos": sp.bos_id(), "eos": sp.eos_id(), "pad": sp.pad_id(), "add_bos": False}, f)


def galactica(lines, d):
    """Galactica's pipeline; its folders name no special tokens (Anvil falls back
    to the fairseq ids 0..3, as Galactica's own code does)."""
    tok = byte_level_bpe(lines, normalizers.NFKC(), pre_tokenizers.Sequence([
        pre_tokenizers.Split(GALACTICA_SPLIT_MARKER, behavior="removed", invert=False),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex(GALACTICA_PUNCTUATION), behavior="isolated", invert=False),
        pre_tokenizers.Split("\n", behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)]), GALACTICA_SPECIALS)
    tok.add_tokens(GALACTICA_MARKERS)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        f.write("{}")
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"name_or_path": "galactica-like", "special_tokens_map_file": None,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
    write_hf_expected(d, lines, meta_override={"bos": 0, "pad": 1, "eos": 2, "add_bos": False})


def opt(lines, d):
    """OPT: GPT-2 byte-level BPE whose encoding starts with </s>, as transformers'
    converter writes it (a TemplateProcessing) for add_bos_token."""
    tok = byte_level_bpe(lines, None, pre_tokenizers.ByteLevel(add_prefix_space=False), GALACTICA_SPECIALS)
    bos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="</s>:0 $A:0", pair="</s>:0 $A:0 $B:1",
                                                       special_tokens=[("</s>", bos)])
    save_hf(tok, d, bos="</s>", eos="</s>", pad="<pad>",
            extra={"tokenizer_class": "GPT2Tokenizer", "unk_token": "</s>", "add_bos_token": True, "errors": "replace"})
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "</s>", "eos_token": "</s>", "unk_token": "</s>", "pad_token": "<pad>"}, f)
    write_hf_expected(d, lines, with_special_tokens=True)


def converted_sentencepiece(lines, work):
    """sp_bpe/tokenizer.model converted to tokenizer.json by transformers, and
    the Metaspace / normalizer variants real conversions have written."""
    import transformers
    from transformers.tokenization_utils_base import generate_merges
    # transformers' SentencePieceExtractor reads the model with protobuf; the
    # same vocabulary (piece -> id) and merges, from sentencepiece itself.
    sp = spm.SentencePieceProcessor(model_file=os.path.join(work, "sp_bpe", "tokenizer.model"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = generate_merges(vocab)
    specs = {}
    for legacy, name in ((False, "llama_first"), (True, "llama_always")):
        tok = transformers.LlamaTokenizerFast(vocab=vocab, merges=merges, legacy=legacy).backend_tokenizer
        specs[name] = json.loads(tok.to_str())
    always = specs["llama_always"]
    # Llama-2's own file: the older converter's normalizers instead of a
    # pre-tokenizer, unk_token set, <s> added by the template.
    llama2 = Tokenizer.from_str(json.dumps(always))
    llama2.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    llama2.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                          special_tokens=[("<s>", llama2.token_to_id("<s>"))])
    specs["llama2"] = json.loads(llama2.to_str())
    specs["llama2"]["pre_tokenizer"] = None
    specs["llama2"]["model"]["unk_token"] = "<unk>"
    never = json.loads(json.dumps(always))
    never["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True}
    never["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never"}]}
    specs["metaspace_never"] = never
    old = json.loads(json.dumps(always))
    old["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}
    old["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}]}
    specs["metaspace_old"] = old
    for name, spec in specs.items():
        save_hf(Tokenizer.from_str(json.dumps(spec)), os.path.join(work, name), bos="<s>", eos="</s>",
                extra={"add_bos_token": name == "llama2", "unk_token": "<unk>"})
        with open(os.path.join(work, name, "tokenizer.json"), "w", encoding="utf-8") as f:  # as written, not re-serialized
            json.dump(spec, f, ensure_ascii=False, indent=2)
        write_hf_expected(os.path.join(work, name), lines)
    return list(specs)


def qwen2(lines, d):
    """Qwen2TokenizerFast's pipeline, as transformers builds it, over a byte-level BPE trained on the corpus."""
    from transformers import Qwen2TokenizerFast
    trained = json.loads(byte_level_bpe(lines, normalizers.NFC(), pre_tokenizers.ByteLevel(add_prefix_space=False),
                                        ["<|endoftext|>"]).to_str())
    vocab = trained["model"]["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["model"]["merges"]]
    tok = Qwen2TokenizerFast(vocab=vocab, merges=merges, unk_token=None, bos_token=None,
                             eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in ("<think>", "</think>", "<tool_call>", "</tool_call>")])
    tok.save_pretrained(d)
    write_hf_expected(d, lines)


def gemma(lines, work):
    """GemmaTokenizerFast's pipeline, as transformers builds it, over sp_bpe's vocabulary and merges."""
    from transformers import GemmaTokenizerFast
    from transformers.tokenization_utils_base import generate_merges
    sp = spm.SentencePieceProcessor(model_file=os.path.join(work, "sp_bpe", "tokenizer.model"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    tok = GemmaTokenizerFast(vocab=vocab, merges=generate_merges(vocab), add_bos_token=True)
    tok.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    d = os.path.join(work, "gemma")
    tok.save_pretrained(d)
    write_hf_expected(d, lines, with_special_tokens=True)


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    lines = make_corpus()
    with open(os.path.join(work, "corpus.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")

    # GPT-2: ByteLevel with its regex, no normalizer; chat markers and two
    # non-special added tokens (one stripping spaces on its left, one whole-word).
    gpt2 = byte_level_bpe(lines, None, pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"])
    gpt2.post_processor = processors.ByteLevel(trim_offsets=False)
    gpt2.add_special_tokens([AddedToken("<|im_start|>", special=True, normalized=False),
                             AddedToken("<|im_end|>", special=True, normalized=False)])
    gpt2.add_tokens([AddedToken("<tool>", lstrip=True, special=False, normalized=False),
                     AddedToken("foo_bar", single_word=True, rstrip=True, special=False)])
    save_hf(gpt2, os.path.join(work, "gpt2"), bos="<|endoftext|>", eos="<|endoftext|>",
            extra={"unk_token": "<|endoftext|>", "add_bos_token": False})

    # GPT-NeoX / Pythia: NFC first; runs of spaces are added tokens matched in
    # the normalized text, leftmost-longest; merges written as "left right".
    neox = byte_level_bpe(lines, normalizers.NFC(), pre_tokenizers.ByteLevel(add_prefix_space=False),
                          ["<|endoftext|>", "<|padding|>"])
    neox.add_tokens([AddedToken(" " * n, special=False, normalized=True) for n in range(2, 9)])
    save_hf(neox, os.path.join(work, "neox"), bos="<|endoftext|>", eos="<|endoftext|>", pad="<|padding|>",
            legacy_merges=True)

    # LLaMA-3: the split regex, then ByteLevel without its own regex.
    llama = byte_level_bpe(lines, None, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]),
        LLAMA3_SPECIALS, ignore_merges=True)
    bos_id = llama.token_to_id("<|begin_of_text|>")
    llama.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos_id)])])
    save_hf(llama, os.path.join(work, "llama3"), bos="<|begin_of_text|>", eos="<|end_of_text|>")

    for name in ("gpt2", "neox", "llama3"):
        write_hf_expected(os.path.join(work, name), lines)
    galactica(lines, os.path.join(work, "galactica"))
    opt(lines, os.path.join(work, "opt"))

    train_sentencepiece(lines, os.path.join(work, "sp_unigram"), model_type="unigram")
    train_sentencepiece(lines, os.path.join(work, "sp_bpe"), model_type="bpe", byte_fallback=True)
    converted = converted_sentencepiece(lines, work)
    qwen2(lines, os.path.join(work, "qwen2"))
    gemma(lines, work)
    print(f"wrote {len(lines)} lines and {9 + len(converted)} tokenizers to {work}")


if __name__ == "__main__":
    main()
