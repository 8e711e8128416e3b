"""Independent reference values for Anvil's KTO loss (algorithm: kto).

Usage: kto_reference.py OUT.json

Written from the published definition (Ethayarajh et al. 2024, "KTO: Model
Alignment as Prospect Theoretic Optimization", eq. 8) as Hugging Face TRL's
KTOTrainer.kto_loss computes it, without importing TRL. Inputs are fixed random
numbers (torch.manual_seed(0)); all maths is float64.

For a micro-batch of examples with summed completion log-probs pi (policy) and
ref (reference), labels desirable / undesirable, and the log-probs pi_kl, ref_kl
of its mismatched rows (each prompt with another example's completion):
    z0         = max(0, mean(pi_kl - ref_kl))            (detached; one per micro-batch)
    r          = pi - ref
    desirable  : w_d * (1 - sigmoid(beta * (r - z0)))
    undesirable: w_u * (1 - sigmoid(beta * (z0 - r)))
    rewards    = beta * r
A step's loss is the sum of its examples' losses over its examples (Anvil's
unit; TRL's mean per micro-batch is the same for equal micro-batches).
Metrics as TRL 1.16's KTOTrainer logs them: per micro-batch, rewards/chosen
and logps/chosen are means over its desirable examples, recorded only when it
has any (rejected alike over undesirable ones), rewards/margins their
difference, recorded only when it has both; a logged value is the mean of
what the micro-batches recorded; kl the mean z0. No count/* (TRL 1.16 logs
none).
"""
import json
import sys

import torch

DTYPE = torch.float64


def micro_batch(n, kl_shift, sides):
    ref = torch.empty(n, dtype=DTYPE).uniform_(-30, -3)
    pi = ref + 2 * torch.randn(n, dtype=DTYPE)
    ref_kl = torch.empty(n, dtype=DTYPE).uniform_(-40, -10)
    pi_kl = ref_kl + kl_shift + torch.randn(n, dtype=DTYPE)
    desirable = torch.rand(n) < 0.5
    if sides == "both":
        desirable[0], desirable[1] = True, False
    else:  # a micro-batch of one label only
        desirable[:] = sides == "desirable"
    return pi, ref, pi_kl, ref_kl, desirable


def case(beta, w_d, w_u, kl_shifts, sizes, sides=None):
    batches, losses_all, z0s = [], [], []
    recorded = {k: [] for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen",
                                "logps/rejected")}
    for k, (n, shift) in enumerate(zip(sizes, kl_shifts)):
        pi, ref, pi_kl, ref_kl, d = micro_batch(n, shift, sides[k] if sides else "both")
        z0 = torch.clamp((pi_kl - ref_kl).mean(), min=0)
        r = pi - ref
        losses = torch.where(d, w_d * (1 - torch.sigmoid(beta * (r - z0))),
                             w_u * (1 - torch.sigmoid(beta * (z0 - r))))
        rewards = beta * r
        batches.append({
            "policy_logps": pi.tolist(), "ref_logps": ref.tolist(),
            "policy_kl_logps": pi_kl.tolist(), "ref_kl_logps": ref_kl.tolist(),
            "desirable": d.tolist(), "kl": z0.item(), "losses": losses.tolist(), "rewards": rewards.tolist(),
        })
        losses_all.append(losses)
        z0s.append(z0.item())
        if d.any():
            recorded["rewards/chosen"].append(rewards[d].mean().item())
            recorded["logps/chosen"].append(pi[d].mean().item())
        if (~d).any():
            recorded["rewards/rejected"].append(rewards[~d].mean().item())
            recorded["logps/rejected"].append(pi[~d].mean().item())
        if d.any() and (~d).any():
            recorded["rewards/margins"].append(recorded["rewards/chosen"][-1] - recorded["rewards/rejected"][-1])
    every = torch.cat(losses_all)
    metrics = {k: sum(v) / len(v) for k, v in recorded.items() if v}
    metrics["kl"] = sum(z0s) / len(z0s)
    return {
        "beta": beta, "desirable_weight": w_d, "undesirable_weight": w_u, "micro_batches": batches,
        "loss": (every.sum() / every.numel()).item(), "metrics": metrics,
        "absent": sorted(k for k, v in recorded.items() if not v),
        "clamped": any(z == 0 for z in z0s),
    }


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: kto_reference.py OUT.json")
    torch.manual_seed(0)
    cases = [case(0.1, 1.0, 1.0, [2.0, 0.5], [8, 5]),
             case(0.5, 1.0, 1.33, [1.0, 3.0], [6, 6]),
             case(0.1, 1.0, 1.0, [-3.0, 1.5], [7, 4]),  # the first micro-batch's KL estimate clamps to 0
             # micro-batches of one label: the margin only from the one with both, then none at all
             case(0.2, 1.0, 1.0, [1.0, 0.5, 2.0], [4, 5, 6], ["desirable", "both", "undesirable"]),
             case(0.2, 1.0, 1.0, [1.0, 0.5], [4, 3], ["desirable", "desirable"])]
    assert cases[2]["clamped"] and not cases[0]["clamped"]
    assert cases[4]["absent"] == ["logps/rejected", "rewards/margins", "rewards/rejected"]
    with open(sys.argv[1], "w") as f:
        json.dump({"kto": cases}, f, indent=1)


if __name__ == "__main__":
    main()
