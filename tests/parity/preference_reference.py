"""Independent reference values for Anvil's preference losses (DPO and reward model).

Usage: preference_reference.py OUT.json

Written from the published formulas, without importing TRL: Hugging Face TRL's
DPOTrainer.dpo_loss and RewardTrainer.compute_loss, and Open-Assistant's K-wise
RMLoss. Inputs are fixed random numbers (torch.manual_seed(0)), all maths is float64.

DPO (TRL DPOTrainer). The *_logps are sums of token log-probs per sequence. For
loss_type "ipo" every logp is first divided by its sequence's token count.
    logits  = (pi_c - pi_r) - (ref_c - ref_r)
    sigmoid = -logsigmoid(b*logits)*(1-eps) - logsigmoid(-b*logits)*eps   (cDPO if eps > 0)
    robust  = (-logsigmoid(b*logits)*(1-eps) + logsigmoid(-b*logits)*eps) / (1 - 2*eps)
    hinge   = relu(1 - b*logits)
    ipo     = (logits - 1/(2*b))**2
    chosen_rewards = b*(pi_c - ref_c), rejected_rewards = b*(pi_r - ref_r)

Reference-free losses (no reference model; pi_* as the loss type compares them). For
orpo and simpo pi_c = chosen sum / chosen length (mean token log-prob), for cpo the sum.
ORPO (Hong et al. 2024, eq. 6-7), odds(p) = p / (1 - p) with p = exp(pi):
    log_or  = log(odds(exp(pi_c)) / odds(exp(pi_r)))
    orpo    = -b * logsigmoid(log_or)                  (b = lambda)
SimPO (Meng et al. 2024, eq. 6), gamma the target margin, cDPO smoothing as TRL's CPOTrainer:
    z       = b*(pi_c - pi_r) - gamma
    simpo   = -logsigmoid(z)*(1-eps) - logsigmoid(-z)*eps
CPO (Xu et al. 2024, eq. 3), on summed log-probs:
    z       = b*(pi_c - pi_r);  cpo = -logsigmoid(z)*(1-eps) - logsigmoid(-z)*eps
Each pair's total adds w * nll, nll = -(chosen sum / chosen length): w = 1 for orpo (its
SFT term), cpo_alpha for simpo and cpo (TRL's cpo_alpha term, averaged per pair).
chosen_rewards = b*pi_c, rejected_rewards = b*pi_r (TRL's logging); orpo's metrics
log_odds_ratio = mean(logsigmoid(log_or)), log_odds_chosen = mean(log_or).

Reward model. A group holds the rewards r_1..r_K of one example's K replies, best
first, with margin m (0 when null). Its pairs are all (i, j), i < j. With
c = center_rewards_coefficient:
    group loss = mean_pairs[-logsigmoid(r_i - r_j - m)] + c * mean_pairs[(r_i + r_j)**2]
    loss       = mean over groups of group loss
For K = 2 this is TRL's pairwise loss with margin and reward centering; for K > 2 the
first term is Open-Assistant's K-wise RMLoss (mean over torch.combinations pairs).
Metrics: accuracy = mean over all pairs of (r_i > r_j); margin = mean over all pairs
of (r_i - r_j); rewards/mean and rewards/std (population, divide by n) over every reward.
"""
import itertools
import json
import sys

import torch
import torch.nn.functional as F

DTYPE = torch.float64
N_DPO = 16


def dpo_losses(loss_type, beta, eps, pc, pr, rc, rr, lc, lr):
    """Returns (losses, chosen_rewards, rejected_rewards, policy_c, policy_r) as used."""
    if loss_type == "ipo":
        pc, pr, rc, rr = pc / lc, pr / lr, rc / lc, rr / lr
    logits = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits) * (1 - eps) - F.logsigmoid(-beta * logits) * eps
    elif loss_type == "robust":
        losses = (-F.logsigmoid(beta * logits) * (1 - eps)
                  + F.logsigmoid(-beta * logits) * eps) / (1 - 2 * eps)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(loss_type)
    return losses, beta * (pc - rc), beta * (pr - rr), pc, pr


