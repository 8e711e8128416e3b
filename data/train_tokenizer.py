#!/usr/bin/env python3
"""Train Anvil's bundled SentencePiece tokenizer for the synthetic SFT tasks.

Reads <data-dir>/sft_train.jsonl, writes the prompts+responses to a temporary
text corpus and trains a character-level SentencePiece model with byte
fallback, saved as <data-dir>/tokenizer.model (the .vocab file is deleted).

Special ids: unk=0, bos=1, eos=2, pad=3. "\\n" is a user-defined symbol so it
gets its own piece (SentencePiece treats newlines in the corpus as sentence
separators, so it would otherwise never be learned). The vocabulary is
4 specials + 1 user-defined ("\\n") + 256 byte pieces + the corpus characters.

Requires the PyPI `sentencepiece` package (installed into .venv by
scripts/setup.sh).
"""
import argparse
import json
import os
import shutil
import tempfile

import sentencepiece as spm

SPECIALS = 4                # <unk>, <s>, </s>, <pad>
USER_DEFINED = ["\n"]
BYTE_PIECES = 256
# 26 lowercase + 26 uppercase + 10 digits + "▁" (space) + ":" + "+".
CORPUS_CHARS = 65
VOCAB_SIZE = SPECIALS + len(USER_DEFINED) + BYTE_PIECES + CORPUS_CHARS  # 326


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=here,
                    help="folder with sft_train.jsonl; tokenizer.model is written here")
    args = ap.parse_args()
    data_dir = os.path.abspath(args.data_dir)
    train_path = os.path.join(data_dir, "sft_train.jsonl")

    texts = []
    with open(train_path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                texts.append(row["prompt"] + row["response"])

    chars = set("".join(texts)) - {"\n"}
    if len(chars) != CORPUS_CHARS:
        raise SystemExit(f"corpus has {len(chars)} distinct characters besides '\\n', "
                         f"expected {CORPUS_CHARS}; update CORPUS_CHARS")

    tmp = tempfile.mkdtemp(prefix="anvil_spm_")
    cwd = os.getcwd()
    try:
        # Train inside the temp dir with relative names so the trainer_spec
        # stored in the model (input / model_prefix) is the same on every run.
        os.chdir(tmp)
        with open("corpus.txt", "w", encoding="utf-8", newline="\n") as f:
            for t in texts:
                f.write(t + "\n")   # the prompt's own "\n" splits it into two lines
        spm.SentencePieceTrainer.train(
            input="corpus.txt",
            model_prefix="tokenizer",
            model_type="char",
            vocab_size=VOCAB_SIZE,
            character_coverage=1.0,
            normalization_rule_name="identity",
            add_dummy_prefix=False,
            remove_extra_whitespaces=False,
            split_digits=True,
            byte_fallback=True,
            user_defined_symbols=USER_DEFINED,
            unk_id=0, bos_id=1, eos_id=2, pad_id=3,
            num_threads=1,
            minloglevel=1,
        )
        out = os.path.join(data_dir, "tokenizer.model")
        shutil.copyfile("tokenizer.model", out)
    finally:
        os.chdir(cwd)
        shutil.rmtree(tmp, ignore_errors=True)
    vocab_file = os.path.join(data_dir, "tokenizer.vocab")
    if os.path.exists(vocab_file):
        os.remove(vocab_file)

    # Sanity checks: exact round trip, "\n" is one piece, separate encodes concatenate.
    sp = spm.SentencePieceProcessor(model_file=out)
    assert sp.get_piece_size() == VOCAB_SIZE, sp.get_piece_size()
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, 3)
    nl = sp.piece_to_id("\n")
    assert nl != sp.unk_id() and sp.encode("\n") == [nl], sp.encode("\n")
    s = "reverse: abc\n"
    assert sp.decode(sp.encode(s)) == s
    for t in texts[:1000]:
        p, r = t.split("\n", 1)
        ids = sp.encode(p + "\n") + sp.encode(r)
        assert sp.decode(ids) == t, (t, ids)
        assert sp.unk_id() not in ids, t
    print(f"wrote {out} (vocab_size={VOCAB_SIZE}, '\\n' id={nl})")


if __name__ == "__main__":
    main()
