"""Independent reference values for Anvil's ILQL formulas (trlx's ILQLConfig.loss,
target-Q Polyak sync and advantage-shaped sampling scores).

Usage: ilql_reference.py OUT.json

Written from Snell et al. 2022 ("Offline RL for Natural Language Generation with
Implicit Language Q Learning") and the definitions in trlx (trlx/models/modeling_ilql.py:
ILQLConfig.loss, ILQLHeads._sync_target_q_heads, AutoModelForCausalLMWithILQLHeads.generate),
without importing trlx. Inputs are fixed random numbers (torch.manual_seed(0) and
per-case generators); all maths is float64.

Layout (response-aligned, right-padded). B sequences, A action slots, V vocabulary;
row i has n_i actions (response tokens) in columns [0, n_i), padding after.
    logits   (B, A, V)  LM logits at the state before each action
    q1, q2   (B, A, V)  Q-head outputs at those states
    tq1, tq2 (B, A, V)  target Q-head outputs at those states
    vs       (B, A+1)   V-head values at states 0..A (state j is before action j,
                        state n_i is after the last action; columns past n_i are padding)
    actions  (B, A)     token ids (0 on padding)
    rewards  (B, A)     per-action rewards (0 on padding)
    dones    (B, A+1)   1 for states 0..n_i-1, 0 for state n_i and for padding
Padding entries of logits / Q / V hold random numbers on purpose: they must be masked out.

Loss (trlx ILQLConfig.loss), with m = dones[:, :-1] (terminal_mask) and
N = max(1, sum(m)) (n_nonterminal); sums run over all (i, t):
    Q_k[i,t]   = q_k[i, t, a_it]                  (k over the Q heads: 1, 2 or just 1)
    tQ[i,t]    = min_k tq_k[i, t, a_it]           (tq1 alone when two_qs is false)
    V[i,t]     = vs[i, t];  Vnext[i,t] = vs[i, t+1] * dones[i, t+1]
    y[i,t]     = r[i,t] + gamma * Vnext[i,t]
    loss_q     = sum_k sum(m * (Q_k - y)^2) / N
    loss_v     = sum(m * w * (tQ - V)^2) / N,  w = tau if tQ >= V else 1 - tau  (expectile)
    ce(x, a)   = logsumexp(x) - x[a]
    loss_cql   = sum_k sum(m * ce(q_k[i,t], a_it)) / N
    awac_w     = exp(beta * (tQ - V))          (beta = ILQLConfig.beta; trlx default 0 -> 1)
    loss_awac  = sum(m * awac_w * ce(logits[i,t], a_it)) / N
    loss       = loss_q + loss_v + cql_scale * loss_cql + awac_scale * loss_awac
Logged stats (trlx get_tensor_stats over the masked entries, divided by N):
    mean = sum(m x)/N, min/max over m, std = sqrt(sum((m (x - mean))^2)/N),
    for values (V), qvalues/k (Q_k, k = 0, 1) and awac_weight.

Polyak sync of the target Q heads (trlx ILQLHeads._sync_target_q_heads), per parameter:
    target <- alpha * q + (1 - alpha) * target      (applied `steps` times, q held fixed)

Advantage-shaped sampling scores (trlx generate, before top-k and temperature), for the
last position: scores = log_softmax(logits) + beta * (min(tq1, tq2) - v[:, None])
(tq1 alone when two_qs is false). probs = softmax(topk_mask(scores, top_k) / temperature),
where topk_mask sets entries below the top_k-th largest score to -inf (no-op when
top_k > V).

JSON written:
{
  "loss_cases": [ {
      "name": str, "B": int, "A": int, "V": int, "n": [n_i ...],
      "options": {"tau", "gamma", "cql_scale", "awac_scale", "beta": float, "two_qs": bool},
      "inputs": {"logits", "q1", "q2", "tq1", "tq2", "vs", "actions", "rewards", "dones": T},
      "outputs": {"loss", "loss_q", "loss_v", "loss_cql", "loss_awac": float,
                  "n_nonterminal": float},
      "per_token": {"q_target" (= y), "target_q" (= tQ), "v" (= V), "awac_weight": T (B, A)},
      "stats": {"losses/loss", ..., "values/mean|min|max|std",
                "qvalues/0/mean|min|max|std" (and qvalues/1/... with two_qs),
                "awac_weight/mean|min|max|std": float}
  } ],
  "polyak_cases": [ {"alpha": float, "steps": int,
                     "q": [T ...], "target": [T ...], "new_target": [T ...]} ],
  "score_cases": [ {"beta", "temperature": float, "top_k": int, "two_qs": bool,
                    "logits", "tq1", "tq2": T (B, V), "v": T (B,),
                    "scores": T (B, V), "probs": T (B, V)} ]
}
where T = {"shape": [...], "data": [row-major flattened values]} (actions: ints;
q2 / tq2 are present but unused when two_qs is false; padding of inputs as above).
"""
import json
import sys

