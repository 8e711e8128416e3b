"""Independent reference values for Anvil's PPO, GRPO and RLOO formulas.

Usage: ppo_reference.py OUT.json

Written from the papers and the definitions in Hugging Face TRL (PPOTrainer,
GRPOTrainer, RLOOTrainer) and trlx (AdaptiveKLController, RunningMoments),
without importing either. Inputs are fixed random numbers (torch.manual_seed(0));
all maths is float64. Sequences are response-aligned: row i holds its response
tokens in columns [0, len_i), and `mask` is 1 there, 0 after.

KL per token (Schulman's estimators), with d = logp - ref:
    k1 = d
    k3 = exp(-d) - 1 + d                      (= exp(ref - logp) - (ref - logp) - 1)
Per-token reward (PPO, Ziegler et al.): r_t = -kl_coef * kl_t, plus the sequence's
score on its last response token. non_score_reward = sum_t -kl_coef * kl_t.
GAE (Schulman et al. 2016), values V_t of the state before token t, V_len = 0:
    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t = delta_t + gamma * lam * A_{t+1},  returns = A + V
Whitening over the masked entries: (A - mean) / sqrt(var_unbiased + 1e-8).
Adaptive KL (Ziegler et al.; trlx AdaptiveKLController):
    e = clip(current / target - 1, -0.2, 0.2);  coef *= 1 + e * n_steps / horizon
Clipped surrogate and value losses (PPO; TRL), masked means over tokens:
    ratio = exp(logp_new - logp_old)
    pg = max(-A * ratio, -A * clip(ratio, 1 - c, 1 + c))
    vclip = clip(v_new, v_old - cv, v_old + cv)
    vf = 0.5 * max((v_new - R)^2, (vclip - R)^2)
    clipfrac = mean(-A*clip(ratio) > -A*ratio); vf_clipfrac = mean((vclip-R)^2 > (v_new-R)^2)
    approxkl = 0.5 * mean((logp_new - logp_old)^2)
GRPO (Shao et al. 2024; TRL GRPOTrainer): per group of G samples of one prompt,
    A = (s - mean_group) / (std_group_unbiased + 1e-4)
RLOO (Ahmadian et al. 2024; TRL RLOOTrainer): per group of k samples,
    baseline_i = (sum_group - s_i) / (k - 1),  A_i = s_i - baseline_i
GRPO's variants (TRL GRPOTrainer._compute_loss; DAPO, Yu et al. 2025; Dr. GRPO,
Liu et al. 2025; GSPO, Zheng et al. 2025), with m the completion mask (times
"ended" when truncated completions are masked):
    A = s - mean_group, divided by std_group + 1e-4 (scale_rewards group), by the
        std of all scores + 1e-4 (batch), or by nothing (none)
    log_w = logp_new - logp_old (token level), or per sequence
            sum_t(log_w * m) / max(sum_t m, 1), the same for every token (GSPO)
    per_token = -min(exp(log_w) A, clip(exp(log_w), 1 - eps_low, 1 + eps_high) A)
                + beta * (exp(ref - logp_new) - (ref - logp_new) - 1)
    loss = mean_i(sum_t(per_token * m) / max(sum_t m, 1))          (grpo: sequence_mean)
         | sum(per_token * m) / sum(m)                             (dapo: token_mean)
         | sum(per_token * m) / (B * max_completion_length)        (dr_grpo: constant)
    clip_ratio/low = mean over m of (exp(log_w) < 1 - eps_low and A < 0),
    clip_ratio/high = mean over m of (exp(log_w) > 1 + eps_high and A > 0)
REINFORCE++ (Hu 2025; OpenRLHF's reinforce and reinforce_baseline): token rewards
r_t = -kl_coef * kl_t plus the score at the last token (the baseline variant: the
score minus its group's mean), returns G_t = sum_{u >= t} r_u, whitened over the
masked tokens as above.
DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), L_max the longest allowed
response, L_cache the buffer: 0 when |y| <= L_max - L_cache;
((L_max - L_cache) - |y|) / L_cache when L_max - L_cache < |y| <= L_max; -1 beyond;
times the factor.
Multi-turn episodes (ppo.environment): a response holds generated tokens (the
policy's actions) and tokens an environment appended (observations). Only
actions have a KL, a reward, a value and an advantage: the score goes to the
last action, GAE's next value is the next action's (0 after the last), and
the losses are means over the actions (sequence_mean: per response over its
actions). Written here in the responses' own columns, stepping over the
appended ones.
Running reward scaling (trlx RunningMoments, scale_reward "running"): the moments
are merged with each batch (population variance inside the batch, Chan's merge),
std = sqrt(var * n / (n - 1)); scores are divided by the running std, then
clipped to [-cliprange_reward, cliprange_reward].
"""
import json
import sys

