"""MosaicML streaming (MDS) folders written by mosaicml-streaming's own
MDSWriter (PyPI `mosaicml-streaming`, installed by scripts/setup.sh into
.venv/mds-streaming), for the C++ tests (tests/data/mds_test.cpp).

usage:
  mds_datasets.py write OUTDIR   writes one MDS folder per case below into
      OUTDIR/<case>/ (index.json + shards), OUTDIR/expected.json:
      {case: [sample token lists]}, and OUTDIR/streaming_cache: streaming's
      local cache of ndarray_dynamic_zstd as a StreamingDataset leaves it
      (shards fetched and decompressed, the compressed files dropped)
  mds_datasets.py tokens OUTDIR TOP [OUTDIR TOP ...]   writes OUTDIR as
      llm-foundry's convert_dataset_hf --concat_tokens does (a `tokens`
      column of ndarray:int32, zstd), 60 samples of ids below TOP

The package pins transformers<5, numpy<2.2 and torchvision, so it is not in
.venv itself. Its top-level __init__ imports its vision datasets (torchvision);
the writer never needs them, so the package's namespace is entered without
running that __init__. Every module used is the package's own code.
"""
import importlib.util
import json
import os
import random
import sys
import types
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.join(sys.prefix, "mds-streaming"))

import numpy  # noqa: E402


def _streaming_namespace():
    spec = importlib.util.find_spec("streaming")
    if spec is None:
        sys.exit("mosaicml-streaming is not installed in .venv/mds-streaming; run scripts/setup.sh")
    package = types.ModuleType("streaming")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["streaming"] = package


_streaming_namespace()
from streaming.base.format.mds.writer import MDSWriter  # noqa: E402

# case -> (columns, compression, hashes, dtype of the token ids, id bound)
CASES = {
    # llm-foundry before ndarray columns: int64 ids as raw bytes, beside other columns.
    "bytes_int64": ({"id": "int", "tokens": "bytes", "url": "str"}, None, ["sha1", "xxh64"], numpy.int64, 250),
    # The same with token_encoding_type int32: read with MdsOptions::bytes_dtype.
    "bytes_int32_zstd": ({"tokens": "bytes"}, "zstd", None, numpy.int32, 250),
    # llm-foundry's convert_dataset_hf --concat_tokens --compression zstd.
    "ndarray_int32_zstd": ({"tokens": "ndarray:int32"}, "zstd", None, numpy.int32, 250),
    "ndarray_uint16": ({"tokens": "ndarray:uint16", "text": "str"}, None, None, numpy.uint16, 60000),
    # dtype and shape stored in every sample; some samples two-dimensional.
    "ndarray_dynamic_zstd": ({"tokens": "ndarray"}, "zstd:7", None, numpy.uint32, 100000),
    # fixed dtype and shape: no size in the sample header.
    "ndarray_fixed_int64": ({"tokens": "ndarray:int64:12"}, None, None, numpy.int64, 250),
}


def _sample(rng, case, dtype, top, i):
    columns = CASES[case][0]
    n = 12 if case == "ndarray_fixed_int64" else rng.randint(1, 40)
    ids = numpy.array([rng.randrange(top) for _ in range(n)], dtype=dtype)
    encoding = columns["tokens"]
    if encoding == "bytes":
        tokens = ids.tobytes()
    elif case == "ndarray_dynamic_zstd" and n % 2 == 0 and i % 3 == 0:
        tokens = ids.reshape(2, n // 2)  # read row by row
    else:
        tokens = ids
    sample = {"tokens": tokens}
    if "id" in columns:
        sample["id"] = i
    if "url" in columns:
        sample["url"] = "https://example.com/" + "x" * rng.randint(0, 20)
    if "text" in columns:
        sample["text"] = "doc %d" % i
    return sample, [int(x) for x in ids]


def write(out):
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1234)
    expected = {}
    for case, (columns, compression, hashes, dtype, top) in CASES.items():
        docs = []
        # A small size limit gives several shards.
        with MDSWriter(columns=columns, out=os.path.join(out, case), compression=compression, hashes=hashes,
                       size_limit=1 << 10) as writer:
            for i in range(80):
                sample, ids = _sample(rng, case, dtype, top, i)
                writer.write(sample)
                docs.append(ids)
        expected[case] = docs
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
    cache(os.path.join(out, "ndarray_dynamic_zstd"), os.path.join(out, "streaming_cache"))


def cache(remote, local):
    from streaming.base.stream import Stream
    from streaming.base.world import World
    stream = Stream(remote=remote, local=local)
    stream.apply_default({"split": None, "download_retry": 2, "download_timeout": 60, "validate_hash": None,
                          "keep_zip": False})
    for shard in stream.get_shards(World.detect(), allow_unsafe_types=False):
        stream.prepare_shard(shard)


def tokens(*pairs):
    for out, top in zip(pairs[::2], pairs[1::2]):
        rng = random.Random(99)
        with MDSWriter(columns={"tokens": "ndarray:int32"}, out=out, compression="zstd", size_limit=1 << 11) as writer:
            for _ in range(60):
                writer.write({"tokens": numpy.array([rng.randrange(int(top)) for _ in range(32)], dtype=numpy.int32)})


def tokens_bytes(out, top):
    """Tokens as raw int32 `bytes`, as llm-foundry's text-to-MDS conversion
    writes them with a non-default dtype (the reader must be told)."""
    rng = random.Random(7)
    with MDSWriter(columns={"tokens": "bytes"}, out=out, compression=None, size_limit=1 << 11) as writer:
        for _ in range(60):
            writer.write({"tokens": numpy.array([rng.randrange(int(top)) for _ in range(32)], dtype=numpy.int32).tobytes()})


if __name__ == "__main__":
    {"write": write, "tokens": tokens, "tokens_bytes": tokens_bytes}[sys.argv[1]](*sys.argv[2:])
