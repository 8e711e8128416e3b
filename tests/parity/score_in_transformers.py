"""Exported Anvil reward models must load in
transformers.AutoModelForSequenceClassification as is; prints the scores it
gives for right-padded token ids, for the C++ test to compare with ours.

usage: score_in_transformers.py MODEL_DIR IDS_JSON OUT_JSON
"""
import json
import sys

import torch
from transformers import AutoModelForSequenceClassification


def main():
    model_dir, ids_path, out_path = sys.argv[1:4]
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with open(ids_path) as f:
        ids = torch.tensor(json.load(f))
    with torch.no_grad():
        logits = model(ids).logits  # (B, num_labels); HF reads the last non-pad token
    with open(out_path, "w") as f:
        json.dump({"class": type(model).__name__, "num_labels": model.config.num_labels,
                   "pad_token_id": model.config.pad_token_id, "dtype": str(model.dtype),
                   "scores": logits[:, 0].tolist()}, f)


if __name__ == "__main__":
    main()
