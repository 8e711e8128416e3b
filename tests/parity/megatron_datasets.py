"""Megatron indexed datasets written and read by megatron-core itself (PyPI
`megatron-core`, megatron.core.datasets.indexed_dataset), for the C++ tests
(tests/data/megatron_test.cpp).

usage:
  megatron_datasets.py write OUTDIR   writes OUTDIR/<dtype>.bin/.idx for every
      dtype megatron's DType has, with IndexedDatasetBuilder (documents of one
      or several sequences), and OUTDIR/expected.json: {dtype: [document token lists]}
  megatron_datasets.py read PREFIX    prints the documents of PREFIX as JSON
      lists of token ids, read with IndexedDataset
"""
import json
import os
import random
import sys
import warnings

warnings.filterwarnings("ignore")

import numpy  # noqa: E402
import torch  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder  # noqa: E402

DTYPES = {"uint8": numpy.uint8, "int8": numpy.int8, "int16": numpy.int16, "int32": numpy.int32,
          "int64": numpy.int64, "float64": numpy.float64, "float32": numpy.float32, "uint16": numpy.uint16}


def write(out):
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1234)
    expected = {}
    for name, dtype in DTYPES.items():
        top = {"int8": 120, "uint8": 250, "int16": 30000, "uint16": 60000}.get(name, 50000)
        prefix = os.path.join(out, name)
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
        docs = []
        for d in range(40):
            doc = []
            for _ in range(rng.randint(1, 3)):  # a document of one or several sequences
                seq = [rng.randrange(top) for _ in range(rng.randint(1, 30))]
                builder.add_item(torch.tensor(seq))
                doc += seq
            builder.end_document()
            docs.append(doc)
        builder.finalize(prefix + ".idx")
        expected[name] = docs
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)


def read(prefix):
    ds = IndexedDataset(prefix)
    docs = []
    di = ds.document_indices
    for d in range(len(di) - 1):
        doc = []
        for s in range(di[d], di[d + 1]):
            doc += [int(x) for x in ds[s]]
        docs.append(doc)
    json.dump(docs, sys.stdout)


if __name__ == "__main__":
    {"write": write, "read": read}[sys.argv[1]](sys.argv[2])