def dpo_case(loss_type, beta, eps):
    ref_c = torch.empty(N_DPO, dtype=DTYPE).uniform_(-40, -5)
    ref_r = torch.empty(N_DPO, dtype=DTYPE).uniform_(-40, -5)
    # Policy = reference shifted by a few nats, independently for chosen and rejected,
    # so the logits take both signs.
    pol_c = ref_c + 3 * torch.randn(N_DPO, dtype=DTYPE)
    pol_r = ref_r + 3 * torch.randn(N_DPO, dtype=DTYPE)
    len_c = torch.randint(1, 21, (N_DPO,))
    len_r = torch.randint(1, 21, (N_DPO,))
    args = (pol_c, pol_r, ref_c, ref_r, len_c.to(DTYPE), len_r.to(DTYPE))
    losses, cr, rr, pc, pr = dpo_losses(loss_type, beta, eps, *args)

    logits = (pol_c - pol_r) - (ref_c - ref_r)
    assert (logits > 0).any() and (logits < 0).any(), "want logits of both signs"
    if loss_type == "robust" and eps == 0:
        sig = dpo_losses("sigmoid", beta, 0.0, *args)[0]
        assert torch.allclose(losses, sig, rtol=0, atol=1e-15), "robust(eps=0) != sigmoid"
    if loss_type in ("hinge", "ipo"):
        assert (losses >= 0).all(), f"{loss_type} loss negative"

    return {
        "loss_type": loss_type, "beta": beta, "label_smoothing": eps,
        "policy_chosen_logps": pol_c.tolist(), "policy_rejected_logps": pol_r.tolist(),
        "ref_chosen_logps": ref_c.tolist(), "ref_rejected_logps": ref_r.tolist(),
        "chosen_lengths": len_c.tolist(), "rejected_lengths": len_r.tolist(),
        "losses": losses.tolist(), "chosen_rewards": cr.tolist(), "rejected_rewards": rr.tolist(),
        "metrics": {
            "loss": losses.mean().item(),
            "rewards/chosen": cr.mean().item(),
            "rewards/rejected": rr.mean().item(),
            "rewards/accuracies": (cr > rr).to(DTYPE).mean().item(),
            "rewards/margins": (cr - rr).mean().item(),
            "logps/chosen": pc.mean().item(),
            "logps/rejected": pr.mean().item(),
        },
    }


def reference_free_case(loss_type, beta, eps, gamma, nll_weight):
    sum_c = torch.empty(N_DPO, dtype=DTYPE).uniform_(-40, -2)
    sum_r = torch.empty(N_DPO, dtype=DTYPE).uniform_(-40, -2)
    len_c = torch.randint(1, 21, (N_DPO,))
    len_r = torch.randint(1, 21, (N_DPO,))
    lc, lr = len_c.to(DTYPE), len_r.to(DTYPE)
    if loss_type in ("orpo", "simpo"):
        pc, pr = sum_c / lc, sum_r / lr
    else:
        pc, pr = sum_c, sum_r
    metrics = {}
    if loss_type == "orpo":
        p_c, p_r = torch.exp(pc), torch.exp(pr)
        log_or = torch.log((p_c / (1 - p_c)) / (p_r / (1 - p_r)))
        losses = -beta * F.logsigmoid(log_or)
        metrics["log_odds_ratio"] = F.logsigmoid(log_or).mean().item()
        metrics["log_odds_chosen"] = log_or.mean().item()
    else:
        z = beta * (pc - pr) - (gamma if loss_type == "simpo" else 0.0)
        losses = -F.logsigmoid(z) * (1 - eps) - F.logsigmoid(-z) * eps
    nll = -(sum_c / lc)
    cr, rr = beta * pc, beta * pr
    assert ((pc - pr) > 0).any() and ((pc - pr) < 0).any(), "want both orders"
    metrics.update({
        "rewards/chosen": cr.mean().item(),
        "rewards/rejected": rr.mean().item(),
        "rewards/accuracies": (cr > rr).to(DTYPE).mean().item(),
        "rewards/margins": (cr - rr).mean().item(),
        "logps/chosen": pc.mean().item(),
        "logps/rejected": pr.mean().item(),
    })
    return {
        "loss_type": loss_type, "beta": beta, "label_smoothing": eps, "simpo_gamma": gamma,
        "nll_weight": nll_weight,
        "policy_chosen_logps": sum_c.tolist(), "policy_rejected_logps": sum_r.tolist(),
        "chosen_lengths": len_c.tolist(), "rejected_lengths": len_r.tolist(),
        "losses": losses.tolist(), "total_losses": (losses + nll_weight * nll).tolist(),
        "chosen_rewards": cr.tolist(), "rejected_rewards": rr.tolist(),
        "metrics": metrics,
    }


