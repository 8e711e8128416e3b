"""Exported Anvil models must load in transformers.AutoModelForCausalLM as is
and give the logits `anvil logits` gives (max-abs <= 1e-4 in float32).

usage: logits_in_transformers.py ANVIL_BIN WORKDIR MODEL_DIR [MODEL_DIR ...]
"""
import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

TOL = 1e-4


def main():
    anvil, work, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
    torch.manual_seed(0)
    for d in dirs:
        model = AutoModelForCausalLM.from_pretrained(d).eval()
        if model.dtype != torch.float32:
            raise SystemExit(f"FAIL {d}: loaded as {model.dtype}, expected float32")
        ids = torch.randint(0, model.config.vocab_size, (2, 13)).tolist()
        ids_path, out_path = os.path.join(work, "ids.json"), os.path.join(work, "out.safetensors")
        with open(ids_path, "w") as f:
            json.dump(ids, f)
        subprocess.run([anvil, "logits", "--model", d, "--input", ids_path, "--output", out_path], check=True)
        ours = load_file(out_path)["logits"]
        with torch.no_grad():
            ref = model(torch.tensor(ids)).logits
        diff = (ours - ref).abs().max().item()
        print(f"{d}: {type(model).__name__} shape {tuple(ours.shape)} max-abs diff {diff:.3g}")
        if ours.shape != ref.shape or not diff <= TOL:
            raise SystemExit(f"FAIL {d}: max-abs diff {diff} > {TOL}")
    print("transformers parity OK")


if __name__ == "__main__":
    main()
