"""Reads a TensorBoard log folder with the `tensorboard` package's own
EventAccumulator (orphaned data purged on restarts, as TensorBoard shows it)
and prints {"scalars": {tag: [[step, value], ...]}, "texts": {tag: [[step,
text], ...]}} as JSON.

usage: tensorboard_read.py LOGDIR
"""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator as ea


def main():
    acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    out = {"scalars": {}, "texts": {}}
    for tag in tags.get("scalars", []):
        out["scalars"][tag] = [[e.step, e.value] for e in acc.Scalars(tag)]
    for tag in tags.get("tensors", []):
        out["texts"][tag] = [[e.step, e.tensor_proto.string_val[0].decode("utf-8")] for e in acc.Tensors(tag)]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
