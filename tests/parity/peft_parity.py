"""LoRA adapters: Anvil's adapter folders must load in PEFT, and PEFT's in Anvil,
with equal logits (max-abs <= 1e-4, float32); a merged export must give the
adapted logits in plain transformers.

usage: peft_parity.py ANVIL_BIN WORKDIR CASE.json
CASE.json: [{"base": DIR, "adapter": DIR, "merged": DIR, "targets": [...]}, ...]
  adapter: written by Anvil (a LoRA checkpoint's layout); merged: by
  `anvil export --merge-lora`. For each case PEFT also writes an adapter of its
  own (random A and B, init_lora_weights=False) on `targets`, which Anvil reads.
"""
import json
import os
import subprocess
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

TOL = 1e-4


def anvil_logits(anvil, work, model_dir, ids):
    ids_path, out_path = os.path.join(work, "ids.json"), os.path.join(work, "out.safetensors")
    with open(ids_path, "w") as f:
        json.dump(ids, f)
    subprocess.run([anvil, "logits", "--model", model_dir, "--input", ids_path, "--output", out_path], check=True)
    return load_file(out_path)["logits"]


def check(name, ours, ref):
    diff = (ours - ref).abs().max().item()
    print(f"{name}: max-abs diff {diff:.3g}")
    if ours.shape != ref.shape or not diff <= TOL:
        raise SystemExit(f"FAIL {name}: shapes {tuple(ours.shape)} / {tuple(ref.shape)}, max-abs diff {diff} > {TOL}")


def main():
    anvil, work = sys.argv[1], sys.argv[2]
    with open(sys.argv[3]) as f:
        cases = json.load(f)
    torch.manual_seed(0)
    for i, c in enumerate(cases):
        base = AutoModelForCausalLM.from_pretrained(c["base"]).eval()
        ids = torch.randint(0, base.config.vocab_size, (2, 11)).tolist()
        with torch.no_grad():
            plain = base(torch.tensor(ids)).logits
        # Anvil's adapter in PEFT.
        peft_model = PeftModel.from_pretrained(base, c["adapter"]).eval()
        with torch.no_grad():
            adapted = peft_model(torch.tensor(ids)).logits
        if (adapted - plain).abs().max().item() < 1e-3:
            raise SystemExit(f"FAIL {c['adapter']}: the adapter changes nothing; the test would prove nothing")
        check(f"{c['adapter']} in PEFT vs anvil logits", anvil_logits(anvil, work, c["adapter"], ids), adapted)
        # The adapter folder alone in transformers (peft installed): it finds
        # the base through adapter_config.json, as for a folder PEFT saved.
        auto = AutoModelForCausalLM.from_pretrained(c["adapter"]).eval()
        with torch.no_grad():
            check(f"{c['adapter']} via AutoModelForCausalLM vs PEFT", auto(torch.tensor(ids)).logits, adapted)
        # The merged export in plain transformers.
        merged = AutoModelForCausalLM.from_pretrained(c["merged"]).eval()
        with torch.no_grad():
            check(f"{c['merged']} (merged) in transformers vs PEFT", merged(torch.tensor(ids)).logits, adapted)
        # PEFT's own adapter in Anvil.
        base = AutoModelForCausalLM.from_pretrained(c["base"]).eval()
        cfg = LoraConfig(r=4, lora_alpha=16, target_modules=c["targets"], init_lora_weights=False,
                         task_type="CAUSAL_LM")
        theirs = get_peft_model(base, cfg).eval()
        out = os.path.join(work, f"peft-written-{i}")
        theirs.save_pretrained(out)
        with open(os.path.join(out, "adapter_config.json")) as f:
            written = json.load(f)
        if written.get("base_model_name_or_path") != c["base"]:  # Anvil finds the base there
            written["base_model_name_or_path"] = c["base"]
            with open(os.path.join(out, "adapter_config.json"), "w") as f:
                json.dump(written, f)
        with torch.no_grad():
            ref = theirs(torch.tensor(ids)).logits
        check(f"PEFT-written adapter {c['targets']} in anvil", anvil_logits(anvil, work, out, ids), ref)
    print("peft parity OK")


if __name__ == "__main__":
    main()