import torch

DTYPE = torch.float64


def masked_mean(x, m):
    return (x * m).sum() / m.sum()


def masked_var_unbiased(x, m):
    mean = masked_mean(x, m)
    n = m.sum()
    return masked_mean((x - mean) ** 2, m) * n / (n - 1)


def kl(logp, ref, estimator):
    d = logp - ref
    if estimator == "k1":
        return d
    return torch.exp(-d) - 1 + d


def gae(rewards, values, mask, gamma, lam):
    B, R = rewards.shape
    adv = torch.zeros_like(rewards)
    for i in range(B):
        n = int(mask[i].sum().item())
        last = 0.0
        for t in reversed(range(n)):
            nxt = values[i, t + 1].item() if t + 1 < n else 0.0
            delta = rewards[i, t].item() + gamma * nxt - values[i, t].item()
            last = delta + gamma * lam * last
            adv[i, t] = last
    returns = (adv + values) * mask
    return adv, returns


def whiten(x, m):
    mean = masked_mean(x, m)
    var = masked_var_unbiased(x, m)
    return (x - mean) / torch.sqrt(var + 1e-8) * m


def random_case(seed, B=6, R=7):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, R + 1, (B,), generator=g)
    lens[0] = R
    mask = (torch.arange(R)[None, :] < lens[:, None]).to(DTYPE)
    u = lambda *s: torch.rand(*s, generator=g, dtype=DTYPE)
    return {
        "mask": mask,
        "logp_old": -3 * u(B, R) * mask,
        "ref": -3 * u(B, R) * mask,
        "values_old": (u(B, R) - 0.5) * mask,
        "scores": 2 * u(B) - 1,
        "logp_new_delta": 0.4 * (u(B, R) - 0.5) * mask,
        "values_new_delta": 0.6 * (u(B, R) - 0.5) * mask,
    }


def to_list(t):
    return t.reshape(-1).tolist()


def ppo_case(seed, estimator, kl_coef, gamma, lam, cliprange, cliprange_value):
    c = random_case(seed)
    m = c["mask"]
    k = kl(c["logp_old"], c["ref"], estimator) * m
    non_score = -kl_coef * k
    rewards = non_score.clone()
    lens = m.sum(1).long()
    for i in range(rewards.shape[0]):
        rewards[i, lens[i] - 1] += c["scores"][i]
    adv, returns = gae(rewards, c["values_old"], m, gamma, lam)
    adv_w = whiten(adv, m)
    logp_new = c["logp_old"] + c["logp_new_delta"]
    v_new = c["values_old"] + c["values_new_delta"]
    ratio = torch.exp(logp_new - c["logp_old"])
    pg1 = -adv_w * ratio
    pg2 = -adv_w * torch.clamp(ratio, 1 - cliprange, 1 + cliprange)
    pg = torch.maximum(pg1, pg2)
    vclip = torch.clamp(v_new, c["values_old"] - cliprange_value, c["values_old"] + cliprange_value)
    vf1 = (v_new - returns) ** 2
    vf2 = (vclip - returns) ** 2
    vf = 0.5 * torch.maximum(vf1, vf2)
    out = {
        "estimator": estimator, "kl_coef": kl_coef, "gamma": gamma, "lam": lam,
        "cliprange": cliprange, "cliprange_value": cliprange_value,
        "shape": list(m.shape),
        "mask": to_list(m), "logp_old": to_list(c["logp_old"]), "ref": to_list(c["ref"]),
        "values_old": to_list(c["values_old"]), "scores": to_list(c["scores"]),
        "logp_new": to_list(logp_new), "values_new": to_list(v_new),
        "kl": to_list(k), "rewards": to_list(rewards),
        "advantages": to_list(adv), "returns": to_list(returns), "whitened": to_list(adv_w),
        "pg_loss": masked_mean(pg, m).item(),
        "vf_loss": masked_mean(vf, m).item(),
        "clipfrac": masked_mean((pg2 > pg1).to(DTYPE), m).item(),
        "vf_clipfrac": masked_mean((vf2 > vf1).to(DTYPE), m).item(),
        "approxkl": masked_mean(0.5 * (logp_new - c["logp_old"]) ** 2, m).item(),
        "ratio": masked_mean(ratio, m).item(),
        "objective_kl": k.sum(1).mean().item(),
        "non_score_reward": non_score.sum(1).mean().item(),
    }
    return out


