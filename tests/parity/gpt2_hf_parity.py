"""GPT-2 parity against Hugging Face transformers itself.

1. Random-init GPT-2 configs built with transformers are saved with
   save_pretrained; `anvil logits` must reproduce transformers' logits.
2. An Anvil training checkpoint (argv[3], optional) must load in
   transformers.AutoModelForCausalLM as is and give Anvil's logits.

usage: gpt2_hf_parity.py ANVIL_BIN WORKDIR [CHECKPOINT_DIR]
"""
import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

TOL = 1e-4


def anvil_logits(anvil, model_dir, ids, work):
    ids_path = os.path.join(work, "ids.json")
    out_path = os.path.join(work, "out.safetensors")
    with open(ids_path, "w") as f:
        json.dump(ids, f)
    subprocess.run([anvil, "logits", "--model", model_dir, "--input", ids_path, "--output", out_path], check=True)
    return load_file(out_path)["logits"]


def check(name, ours, ref):
    diff = (ours - ref).abs().max().item()
    print(f"{name}: shape {tuple(ours.shape)} max-abs diff {diff:.3g}")
    if ours.shape != ref.shape or not diff <= TOL:
        raise SystemExit(f"FAIL {name}: max-abs diff {diff} > {TOL}")


def main():
    anvil, work = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    configs = {
        "gpt2-tiny": GPT2Config(vocab_size=97, n_positions=64, n_embd=48, n_layer=3, n_head=4),
        "gpt2-inner": GPT2Config(vocab_size=61, n_positions=32, n_embd=32, n_layer=2, n_head=2, n_inner=80,
                                 layer_norm_epsilon=1e-6),
    }
    for name, cfg in configs.items():
        d = os.path.join(work, name)
        ref_model = GPT2LMHeadModel(cfg).eval()
        # Non-trivial LayerNorm and bias values, not just the init's 1 and 0.
        with torch.no_grad():
            for n, p in ref_model.named_parameters():
                if n.endswith("bias") or ".ln_" in n:
                    p.add_(0.1 * torch.randn_like(p))
        ref_model.save_pretrained(d)
        ids = torch.randint(0, cfg.vocab_size, (3, 17)).tolist()
        with torch.no_grad():
            ref = ref_model(torch.tensor(ids)).logits
        check(name, anvil_logits(anvil, d, ids, work), ref)

    if len(sys.argv) > 3:
        ckpt = sys.argv[3]
        model = AutoModelForCausalLM.from_pretrained(ckpt).eval()
        vocab = model.config.vocab_size
        ids = torch.randint(0, vocab, (2, 11)).tolist()
        with torch.no_grad():
            ref = model(torch.tensor(ids)).logits
        check("anvil checkpoint in transformers", anvil_logits(anvil, ckpt, ids, work), ref)
    print("parity OK")


if __name__ == "__main__":
    main()