import torch

DTYPE = torch.float64


def T(t):
    return {"shape": list(t.shape), "data": t.reshape(-1).tolist()}


def ce(x, a):
    """Cross entropy per position: logsumexp over the last dim minus the chosen entry."""
    return torch.logsumexp(x, -1) - x.gather(-1, a.unsqueeze(-1)).squeeze(-1)


def tensor_stats(x, m, n):
    mean = (x * m).sum() / n
    sel = x[m.bool()]
    return {"mean": mean.item(), "min": sel.min().item(), "max": sel.max().item(),
            "std": torch.sqrt((((x - mean) * m) ** 2).sum() / n).item()}


def make_inputs(seed, n, A, V, per_token_row):
    g = torch.Generator().manual_seed(seed)
    B = len(n)
    u = lambda *s: torch.rand(*s, generator=g, dtype=DTYPE)
    n_t = torch.tensor(n)
    amask = (torch.arange(A)[None, :] < n_t[:, None]).to(DTYPE)          # (B, A)
    dones = (torch.arange(A + 1)[None, :] < n_t[:, None]).long()          # (B, A+1)
    actions = torch.randint(0, V, (B, A), generator=g) * amask.long()
    rewards = torch.zeros(B, A, dtype=DTYPE)
    for i in range(B):
        if i == per_token_row:
            rewards[i, : n[i]] = 2 * u(n[i]) - 1                          # per-token rewards
        else:
            rewards[i, n[i] - 1] = 4 * u(()) - 2                          # one score on the last action
    return {
        "logits": 4 * u(B, A, V) - 2,
        "q1": 2 * u(B, A, V) - 1,
        "q2": 2 * u(B, A, V) - 1,
        "tq1": 2 * u(B, A, V) - 1,
        "tq2": 2 * u(B, A, V) - 1,
        "vs": 2 * u(B, A + 1) - 1,
        "actions": actions,
        "rewards": rewards,
        "dones": dones,
    }


def ilql_loss(x, tau, gamma, cql_scale, awac_scale, beta, two_qs):
    a = x["actions"]
    dones = x["dones"].to(DTYPE)
    m = dones[:, :-1]
    N = max(1.0, m.sum().item())
    q_heads = [x["q1"], x["q2"]] if two_qs else [x["q1"]]
    tq_heads = [x["tq1"], x["tq2"]] if two_qs else [x["tq1"]]
    Q = [q.gather(-1, a.unsqueeze(-1)).squeeze(-1) for q in q_heads]
    tQ = tq_heads[0].gather(-1, a.unsqueeze(-1)).squeeze(-1)
    for tq in tq_heads[1:]:
        tQ = torch.minimum(tQ, tq.gather(-1, a.unsqueeze(-1)).squeeze(-1))
    V = x["vs"][:, :-1]
    Vnext = x["vs"][:, 1:] * dones[:, 1:]
    y = x["rewards"] + gamma * Vnext
    loss_q = sum((m * (Qk - y) ** 2).sum() / N for Qk in Q)
    w = torch.where(tQ >= V, torch.full_like(V, tau), torch.full_like(V, 1 - tau))
    loss_v = (m * w * (tQ - V) ** 2).sum() / N
    loss_cql = sum((m * ce(q, a)).sum() / N for q in q_heads)
    awac_w = torch.exp(beta * (tQ - V))
    loss_awac = (m * awac_w * ce(x["logits"], a)).sum() / N
    loss = loss_q + loss_v + cql_scale * loss_cql + awac_scale * loss_awac
    outputs = {"loss": loss.item(), "loss_q": loss_q.item(), "loss_v": loss_v.item(),
               "loss_cql": loss_cql.item(), "loss_awac": loss_awac.item(), "n_nonterminal": N}
    stats = {f"losses/{k}": v for k, v in outputs.items() if k != "n_nonterminal"}
    for name, t in [("values", V), ("awac_weight", awac_w)] + [(f"qvalues/{k}", Qk) for k, Qk in enumerate(Q)]:
        for k, v in tensor_stats(t, m, N).items():
            stats[f"{name}/{k}"] = v
    per_token = {"q_target": T(y), "target_q": T(tQ), "v": T(V), "awac_weight": T(awac_w)}
    return outputs, stats, per_token