def group_cases():
    g = torch.Generator().manual_seed(7)
    scores = torch.rand(12, generator=g, dtype=DTYPE) * 4 - 2
    scores[4:8] = 0.5  # a group whose samples tie: zero advantages
    out = []
    for group in (2, 4):
        s = scores.view(-1, group)
        grpo = (s - s.mean(1, keepdim=True)) / (s.std(1, keepdim=True) + 1e-4)
        rloo = s - (s.sum(1, keepdim=True) - s) / (group - 1)
        out.append({"group": group, "scores": to_list(scores), "grpo": to_list(grpo), "rloo": to_list(rloo)})
    return out


def adaptive_kl_cases():
    out = []
    for value, current, target, horizon, n in [(0.05, 9.0, 6.0, 10000, 64), (0.2, 1.0, 6.0, 10000, 256),
                                               (0.1, 6.6, 6.0, 500, 32), (0.3, 50.0, 6.0, 100, 8)]:
        e = min(max(current / target - 1, -0.2), 0.2)
        out.append({"value": value, "current": current, "target": target, "horizon": horizon, "n_steps": n,
                    "new_value": value * (1 + e * n / horizon)})
    return out


class RunningMoments:
    def __init__(self):
        self.mean, self.var, self.std, self.count = 0.0, 1.0, 1.0, 1e-24

    def update(self, xs):
        n = xs.numel()
        xs_mean = xs.mean().item()
        xs_var = ((xs - xs_mean) ** 2).mean().item()
        delta = xs_mean - self.mean
        tot = self.count + n
        new_sum = xs_var * n
        old_sum = self.var * self.count + delta ** 2 * self.count * n / tot
        self.mean += delta * n / tot
        self.var = (old_sum + new_sum) / tot
        self.std = (self.var * tot / (tot - 1)) ** 0.5
        self.count = tot


def scaling_case():
    g = torch.Generator().manual_seed(3)
    batches = [torch.rand(8, generator=g, dtype=DTYPE) * 6 - 1 for _ in range(3)]
    rm = RunningMoments()
    scaled = []
    for b in batches:
        rm.update(b)
        scaled.append(torch.clamp(b / rm.std, -1.5, 1.5))
    return {"batches": [to_list(b) for b in batches], "clip": 1.5, "scaled": [to_list(s) for s in scaled],
            "mean": rm.mean, "var": rm.var, "count": rm.count}


