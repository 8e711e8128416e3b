"""TRL 1.16's own DPOTrainer, ORPOTrainer and KTOTrainer, for Anvil's
`dpo.loss_type` sigmoid and orpo and `algorithm: kto` (`kto.loss_type` kto and
apo_zero_unpaired) to follow step for step.

    trl_reference.py DIR [CASE]

writes DIR/init (a random tiny GPT-2 folder, HF layout, float32, with the
bundled SentencePiece tokenizer and a tokenizer_config.json that adds BOS),
DIR/orpo.jsonl (the first 800 pairs of data/dpo_train.jsonl), DIR/kto.jsonl
(the same 800 prompts, each with its chosen or its rejected reply by a seeded
coin: TRL's unpaired {prompt, completion, label} records) and, for every case
of CASES (or CASE alone), DIR/CASE/spec.json and DIR/CASE/ref.json: the
trainer's loss, learning rate, gradient norm and every metric it logs at each
of 100 steps, the first micro-batches as its collator built them, and the
trained parameters' sums.

Everything that decides a step is TRL's own code: its tokenization and
truncation, its collators, its losses, its metrics and their averaging over a
step's micro-batches; this script only chooses the settings. TRL and the
datasets library are not in .venv, which keeps the versions the other
references were made with: scripts/setup.sh installs them into .venv/trl,
which goes first on sys.path.

Settings shared with Anvil (spec.json names them all):
- data order: the file's (Anvil's data.shuffle: false; the trainers'
  train_sampling_strategy "sequential"); 800 examples, exactly one epoch of
  100 steps of 4 x 2.
- max_length 20 cuts the reply of about a third of the rows; no prompt fills
  it (TRL keeps such an ORPO row with an empty reply, whose mean log-prob is
  0/0; Anvil drops it).
- BOS: TRL's ORPOTrainer puts the tokenizer's BOS before every prompt whatever
  add_bos_token says; its KTOTrainer tokenizes with the tokenizer's own special
  tokens. A tokenizer that adds BOS (tokenizer_config.json add_bos_token: true,
  as Anvil reads it) gives both the same rows.
- the tokenizer: TRL tokenizes prompt + reply as one text and takes the reply
  as what follows the prompt's tokens; Anvil encodes them apart. The bundled
  SentencePiece model has no dummy prefix and cuts after the prompt's newline,
  so the two agree on these rows, which tokenizer_matches checks.
- optimizer `adamw_torch_fused` (Anvil's optimizer.fused: true), dropout off,
  float32 on the CPU, no gradient checkpointing, no bf16 (TRL's configs turn
  both on by default).

No `orpo_reply_nll` case: ORPOTrainer.concatenated_forward builds the NLL's
labels from the attention mask of the chosen rows (every prompt and reply
token), and no setting of ORPOConfig changes that.
"""
import json
import logging
import os
import random
import shutil
import sys
import time
import warnings

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.join(sys.prefix, "trl"))

import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, PrinterCallback, TrainerCallback  # noqa: E402
from transformers.tokenization_utils_sentencepiece import SentencePieceBackend  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

try:
    import datasets  # noqa: E402
    import trl  # noqa: E402
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer  # noqa: E402
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer  # noqa: E402
except ImportError as e:
    sys.exit(f"TRL is not installed in {os.path.join(sys.prefix, 'trl')} ({e}); run scripts/setup.sh")

TRL_VERSION = "1.16.0"
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
EXAMPLES = 800
# The first micro-batches as the collator built them, in ref.json.
RECORDED_BATCHES = 4


def tokenizer(spec):
    """The HF tokenizer TRL gets: the SentencePiece model itself (no dummy
    prefix, no normalisation of its own), BOS before each text it encodes with
    special tokens, as Anvil's SentencePiece backend with add_bos_token: true."""
    return SentencePieceBackend(vocab_file=os.path.join(spec["tokenizer"], "tokenizer.model"),
                                special_tokens_pattern="bos" if spec["add_bos"] else "none", **SPECIAL)


