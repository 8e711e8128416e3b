"""Reads a TensorBoard log folder the way `tensorboard --logdir` does: through
the `tensorboard` package's plugin event accumulator (the data provider's
loader: simple values migrated to tensors, orphaned data purged at each
SessionLog.START after the first) and prints {"scalars": {tag: [[step,
value], ...]}, "texts": {tag: [[step, text], ...]}} as JSON.

usage: tensorboard_read.py LOGDIR
"""
import json
import sys

from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.util import tensor_util


def main():
    acc = pea.EventAccumulator(sys.argv[1], size_guidance={pea.TENSORS: 0})
    acc.Reload()
    out = {"scalars": {}, "texts": {}}
    for tag in acc.Tags().get("tensors", []):
        plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
        events = acc.Tensors(tag)
        if plugin == "scalars":
            out["scalars"][tag] = [[e.step, float(tensor_util.make_ndarray(e.tensor_proto).item())] for e in events]
        elif plugin == "text":
            out["texts"][tag] = [[e.step, e.tensor_proto.string_val[0].decode("utf-8")] for e in events]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
