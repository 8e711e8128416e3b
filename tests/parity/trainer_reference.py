"""transformers' own Trainer on an SFT run, for Anvil's trainer to follow.

    trainer_reference.py DIR [CASE]

writes DIR/train.jsonl (the first 4000 lines of data/sft_train.jsonl),
DIR/init (a random tiny GPT-2 folder, HF layout) and, for every case of
CASES (or CASE alone), DIR/CASE/spec.json and DIR/CASE/ref.json: the
Trainer's loss at every step and the parameters it does not decay. One
process runs them all (ctest's ParityReferences.Trainer fixture); the test
(tests/train/trainer_parity_test.cpp) runs Anvil on each spec.json.

A spec names the model folder, the SentencePiece tokenizer, the JSONL data and
the settings (micro batch, accumulation, lr, schedule, weight decay, clipping,
betas, eps, steps, max_length). The samples are built as Anvil's `plain` chat
format documents them (docs/data.md): the prompt's tokens (its line ending in a
newline), the response's tokens and EOS, the prompt's labels masked, cut at
max_length; the rows follow the file's order (Anvil's data.shuffle: false), so
the Trainer gets a sequential sampler instead of its seeded random one.
The optimizer is the Trainer's `adamw_torch_fused`, torch's fused AdamW
kernel, which Anvil's `optimizer.fused: true` (the default) also runs:
`adamw_torch` (the foreach kernel) rounds differently, and over 200 steps the
two curves drift apart by about 1e-5. Everything else is the Trainer's own:
its decay groups
(get_decay_parameter_names), its scheduler, its clipping and its loss
normalisation over accumulated micro-batches (num_items_in_batch).
"""
import json
import os
import sys

import sentencepiece as spm
import torch
from torch.utils.data import SequentialSampler
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


def init(spec, out_dir):
    torch.manual_seed(spec["seed"])
    sp = spm.SentencePieceProcessor(model_file=spec["tokenizer"])
    cfg = GPT2Config(vocab_size=sp.get_piece_size(), n_positions=spec["max_length"], n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=sp.bos_id(),
                     eos_token_id=sp.eos_id())
    GPT2LMHeadModel(cfg).save_pretrained(out_dir)


def samples(spec):
    sp = spm.SentencePieceProcessor(model_file=spec["tokenizer"])
    out = []
    with open(spec["data"]) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            prompt = r["prompt"] if r["prompt"].endswith("\n") else r["prompt"] + "\n"
            p = sp.encode(prompt)
            ids = p + sp.encode(r["response"]) + [sp.eos_id()]
            labels = [-100] * len(p) + ids[len(p):]
            n = spec["max_length"]
            out.append({"input_ids": ids[:n], "labels": labels[:n]})
    return out, sp.pad_id() if sp.pad_id() >= 0 else sp.eos_id()


class Sequential(Trainer):
    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)


def train(spec, out_path):
    rows, pad = samples(spec)

    def collate(batch):
        n = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), n), pad, dtype=torch.long)
        labels = torch.full((len(batch), n), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), n), dtype=torch.long)
        for i, b in enumerate(batch):
            k = len(b["input_ids"])
            ids[i, :k] = torch.tensor(b["input_ids"])
            labels[i, :k] = torch.tensor(b["labels"])
            mask[i, :k] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    losses = {}

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses[state.global_step] = logs["loss"]

    args = TrainingArguments(
        output_dir=spec["work_dir"], per_device_train_batch_size=spec["micro_batch"],
        gradient_accumulation_steps=spec["accum"], max_steps=spec["steps"], learning_rate=spec["lr"],
        weight_decay=spec["weight_decay"], warmup_steps=spec["warmup"], lr_scheduler_type=spec["schedule"],
        max_grad_norm=spec["max_grad_norm"], adam_beta1=spec["betas"][0], adam_beta2=spec["betas"][1],
        adam_epsilon=spec["eps"], optim="adamw_torch_fused", logging_steps=1, report_to=[], save_strategy="no",
        use_cpu=True, dataloader_num_workers=0, seed=spec["seed"], remove_unused_columns=False,
        disable_tqdm=True)
    torch.set_num_threads(1)
    model = GPT2LMHeadModel.from_pretrained(spec["model"], torch_dtype=torch.float32)
    trainer = Sequential(model=model, args=args, train_dataset=rows, data_collator=collate,
                         callbacks=[Record()])
    decayed = set(trainer.get_decay_parameter_names(model))
    trainer.train()
    with open(out_path, "w") as f:
        json.dump({"losses": [losses[s] for s in sorted(losses)],
                   "not_decayed": sorted(n for n, _ in model.named_parameters() if n not in decayed)}, f)


# Name: (gradient accumulation, weight decay); the test's parameter names.
CASES = {"accum1_nodecay": (1, 0.0), "accum2_nodecay": (2, 0.0), "accum1_decay": (1, 0.1), "accum2_decay": (2, 0.1)}


def main(out, only=None):
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    os.makedirs(out, exist_ok=True)
    data = os.path.join(out, "train.jsonl")
    with open(os.path.join(src, "data", "sft_train.jsonl")) as f, open(data, "w") as d:
        for i, line in enumerate(f):
            if i == 4000:
                break
            d.write(line)
    base = {"seed": 7, "tokenizer": os.path.abspath(os.path.join(src, "data", "tokenizer.model")), "data": data,
            "model": os.path.join(out, "init"), "max_length": 32, "micro_batch": 8, "steps": 200, "lr": 3e-3,
            "warmup": 20, "schedule": "cosine", "max_grad_norm": 1.0, "betas": [0.9, 0.98], "eps": 1e-8}
    init(base, base["model"])
    for name, (accum, decay) in CASES.items():
        if only and name != only:
            continue
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        spec = dict(base, accum=accum, weight_decay=decay, work_dir=os.path.join(d, "hf"))
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(spec, f)
        train(spec, os.path.join(d, "ref.json"))
        print(f"{name}: {len(spec)} settings, reference written")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