def init(spec, src):
    """The model folder: weights, and the tokenizer as Anvil reads it."""
    out = spec["model"]
    torch.manual_seed(spec["seed"])
    sp = spm.SentencePieceProcessor(model_file=os.path.join(src, "data", "tokenizer.model"))
    cfg = GPT2Config(vocab_size=sp.get_piece_size(), n_positions=spec["max_length"], n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=sp.bos_id(),
                     eos_token_id=sp.eos_id())
    GPT2LMHeadModel(cfg).save_pretrained(out)
    shutil.copyfile(os.path.join(src, "data", "tokenizer.model"), os.path.join(out, "tokenizer.model"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(dict(SPECIAL, add_bos_token=spec["add_bos"], add_eos_token=False), f, indent=1)


def write_data(src, out, seed):
    pairs = []
    with open(os.path.join(src, "data", "dpo_train.jsonl")) as f:
        for line in f:
            if line.strip():
                pairs.append(json.loads(line))
            if len(pairs) == EXAMPLES:
                break
    rng = random.Random(seed)
    unpaired = []
    for p in pairs:
        good = rng.random() < 0.5
        unpaired.append({"prompt": p["prompt"], "completion": p["chosen"] if good else p["rejected"], "label": good})
    for name, rows in (("orpo.jsonl", pairs), ("kto.jsonl", unpaired)):
        with open(os.path.join(out, name), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def tokenizer_matches(spec, tok, rows, replies):
    """TRL encodes prompt + reply as one text, Anvil apart: on these rows both
    give BOS, the prompt's pieces, the reply's pieces and EOS. Returns how
    many rows max_length cuts."""
    sp = spm.SentencePieceProcessor(model_file=os.path.join(spec["tokenizer"], "tokenizer.model"))
    bos = [sp.bos_id()] if spec["add_bos"] else []
    cut = 0
    for r in rows:
        prompt = bos + sp.encode(r["prompt"])
        assert tok(r["prompt"])["input_ids"] == prompt, r
        assert len(prompt) < spec["max_length"], ("a prompt fills max_length", r)
        for key in replies:
            reply = sp.encode(r[key]) + [sp.eos_id()]
            assert tok(r["prompt"] + r[key] + tok.eos_token)["input_ids"] == prompt + reply, r
            cut += len(prompt) + len(reply) > spec["max_length"]
    return cut


def common_args(spec):
    return dict(
        output_dir=spec["work_dir"], per_device_train_batch_size=spec["micro_batch"],
        gradient_accumulation_steps=spec["accum"], max_steps=spec["steps"], learning_rate=spec["lr"],
        weight_decay=spec["weight_decay"], warmup_steps=spec["warmup"], lr_scheduler_type=spec["schedule"],
        max_grad_norm=spec["max_grad_norm"], adam_beta1=spec["betas"][0], adam_beta2=spec["betas"][1],
        adam_epsilon=spec["eps"], optim="adamw_torch_fused", logging_steps=1, report_to=[], save_strategy="no",
        use_cpu=True, dataloader_num_workers=0, seed=spec["seed"], remove_unused_columns=False, disable_tqdm=True,
        bf16=False, gradient_checkpointing=False, train_sampling_strategy="sequential", disable_dropout=True,
        max_length=spec["max_length"], beta=spec["beta"])


class Record(TrainerCallback):
    """Every training log line (loss, learning rate, gradient norm and the
    trainer's own metrics), by step."""

    def __init__(self):
        self.logs = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logs[state.global_step] = dict(logs)


def recording(collate, into):
    """The collator, keeping its first micro-batches' tensors."""
    def run(features):
        batch = collate(features)
        if len(into) < RECORDED_BATCHES:
            into.append({k: v.tolist() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        return batch
    return run


def parameters(model):
    """Sums of the trained parameters (float64), and two whole tensors."""
    out = {}
    for name, p in model.named_parameters():
        x = p.detach().double()
        out[name] = {"shape": list(p.shape), "sum": x.sum().item(), "sum_sq": (x * x).sum().item()}
    named = dict(model.named_parameters())
    whole = {n: named[n].detach().flatten().tolist()
             for n in ("transformer.ln_f.weight", "transformer.h.1.attn.c_proj.bias")}
    return out, whole


def train(spec, out_path):
    tok = tokenizer(spec)
    rows = read_jsonl(spec["data"])
    kto = spec["algorithm"] == "kto"
    cut = tokenizer_matches(spec, tok, rows, ["completion"] if kto else ["chosen", "rejected"])
    torch.set_num_threads(1)
    model = GPT2LMHeadModel.from_pretrained(spec["model"], dtype=torch.float32)
    record = Record()
    dataset = datasets.Dataset.from_list(rows)
    if kto:
        args = KTOConfig(**common_args(spec), loss_type=spec["loss_type"], desirable_weight=spec["desirable_weight"],
                         undesirable_weight=spec["undesirable_weight"])
        trainer = KTOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok, callbacks=[record])
    elif spec["loss_type"] == "sigmoid":
        # The reference is the initial weights: DPOTrainer's own copy of the model when it gets none.
        args = DPOConfig(**common_args(spec), loss_type=["sigmoid"])
        trainer = DPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok, callbacks=[record])
    else:
        args = ORPOConfig(**common_args(spec))
        trainer = ORPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok, callbacks=[record])
    trainer.remove_callback(PrinterCallback)  # disable_tqdm prints every log line otherwise
    batches = []
    trainer.data_collator = recording(trainer.data_collator, batches)
    decayed = set(trainer.get_decay_parameter_names(model))
    start = time.time()
    trainer.train()
    seconds = time.time() - start
    steps = [record.logs[s] for s in sorted(record.logs)]
    assert len(steps) == spec["steps"], len(steps)
    skip = {"epoch", "num_tokens"}
    names = sorted({k for s in steps for k in s if k not in skip})
    params, whole = parameters(model)
    ref = {
        "trl": trl.__version__, "datasets": datasets.__version__, "seconds": seconds, "truncated_rows": cut,
        "losses": [s["loss"] for s in steps],
        # Each metric at every step; null where TRL logged none at that step.
        "metrics": {k: [s.get(k) for s in steps] for k in names},
        "logs": steps,
        "batches": batches,
        "not_decayed": sorted(n for n, _ in model.named_parameters() if n not in decayed),
        "parameters": params, "final": whole,
    }
    with open(out_path, "w") as f:
        json.dump(ref, f)
    return ref


# Name: (algorithm, data file, the case's own settings).
CASES = {
    "orpo": ("dpo", "orpo.jsonl", {"loss_type": "orpo", "beta": 0.5, "lr": 2e-3, "weight_decay": 0.1}),
    # DPO (sigmoid) against the initial weights, on the same pairs.
    "dpo": ("dpo", "orpo.jsonl", {"loss_type": "sigmoid", "beta": 2.0, "lr": 2e-3, "weight_decay": 0.1}),
    # Desirable examples weigh more, so the policy's log-probs of mismatched
    # completions rise above the reference's: the KL estimate z0 is positive
    # from step 3 on (warmup starts from 0, so steps 1 and 2 score the initial
    # weights, z0 = 0). With the weights the other way round it clamps to 0 at
    # most steps, and the KL rows would not reach the loss.
    "kto": ("kto", "kto.jsonl", {"loss_type": "kto", "beta": 0.5, "desirable_weight": 1.25,
                                 "undesirable_weight": 1.0, "lr": 5e-3, "weight_decay": 0.0}),
    # TRL's unpaired APO-zero: no KL rows (TRL scores none and logs kl 0).
    "kto_apo": ("kto", "kto.jsonl", {"loss_type": "apo_zero_unpaired", "beta": 0.5, "desirable_weight": 1.25,
                                     "undesirable_weight": 1.0, "lr": 5e-3, "weight_decay": 0.0}),
}


def main(out, only=None):
    if only and only not in CASES:
        sys.exit(f"unknown case {only}; expected one of {', '.join(CASES)}")
    if trl.__version__ != TRL_VERSION:
        sys.exit(f"expected TRL {TRL_VERSION}, found {trl.__version__} in {os.path.dirname(trl.__file__)}")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("trl").setLevel(logging.ERROR)  # KTO's advice on the weights for this data
    datasets.disable_progress_bars()
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    base = {"seed": 7, "model": os.path.join(out, "init"), "tokenizer": os.path.join(out, "init"), "add_bos": True,
            "template": "plain", "shuffle": False, "max_length": 20, "micro_batch": 4, "accum": 2, "steps": 100,
            "warmup": 10, "schedule": "cosine", "max_grad_norm": 1.0, "betas": [0.9, 0.98],
            "eps": 1e-8, "dropout": 0.0, "dtype": "float32", "optimizer": "adamw_torch_fused"}
    init(base, os.path.abspath(src))
    write_data(src, out, base["seed"])
    for name, (algorithm, data, own) in CASES.items():
        if only and name != only:
            continue
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        spec = dict(base, algorithm=algorithm, data=os.path.join(out, data), work_dir=os.path.join(d, "trl"), **own)
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(spec, f, indent=1)
        ref = train(spec, os.path.join(d, "ref.json"))
        shutil.rmtree(spec["work_dir"], ignore_errors=True)
        print(f"{name}: {len(ref['losses'])} steps in {ref['seconds']:.1f} s, loss {ref['losses'][0]:.6f} -> "
              f"{ref['losses'][-1]:.6f}, {ref['truncated_rows']} rows cut by max_length, "
              f"metrics: {', '.join(ref['metrics'])}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