def grpo_family_case(seed, loss_type, eps_low, eps_high, scale_rewards, level, mask_truncated, beta, max_len):
    B, R, G = 8, 7, 4
    c = random_case(seed, B, R)
    g = torch.Generator().manual_seed(seed + 100)
    m0 = c["mask"]
    ended = (torch.rand(B, generator=g) < 0.6).to(DTYPE)
    ended[0] = 0.0  # at least one truncated completion
    m = m0 * ended[:, None] if mask_truncated else m0
    s = c["scores"].view(-1, G)
    centred = s - s.mean(1, keepdim=True)
    if scale_rewards == "group":
        adv = centred / (s.std(1, keepdim=True) + 1e-4)
    elif scale_rewards == "batch":
        adv = centred / (c["scores"].std() + 1e-4)
    else:
        adv = centred
    adv = adv.reshape(-1, 1) * m0
    logp_new = c["logp_old"] + 3 * c["logp_new_delta"]  # wide enough to clip on both sides
    log_w = logp_new - c["logp_old"]
    if level == "sequence":
        log_w = ((log_w * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1).expand(B, R)
    coef1 = torch.exp(log_w)
    coef2 = torch.clamp(coef1, 1 - eps_low, 1 + eps_high)
    per_token = -torch.minimum(coef1 * adv, coef2 * adv)
    if beta > 0:
        d = c["ref"] - logp_new
        per_token = per_token + beta * (torch.exp(d) - d - 1)
    if loss_type == "grpo":
        loss = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "dapo":
        loss = (per_token * m).sum() / m.sum()
    else:
        loss = (per_token * m).sum() / (B * max_len)
    low = ((coef1 < 1 - eps_low) & (adv < 0)).to(DTYPE)
    high = ((coef1 > 1 + eps_high) & (adv > 0)).to(DTYPE)
    return {
        "loss_type": loss_type, "eps_low": eps_low, "eps_high": eps_high, "scale_rewards": scale_rewards,
        "level": level, "mask_truncated": mask_truncated, "beta": beta, "max_len": max_len, "group": G,
        "shape": [B, R], "mask": to_list(m0), "ended": to_list(ended), "scores": to_list(c["scores"]),
        "logp_old": to_list(c["logp_old"]), "logp_new": to_list(logp_new), "ref": to_list(c["ref"]),
        "advantages": to_list(adv.sum(1) / m0.sum(1)), "loss": loss.item(),
        "clip_low": masked_mean(low, m).item(), "clip_high": masked_mean(high, m).item(),
    }


def reinforce_case(seed, baseline, kl_coef, group=3):
    B, R = 6, 7
    c = random_case(seed, B, R)
    m = c["mask"]
    k = kl(c["logp_old"], c["ref"], "k1") * m
    scores = c["scores"]
    if baseline:
        g = scores.view(-1, group)
        scores = (g - g.mean(1, keepdim=True)).reshape(-1)
    rewards = -kl_coef * k
    lens = m.sum(1).long()
    for i in range(B):
        rewards[i, lens[i] - 1] += scores[i]
    returns = torch.zeros_like(rewards)
    for i in range(B):
        acc = 0.0
        for t in reversed(range(int(lens[i]))):
            acc += rewards[i, t].item()
            returns[i, t] = acc
    return {"baseline": baseline, "kl_coef": kl_coef, "group": group, "shape": [B, R], "mask": to_list(m),
            "logp_old": to_list(c["logp_old"]), "ref": to_list(c["ref"]), "scores": to_list(c["scores"]),
            "returns": to_list(returns), "advantages": to_list(whiten(returns, m))}


def overlong_cases():
    out = []
    for length, buffer, factor in [(16, 4, 1.0), (32, 8, 0.5)]:
        for tokens in range(0, length + 3):
            if tokens <= length - buffer:
                p = 0.0
            elif tokens <= length:
                p = ((length - buffer) - tokens) / buffer
            else:
                p = -1.0
            out.append({"tokens": tokens, "length": length, "buffer": buffer, "factor": factor,
                        "penalty": p * factor})
    return out


def episode_case(seed, kl_coef, gamma, lam, eps):
    B, R = 4, 9
    g = torch.Generator().manual_seed(seed)
    u = lambda *s: torch.rand(*s, generator=g, dtype=DTYPE)
    lens = [9, 7, 5, 3]
    mask = torch.zeros(B, R, dtype=DTYPE)
    appended = torch.zeros(B, R, dtype=DTYPE)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    appended[0, 3:5] = 1  # a tool's message between two turns
    appended[1, 2:3] = 1
    appended[1, 5:6] = 1
    actions = mask * (1 - appended)
    f32 = lambda x: x.to(torch.float32).to(DTYPE)  # a rollout row holds float32 log-probs and values
    logp_old, ref = f32(-3 * u(B, R) * mask), f32(-3 * u(B, R) * mask)
    values_old = f32((u(B, R) - 0.5) * mask)
    scores = 2 * u(B) - 1
    logp_new = f32(logp_old + 0.6 * (u(B, R) - 0.5) * mask)
    k = kl(logp_old, ref, "k1") * actions
    rewards = -kl_coef * k
    adv = torch.zeros(B, R, dtype=DTYPE)
    for i in range(B):
        acts = [t for t in range(R) if actions[i, t] > 0]
        rewards[i, acts[-1]] += scores[i]
        last = 0.0
        for n, t in reversed(list(enumerate(acts))):
            nxt = values_old[i, acts[n + 1]].item() if n + 1 < len(acts) else 0.0
            delta = rewards[i, t].item() + gamma * nxt - values_old[i, t].item()
            last = delta + gamma * lam * last
            adv[i, t] = last
    returns = (adv + values_old) * actions
    # GRPO's clipped loss on these actions, with a per-response advantage (scores centred on their mean).
    seq_adv = (scores - scores.mean()).unsqueeze(1) * actions
    ratio = torch.exp(logp_new - logp_old)
    per_token = -torch.minimum(ratio * seq_adv, torch.clamp(ratio, 1 - eps, 1 + eps) * seq_adv)
    return {"kl_coef": kl_coef, "gamma": gamma, "lam": lam, "eps": eps, "shape": [B, R], "mask": to_list(mask),
            "appended": to_list(appended), "logp_old": to_list(logp_old), "ref": to_list(ref),
            "values_old": to_list(values_old), "scores": to_list(scores), "logp_new": to_list(logp_new),
            "advantages": to_list(adv), "returns": to_list(returns), "seq_advantages": to_list(seq_adv),
            "token_mean_loss": ((per_token * actions).sum() / actions.sum()).item(),
            "sequence_mean_loss": ((per_token * actions).sum(1) / actions.sum(1)).mean().item()}


def grpo_family_cases():
    return [
        grpo_family_case(11, "dapo", 0.2, 0.28, "group", "token", True, 0.0, 7),
        grpo_family_case(12, "grpo", 0.2, 0.2, "group", "token", False, 0.04, 7),
        grpo_family_case(13, "dr_grpo", 0.2, 0.2, "none", "token", False, 0.0, 10),
        grpo_family_case(14, "grpo", 3e-3, 4e-3, "batch", "sequence", False, 0.0, 7),
        grpo_family_case(15, "dapo", 0.1, 0.3, "batch", "sequence", True, 0.02, 7),
    ]


def main():
    torch.manual_seed(0)
    cases = {
        "ppo": [ppo_case(1, "k1", 0.05, 1.0, 0.95, 0.2, 0.2), ppo_case(2, "k3", 0.1, 0.99, 0.9, 0.1, 0.3),
                ppo_case(3, "k1", 0.0, 0.9, 1.0, 0.3, 0.05)],
        "groups": group_cases(),
        "adaptive_kl": adaptive_kl_cases(),
        "scaling": scaling_case(),
        "grpo_family": grpo_family_cases(),
        "reinforce": [reinforce_case(21, False, 0.05), reinforce_case(22, True, 0.1)],
        "overlong": overlong_cases(),
        "episodes": [episode_case(31, 0.05, 1.0, 0.95, 0.2), episode_case(32, 0.1, 0.9, 0.8, 0.1)],
    }
    with open(sys.argv[1], "w") as f:
        json.dump(cases, f)


if __name__ == "__main__":
    main()