def loss_case(name, seed, n, A, V, per_token_row, tau, gamma, cql_scale, awac_scale, beta, two_qs):
    x = make_inputs(seed, n, A, V, per_token_row)
    outputs, stats, per_token = ilql_loss(x, tau, gamma, cql_scale, awac_scale, beta, two_qs)
    return {
        "name": name, "B": len(n), "A": A, "V": V, "n": list(n),
        "options": {"tau": tau, "gamma": gamma, "cql_scale": cql_scale, "awac_scale": awac_scale,
                    "beta": beta, "two_qs": two_qs},
        "inputs": {k: T(v) for k, v in x.items()},
        "outputs": outputs, "per_token": per_token, "stats": stats,
    }


def polyak_cases():
    g = torch.Generator().manual_seed(11)
    H, Vv = 4, 7
    shapes = [(2 * H, H), (2 * H,), (Vv, 2 * H), (Vv,)]   # a make_head MLP: Linear(H,2H), ReLU, Linear(2H,V)
    out = []
    for alpha, steps in [(0.001, 1), (0.3, 1), (0.3, 3), (1.0, 1)]:
        q = [torch.randn(*s, generator=g, dtype=DTYPE) for s in shapes]
        tgt = [torch.randn(*s, generator=g, dtype=DTYPE) for s in shapes]
        new = [t.clone() for t in tgt]
        for _ in range(steps):
            new = [alpha * qp + (1 - alpha) * tp for qp, tp in zip(q, new)]
        out.append({"alpha": alpha, "steps": steps, "q": [T(t) for t in q], "target": [T(t) for t in tgt],
                    "new_target": [T(t) for t in new]})
    return out


def topk_mask(x, k):
    if k > x.shape[-1]:
        return x
    kth = torch.topk(x, k, dim=-1).values[:, -1:]
    return torch.where(x < kth, torch.full_like(x, float("-inf")), x)


def score_cases():
    g = torch.Generator().manual_seed(5)
    B, V = 3, 7
    out = []
    for beta, temperature, top_k, two_qs in [(0.0, 1.0, 20, True), (1.0, 1.0, 3, True),
                                            (4.0, 0.7, 5, True), (1.0, 1.3, 7, False)]:
        logits = 4 * torch.rand(B, V, generator=g, dtype=DTYPE) - 2
        tq1 = 2 * torch.rand(B, V, generator=g, dtype=DTYPE) - 1
        tq2 = 2 * torch.rand(B, V, generator=g, dtype=DTYPE) - 1
        v = 2 * torch.rand(B, generator=g, dtype=DTYPE) - 1
        qmin = torch.minimum(tq1, tq2) if two_qs else tq1
        scores = torch.log_softmax(logits, -1) + beta * (qmin - v[:, None])
        probs = torch.softmax(topk_mask(scores, top_k) / temperature, -1)
        out.append({"beta": beta, "temperature": temperature, "top_k": top_k, "two_qs": two_qs,
                    "logits": T(logits), "tq1": T(tq1), "tq2": T(tq2), "v": T(v),
                    "scores": T(scores), "probs": T(probs)})
    return out


def main():
    torch.manual_seed(0)
    A, V = 5, 7
    cases = {
        "loss_cases": [
            loss_case("two_qs_defaults", 1, [5, 3, 1], A, V, 0, 0.7, 0.99, 0.1, 1.0, 0.0, True),
            loss_case("one_q", 2, [5, 3, 1], A, V, 1, 0.7, 0.99, 0.1, 1.0, 0.0, False),
            loss_case("two_qs_other_scales", 3, [2, 5, 4], A, V, 1, 0.9, 0.9, 0.5, 0.3, 0.0, True),
            loss_case("two_qs_awac_beta", 4, [5, 3, 1], A, V, 0, 0.6, 1.0, 0.2, 2.0, 0.5, True),
        ],
        "polyak_cases": polyak_cases(),
        "score_cases": score_cases(),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(cases, f)


if __name__ == "__main__":
    main()
