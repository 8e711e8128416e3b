"""Independent reference values for Anvil's on-policy distillation loss
(algorithm: distill): the generalised Jensen-Shannon divergence of GKD.

Usage: distill_reference.py OUT.json

Written from the paper's definition (Agarwal et al. 2024, "On-Policy
Distillation of Language Models", section 3), as TRL's GKDTrainer uses it,
without importing TRL. With token distributions P_T (teacher) and P_S
(student), both softmax(logits / temperature), and beta in [0, 1]:
    beta = 0:  KL(P_T || P_S)                     (forward KL)
    beta = 1:  KL(P_S || P_T)                     (reverse KL)
    else:      M = beta P_T + (1 - beta) P_S
               JSD = beta KL(P_T || M) + (1 - beta) KL(P_S || M)
computed here on probabilities (not log-probs) in float64.
"""
import json
import sys

import torch

DTYPE = torch.float64


def kl(p, q):
    return (p * (p.log() - q.log())).sum(-1)


def jsd(student, teacher, beta, temperature):
    ps = torch.softmax(student / temperature, -1)
    pt = torch.softmax(teacher / temperature, -1)
    if beta == 0:
        return kl(pt, ps)
    if beta == 1:
        return kl(ps, pt)
    m = beta * pt + (1 - beta) * ps
    return beta * kl(pt, m) + (1 - beta) * kl(ps, m)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: distill_reference.py OUT.json")
    torch.manual_seed(0)
    cases = []
    for beta, temperature in [(0.0, 1.0), (1.0, 1.0), (0.5, 0.9), (0.1, 1.3), (0.9, 0.7)]:
        student = 3 * torch.randn(12, 17, dtype=DTYPE)
        teacher = student + 2 * torch.randn(12, 17, dtype=DTYPE)
        out = jsd(student, teacher, beta, temperature)
        assert (out >= 0).all()
        cases.append({"beta": beta, "temperature": temperature, "student": student.tolist(),
                      "teacher": teacher.tolist(), "jsd": out.tolist()})
    # The same logits give 0 at every beta.
    same = torch.randn(4, 9, dtype=DTYPE)
    assert jsd(same, same, 0.5, 1.0).abs().max() < 1e-12
    with open(sys.argv[1], "w") as f:
        json.dump({"jsd": cases}, f, indent=1)


if __name__ == "__main__":
    main()
