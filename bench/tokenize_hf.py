"""The peer of bench/tokenize_throughput.cpp: Hugging Face `tokenizers`
(Tokenizer.from_file, encode(line, add_special_tokens=False) per line, or per
document of --lines-per-doc lines joined by "\n") on one thread, over the same corpus; also encode_batch of all lines, still on one
thread, for reference. A tokenizer.model is measured with sentencepiece
(encode per line). Prints one JSON line; mb_per_s is the median over repeats.

usage: tokenize_hf.py --tokenizer DIR_OR_FILE --corpus FILE [--repeat 5] [--warmup 1] [--lines-per-doc 1]
"""
import os

# One thread, set before tokenizers starts its pool.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402


def timed(fn, repeat, warmup):
    times, out = [], None
    for r in range(warmup + repeat):
        t0 = time.perf_counter()
        out = fn()
        if r >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--lines-per-doc", type=int, default=1)
    a = ap.parse_args()
    with open(a.corpus, "rb") as f:
        lines = f.read().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, as std::getline reads it
    n_lines, k = len(lines), a.lines_per_doc
    lines = ["\n".join(lines[i:i + k]) for i in range(0, n_lines, k)]
    nbytes = sum(len(l.encode("utf-8")) for l in lines)

    path = a.tokenizer
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json" if os.path.exists(os.path.join(path, "tokenizer.json"))
                            else "tokenizer.model")
    result = {"tokenizer": a.tokenizer, "corpus": a.corpus, "lines": n_lines, "docs": len(lines), "bytes": nbytes,
              "repeat": a.repeat}
    if path.endswith(".json"):
        import tokenizers
        tok = tokenizers.Tokenizer.from_file(path)
        per_line, tokens = timed(lambda: sum(len(tok.encode(l, add_special_tokens=False).ids) for l in lines),
                                 a.repeat, a.warmup)
        batch, _ = timed(lambda: tok.encode_batch(lines, add_special_tokens=False), a.repeat, a.warmup)
        result.update(impl="tokenizers", version=tokenizers.__version__,
                      batch_seconds=batch, batch_mb_per_s=nbytes / batch / 1e6)
    else:
        import sentencepiece
        sp = sentencepiece.SentencePieceProcessor(model_file=path)
        per_line, tokens = timed(lambda: sum(len(sp.encode(l)) for l in lines), a.repeat, a.warmup)
        result.update(impl="sentencepiece", version=sentencepiece.__version__)
    result.update(tokens=tokens, seconds=per_line, mb_per_s=nbytes / per_line / 1e6,
                  tokens_per_s=tokens / per_line)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
