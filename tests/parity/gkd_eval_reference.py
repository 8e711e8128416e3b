"""The held-out loss of Anvil's `algorithm: distill` as TRL 1.16's
GKDTrainer computes it: the student's and the teacher's logits from
transformers, on prompt + the record's response (teacher forcing), shifted as
GKDTrainer.compute_loss shifts them, through TRL's own
GKDTrainer.generalized_jsd_loss with labels -100 on the prompt and the
padding ("batchmean": summed over the response tokens, divided by their
number).

usage: gkd_eval_reference.py STUDENT_DIR TEACHER_DIR ROWS.json

ROWS.json: {"rows": [[prompt_ids, response_ids], ...], "beta": b,
"temperatures": [t, ...]}. Prints one JSON line {"loss": [one per
temperature]}, every row in one batch.

GKDTrainer.compute_loss calls generalized_jsd_loss with its default
temperature, 1.0; Anvil divides both models' logits by distill.temperature
(docs/algorithms.md), so the temperature is passed here as Anvil uses it.
TRL is not in .venv, which keeps the versions the other references were
made with: scripts/setup.sh installs it into .venv/trl, which goes first on
sys.path (as tests/parity/trl_reference.py).
"""
import json
import os
import sys
import warnings

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.join(sys.prefix, "trl"))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from trl.experimental.gkd.gkd_trainer import GKDTrainer  # noqa: E402


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: gkd_eval_reference.py STUDENT_DIR TEACHER_DIR ROWS.json")
    student = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
    teacher = AutoModelForCausalLM.from_pretrained(sys.argv[2]).eval()
    spec = json.load(open(sys.argv[3]))
    rows = spec["rows"]
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        mask[i, : len(p) + len(r)] = 1
        labels[i, len(p) : len(p) + len(r)] = torch.tensor(r)
    with torch.no_grad():
        s = student(input_ids=ids, attention_mask=mask).logits
        t = teacher(input_ids=ids, attention_mask=mask).logits
    losses = [
        GKDTrainer.generalized_jsd_loss(
            student_logits=s[:, :-1, :],
            teacher_logits=t[:, :-1, :],
            labels=labels[:, 1:],
            beta=spec["beta"],
            temperature=temperature,
        ).item()
        for temperature in spec["temperatures"]
    ]
    print(json.dumps({"loss": losses}))


if __name__ == "__main__":
    main()
