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

loss_type apo_zero_unpaired (TRL's unpaired variant of APO-zero, D'Oosterlinck
et al. 2024, "Anchored Preference Optimization", eq. 7) has no z0 and no KL
rows (TRL does not score them; it logs kl 0):
    desirable  : w_d * (1 - sigmoid(beta * r))
    undesirable: w_u * sigmoid(beta * r)

logits/chosen and logits/rejected as TRL 1.16 logs them: per micro-batch, the
mean over the vocabulary of the logits at each position predicting one of its
desirable (undesirable) completions' tokens, summed over those tokens and
divided by their count, recorded when it has any; a logged value is the mean of
what the micro-batches recorded. The inputs are each token's vocabulary-mean
logit (random numbers); Anvil gets each example's sum and token count.

"balance": KTOTrainer's advice on desirable_weight / undesirable_weight for a
dataset of n_d desirable and n_u undesirable examples (the KTO paper's eq. 8):
the rounded ranges it prints, and whether it warns (neither weight in its
range).
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
    # Each completion token's vocabulary-mean logit, 1 to 12 tokens per completion.
    token_logits = [-1 + 0.5 * torch.randn(int(torch.randint(1, 13, ())), dtype=DTYPE) for _ in range(n)]
    return pi, ref, pi_kl, ref_kl, desirable, token_logits


def token_mean(token_logits, d):
    """TRL's logits/* of a micro-batch: the side's tokens' values summed over their count (None: no tokens)."""
    chosen = [t for t, good in zip(token_logits, d.tolist()) if good]
    if not chosen:
        return None
    every = torch.cat(chosen)
    return (every.sum() / every.numel()).item()


def case(beta, w_d, w_u, kl_shifts, sizes, sides=None, loss_type="kto"):
    batches, losses_all, z0s = [], [], []
    recorded = {k: [] for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen",
                                "logps/rejected", "logits/chosen", "logits/rejected")}
    for k, (n, shift) in enumerate(zip(sizes, kl_shifts)):
        pi, ref, pi_kl, ref_kl, d, token_logits = micro_batch(n, shift, sides[k] if sides else "both")
        r = pi - ref
        batch = {"policy_logps": pi.tolist(), "ref_logps": ref.tolist(), "desirable": d.tolist(),
                 "mean_logit_sums": [t.sum().item() for t in token_logits],
                 "token_counts": [t.numel() for t in token_logits]}
        if loss_type == "kto":
            z0 = torch.clamp((pi_kl - ref_kl).mean(), min=0)
            losses = torch.where(d, w_d * (1 - torch.sigmoid(beta * (r - z0))),
                                 w_u * (1 - torch.sigmoid(beta * (z0 - r))))
            batch.update({"policy_kl_logps": pi_kl.tolist(), "ref_kl_logps": ref_kl.tolist(), "kl": z0.item()})
        else:  # apo_zero_unpaired: no KL rows; TRL logs kl 0
            z0 = torch.zeros((), dtype=DTYPE)
            losses = torch.where(d, w_d * (1 - torch.sigmoid(beta * r)), w_u * torch.sigmoid(beta * r))
        rewards = beta * r
        batch.update({"losses": losses.tolist(), "rewards": rewards.tolist()})
        batches.append(batch)
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
        for key, side in (("logits/chosen", d), ("logits/rejected", ~d)):
            if (value := token_mean(token_logits, side)) is not None:
                recorded[key].append(value)
    every = torch.cat(losses_all)
    metrics = {k: sum(v) / len(v) for k, v in recorded.items() if v}
    metrics["kl"] = sum(z0s) / len(z0s)
    return {
        "beta": beta, "desirable_weight": w_d, "undesirable_weight": w_u, "loss_type": loss_type,
        "micro_batches": batches, "loss": (every.sum() / every.numel()).item(), "metrics": metrics,
        "absent": sorted(k for k, v in recorded.items() if not v),
        "clamped": loss_type == "kto" and any(z == 0 for z in z0s),
    }


def balance(desirable, undesirable, w_d, w_u):
    """KTOTrainer's check of the weights against the class balance, from its text: the bounds rounded to 2
    decimals (1.33 for 4/3), a warning when neither weight is within its own. TRL skips the check when the
    counts are equal (its default weights are then in range); the paper's advice holds there too, so Anvil
    checks every case (the case of equal counts and w_u 1.33 below warns)."""
    n_d, n_u = max(desirable, 1), max(undesirable, 1)
    d_lo, d_hi = round(n_u * w_u / n_d, 2), round(n_u * w_u / n_d * 1.33, 2)
    u_lo, u_hi = round(n_d * w_d / n_u / 1.33, 2), round(n_d * w_d / n_u, 2)
    warns = not (d_lo <= w_d <= d_hi or u_lo <= w_u <= u_hi)
    return {"desirable": desirable, "undesirable": undesirable, "desirable_weight": w_d, "undesirable_weight": w_u,
            "warns": warns, "desirable_range": [d_lo, d_hi], "undesirable_range": [u_lo, u_hi]}


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: kto_reference.py OUT.json")
    torch.manual_seed(0)
    cases = [case(0.1, 1.0, 1.0, [2.0, 0.5], [8, 5]),
             case(0.5, 1.0, 1.33, [1.0, 3.0], [6, 6]),
             case(0.1, 1.0, 1.0, [-3.0, 1.5], [7, 4]),  # the first micro-batch's KL estimate clamps to 0
             # micro-batches of one label: the margin only from the one with both, then none at all
             case(0.2, 1.0, 1.0, [1.0, 0.5, 2.0], [4, 5, 6], ["desirable", "both", "undesirable"]),
             case(0.2, 1.0, 1.0, [1.0, 0.5], [4, 3], ["desirable", "desirable"]),
             # apo_zero_unpaired: no reference point, whatever the KL rows would say
             case(0.1, 1.0, 1.0, [2.0, 0.5], [8, 5], loss_type="apo_zero_unpaired"),
             case(0.5, 1.0, 1.33, [1.0, 3.0], [6, 6], ["both", "undesirable"], loss_type="apo_zero_unpaired")]
    assert cases[2]["clamped"] and not cases[0]["clamped"]
    assert cases[4]["absent"] == ["logits/rejected", "logps/rejected", "rewards/margins", "rewards/rejected"]
    balances = [balance(400, 400, 1.0, 1.0), balance(300, 100, 1.0, 1.0), balance(100, 300, 1.0, 1.0),
                balance(100, 300, 3.5, 1.0), balance(100, 300, 1.0, 0.3), balance(0, 50, 1.0, 1.0),
                balance(400, 400, 1.0, 1.33), balance(120, 100, 1.0, 1.0)]
    assert [b["warns"] for b in balances] == [False, True, True, False, False, True, True, False]
    with open(sys.argv[1], "w") as f:
        json.dump({"kto": cases, "balance": balances}, f, indent=1)


if __name__ == "__main__":
    main()