def reward_case(c, groups, margins):
    """groups: list of 1-D float64 tensors (best first); margins: list of float or None."""
    group_losses, diffs = [], []
    for r, m in zip(groups, margins):
        pairs = torch.tensor(list(itertools.combinations(range(len(r)), 2)))
        ri, rj = r[pairs[:, 0]], r[pairs[:, 1]]
        rank = -F.logsigmoid(ri - rj - (0.0 if m is None else m)).mean()
        center = ((ri + rj) ** 2).mean()
        group_losses.append(rank + c * center)
        diffs.append(ri - rj)
    diffs = torch.cat(diffs)
    every = torch.cat(groups)
    return {
        "center_rewards_coefficient": c,
        "groups": [g.tolist() for g in groups],
        "margins": margins,
        "loss": torch.stack(group_losses).mean().item(),
        "metrics": {
            "accuracy": (diffs > 0).to(DTYPE).mean().item(),
            "margin": diffs.mean().item(),
            "rewards/mean": every.mean().item(),
            "rewards/std": every.std(correction=0).item(),
            # TRL's RewardTrainer: the micro-batch's smallest, mean and largest score of every reply.
            "min_reward": every.min().item(),
            "mean_reward": every.mean().item(),
            "max_reward": every.max().item(),
        },
    }


def rewards(k):
    return 2 * torch.randn(k, dtype=DTYPE)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: preference_reference.py OUT.json")
    torch.manual_seed(0)

    dpo_specs = [("sigmoid", 0.1, 0.0), ("sigmoid", 0.1, 0.1), ("sigmoid", 0.5, 0.0),
                 ("robust", 0.1, 0.1), ("robust", 0.1, 0.0),
                 ("hinge", 0.1, 0.0), ("hinge", 0.5, 0.0),
                 ("ipo", 0.1, 0.0), ("ipo", 0.5, 0.0)]
    dpo = [dpo_case(*spec) for spec in dpo_specs]
    free_specs = [("orpo", 0.1, 0.0, 0.0, 1.0), ("orpo", 1.0, 0.0, 0.0, 1.0),
                  ("simpo", 2.0, 0.0, 0.5, 0.0), ("simpo", 2.5, 0.1, 1.0, 1.0),
                  ("cpo", 0.1, 0.0, 0.0, 1.0), ("cpo", 0.5, 0.1, 0.0, 0.5)]
    reference_free = [reference_free_case(*spec) for spec in free_specs]

    reward = []
    # (a) 12 pairs, no margins, no centering.
    reward.append(reward_case(0.0, [rewards(2) for _ in range(12)], [None] * 12))
    # (b) 12 pairs with random margins in [0, 2], centering 0.01.
    groups = [rewards(2) for _ in range(12)]
    margins = (2 * torch.rand(12, dtype=DTYPE)).tolist()
    reward.append(reward_case(0.01, groups, margins))
    # (c), (d) 10 K-wise groups (K in 2..5), a mix of null and set margins.
    for c in (0.0, 0.05):
        ks = torch.randint(2, 6, (10,)).tolist()
        groups = [rewards(k) for k in ks]
        set_margin = torch.rand(10) < 0.5
        set_margin[0], set_margin[1] = True, False  # guarantee both kinds
        margins = [(2 * torch.rand((), dtype=DTYPE)).item() if s else None
                   for s in set_margin.tolist()]
        assert max(ks) > 2, "want at least one K > 2 group"
        reward.append(reward_case(c, groups, margins))

    with open(sys.argv[1], "w") as f:
        json.dump({"dpo": dpo, "reference_free": reference_free, "reward": reward}, f, indent=1)


if __name__ == "__main__":
    main()
